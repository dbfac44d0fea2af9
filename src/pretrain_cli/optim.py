"""AdamW with PaddleNLP's decay exclusions, and the warmup + decay learning-rate schedule.

The schedule is a pure function `lr_at(step)` so tests compare it with closed forms and a
resumed run recomputes it from the step alone (no scheduler pickle). Step t is the optimizer
step about to run, counted from 1 (PaddleNLP steps its scheduler once at construction, so its
first step uses `learning_rate / warmup`, not 0).
"""
from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Schedule:
    kind: str  # linear | cosine | constant | constant_with_warmup
    max_lr: float
    min_lr: float
    warmup_steps: int
    decay_steps: int

    def lr_at(self, t: int) -> float:
        """Learning rate for optimizer step t (1-based)."""
        w, s = self.warmup_steps, self.decay_steps
        if w > 0 and t <= w:
            return self.max_lr * t / w
        if self.kind in ("constant", "constant_with_warmup"):
            return self.max_lr
        if t > s:
            return self.min_lr
        r = (t - w) / max(1, s - w)
        if self.kind == "linear":
            return self.min_lr + (1.0 - r) * (self.max_lr - self.min_lr)
        return self.min_lr + 0.5 * (1.0 + math.cos(math.pi * r)) * (self.max_lr - self.min_lr)


def build_schedule(training, resolved) -> Schedule:
    kind = training.lr_scheduler_type
    warmup = 0 if kind == "constant" else resolved.warmup_steps
    return Schedule(kind, training.learning_rate, training.min_learning_rate, warmup, resolved.decay_steps)


def no_decay(structured_name: str) -> bool:
    """PaddleNLP's rule: no weight decay for names containing 'bias' or 'norm'."""
    return "bias" in structured_name or "norm" in structured_name


def build_optimizer(model, training, schedule: Schedule, multi_precision: bool = False):
    """AdamW whose learning rate the trainer sets each step from `schedule.lr_at`.

    Clipping is done by the trainer (it needs the global norm for logging and the NaN policy
    anyway), so the optimizer gets no `grad_clip`. Paddle calls `apply_decay_param_fun` with the
    parameter's internal unique name (e.g. `linear_3.w_0`), so structured names are mapped first.
    """
    import paddle

    internal_to_struct = {p.name: n for n, p in model.named_parameters()}
    params = [p for p in model.parameters() if not p.stop_gradient]
    return paddle.optimizer.AdamW(
        learning_rate=schedule.lr_at(1),
        parameters=params,
        beta1=training.adam_beta1,
        beta2=training.adam_beta2,
        epsilon=training.adam_epsilon,
        weight_decay=training.weight_decay,
        apply_decay_param_fun=lambda internal: not no_decay(internal_to_struct.get(internal, internal)),
        multi_precision=multi_precision,
    )
