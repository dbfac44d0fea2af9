"""The warmup-stable-decay keys (`lr_scheduler_type: warmup_stable_decay`) → one `Schedule`.

transformers' `get_wsd_schedule` with its parameters (`num_stable_steps`, `num_decay_steps`, `min_lr_ratio`,
`decay_type`; linear warmup). The stable phase defaults to what max_steps leaves after warmup and decay, so the
decay always ends the run: a run resumed from a stable-phase checkpoint with a larger max_steps continues flat,
and one resumed with max_steps = its step + num_decay_steps anneals from that checkpoint (docs/TRAINING.md).
"""
from __future__ import annotations

import math

from pretrain_cli.errors import Problems
from pretrain_cli.counts import count
from pretrain_cli.run_config import Schedule

DEFAULT_DECAY_FRACTION = 0.1  # MiniCPM's and OLMo 2's annealing share when num_decay_steps is not set


def wsd_schedule(args, warmup: int, notes: list, problems: Problems) -> Schedule:
    """`Schedule` of kind warmup_stable_decay after `warmup` steps (resolved by `config.resolve`)."""
    t = args.training
    max_steps = max(t.max_steps, 1)
    decay = t.num_decay_steps
    if decay is None:
        decay = max(1, math.ceil(DEFAULT_DECAY_FRACTION * max_steps))
        notes.append(f"warmup_stable_decay: num_decay_steps not set; the last {count(decay, 'step')} decay "
                     f"({DEFAULT_DECAY_FRACTION:.0%} of max_steps {max_steps})")
    elif decay < 1:
        problems.add(f"num_decay_steps: must be >= 1, got {decay}")
    ratio = t.min_lr_ratio if t.min_lr_ratio is not None else (
        t.min_learning_rate / t.learning_rate if t.learning_rate > 0 else 0.0)
    if not 0.0 <= ratio <= 1.0:
        problems.add(f"min_lr_ratio: must be in [0, 1], got {ratio:g}"
                     + ("" if t.min_lr_ratio is not None else " (min_learning_rate / learning_rate)"))
    stable = t.num_stable_steps if t.num_stable_steps is not None else max_steps - warmup - decay
    if stable < 0:
        key = "num_stable_steps" if t.num_stable_steps is not None else "num_decay_steps"
        problems.add(f"{key}: warmup {warmup} + stable {stable} + decay {decay} steps do not fit max_steps "
                     f"{max_steps}; shorten warmup or the decay, or raise max_steps")
    if t.decay_steps is not None:
        notes.append("decay_steps: ignored by warmup_stable_decay (its decay: num_decay_steps, ending at max_steps "
                     "unless num_stable_steps is set)")
    return Schedule("warmup_stable_decay", t.learning_rate, t.learning_rate * ratio, warmup,
                    warmup + max(stable, 0) + max(decay, 1), decay_start=warmup + max(stable, 0),
                    decay_shape=t.decay_type)
