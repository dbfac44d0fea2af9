"""The loss-spike guard: running means of the loss and gradient norm, and what a spike does.

A spike is a finite step whose loss (or gradient norm) exceeds a factor times its running mean,
once `warmup_steps` accepted steps have been seen. The means are exponential moving averages of the
accepted steps only (weight 1/window; the plain mean until `window` steps exist), so a spike never
raises the bar for the next one. They live in `TrainerState.spike_stats` (JSON floats round-trip
exactly), so a resumed run judges the next step exactly as the uninterrupted run would.

The values judged are global: the gradient norm already is (`Strategy.grad_norm`), the loss is
averaged over the ranks (`Comm.mean`, a no-op in one process), so every rank reaches the same
verdict at the same step and takes the same branch (a skip on one rank alone would desynchronise
the replicas).

Policies: `skip` drops the update and consumes the batch (like `nan_policy: skip`); `rollback`
reloads the newest checkpoint and marks the batches that produced the spike as skipped, so a replay
(and any later resume, which reads `skipped_batches` from the checkpoint) jumps over them, and cuts the
record files back to that checkpoint, so the steps trained again are not logged twice (the rollback's
record says what was dropped); `stop`
ends the run without saving anything new. The policy acts through `Recoverable`, the members the
trainer offers, so it cannot come to depend on the model, the optimizer or how a checkpoint is read; it
reads the run's state and changes none of it itself (the trainer books a skip, the same way for a
non-finite step, and records a rollback).
Megatron and OLMo-core detect spikes; PaLM (§5.1)
recovers from them by exactly this rollback-and-skip.
"""
from __future__ import annotations

from pathlib import Path
from typing import Protocol

from pretrain_cli.training.metrics import log
from pretrain_cli.training.trainer_state import TrainerState


class SpikeError(Exception):
    """A spike under `spike_policy: stop`, or a second rollback at the same step."""


class SpikeGuard:
    def __init__(self, cfg):
        self.cfg = cfg

    def check(self, stats: dict, loss: float, norm: float) -> str | None:
        """Why this step is a spike (one phrase), or None."""
        c = self.cfg
        if stats.get("n", 0) < max(c.warmup_steps, 1):
            return None
        reasons = []
        if c.loss_factor and loss > c.loss_factor * stats["loss"]:
            reasons.append(f"loss {loss:.4g} > {c.loss_factor:g} x mean {stats['loss']:.4g}")
        if c.grad_norm_factor and norm > c.grad_norm_factor * stats["grad_norm"]:
            reasons.append(f"grad norm {norm:.4g} > {c.grad_norm_factor:g} x mean {stats['grad_norm']:.4g}")
        return " and ".join(reasons) or None

    def accept(self, stats: dict, loss: float, norm: float) -> None:
        """Fold an applied step into the running means."""
        n = stats.get("n", 0) + 1
        w = min(n, self.cfg.window)
        stats["loss"] = stats.get("loss", 0.0) + (loss - stats.get("loss", 0.0)) / w
        stats["grad_norm"] = stats.get("grad_norm", 0.0) + (norm - stats.get("grad_norm", 0.0)) / w
        stats["n"] = n


class Recoverable(Protocol):
    """All the spike policy may touch of a run (the `Trainer` implements it): its state to read, the metrics
    record, booking a skipped step, recording a rollback, the newest checkpoint, a reload from one, and cutting the
    record files back to it. Nothing of the model, optimizer or layout."""

    state: TrainerState  # read only

    def record_event(self, kind: str, values: dict, step: int | None = None) -> None: ...

    def skip(self, first_sample: int) -> tuple[int, int]: ...

    def note_rollback(self, skipped_batches: list, rollbacks: list) -> None: ...

    def newest_checkpoint(self) -> Path | None: ...

    def reload(self, path: Path) -> dict: ...

    def rewind_records(self, state: dict) -> dict | None: ...


class SpikePolicy:
    """The guard's verdict turned into an action on a `Recoverable` run: skip, roll back or stop."""

    def __init__(self, cfg, skip_limit: int, global_batch: int):
        self.cfg, self.skip_limit, self.global_batch = cfg, skip_limit, global_batch
        self.guard = SpikeGuard(cfg)

    def handle(self, run: Recoverable, reason: str, loss: float, norm: float, first_sample: int) -> bool:
        """Apply the policy to the spike of step `global_step + 1` whose batch began at `first_sample`.
        Returns True when the run's state was reloaded (the caller reopens its data iterator)."""
        s, cfg = run.state, self.cfg
        step = s.global_step + 1
        event = {"policy": cfg.policy, "reason": reason, "loss": loss, "grad_norm": norm,
                 "loss_mean": s.spike_stats.get("loss"), "grad_norm_mean": s.spike_stats.get("grad_norm"),
                 "first_sample": first_sample}
        if cfg.policy == "stop":
            run.record_event("spike", {**event, "action": "stop"}, step)
            raise SpikeError(f"step {step}: loss spike ({reason}); stopped without saving (the last checkpoint is "
                             f"intact). Lower learning_rate, check the data at this step (inspect-data --step "
                             f"{step}), or set spike_policy: skip or rollback")
        if cfg.policy == "skip":
            in_a_row, total = run.skip(first_sample)
            run.record_event("spike", {**event, "action": "skip"}, step)
            log.warning(f"step {step}: loss spike ({reason}); update skipped, batch consumed "
                        f"({in_a_row} in a row, {total} skipped in total)")
            if in_a_row >= self.skip_limit:
                raise SpikeError(f"step {step}: {in_a_row} consecutive skipped steps (nan_skip_limit "
                                 f"{self.skip_limit}); the loss level has moved, not spiked: stopped")
            return False
        return self._rollback(run, reason, event, first_sample, step)

    def _rollback(self, run: Recoverable, reason: str, event: dict, first_sample: int, step: int) -> bool:
        earlier = list(run.state.rollbacks)
        if any(r["spike_step"] == step for r in earlier):
            run.record_event("spike", {**event, "action": "stop"}, step)
            raise SpikeError(f"step {step}: loss spike ({reason}) again after a rollback to the same step; the "
                             f"cause is not the skipped data: stopped. Lower learning_rate or resume from an "
                             f"earlier checkpoint with a larger spike_rollback_steps")
        path = run.newest_checkpoint()
        if path is None:
            run.record_event("spike", {**event, "action": "stop"}, step)
            raise SpikeError(f"step {step}: loss spike ({reason}) but there is no checkpoint to roll back to; "
                             f"stopped. Save more often (save_steps) or set spike_policy: skip")
        state = run.reload(path)
        gb = self.global_batch
        start = max(state["consumed_samples"], first_sample - (self.cfg.rollback_steps - 1) * gb)
        window = list(range(start, first_sample + gb, gb))
        record = {"spike_step": step, "checkpoint_step": state["global_step"], "window": [start, first_sample + gb]}
        # every window rolled back over so far stays skipped: an earlier one may lie past this checkpoint too
        skipped = set(run.state.skipped_batches) | set(window)
        for r in earlier:
            skipped |= set(range(r["window"][0], r["window"][1], gb))
        run.note_rollback(sorted(skipped), earlier + [record])
        # the steps after the checkpoint are trained again: their records go, said in this one (rank 0's `dropped`)
        dropped = run.rewind_records(state)
        run.record_event("spike", {**event, "action": "rollback", "checkpoint_step": state["global_step"],
                                   "skipped_samples": record["window"],
                                   **({"dropped": dropped} if dropped is not None else {})}, step)
        gone = ""
        if dropped and dropped["steps"]:
            n, (a, b) = sum(dropped["records"].values()), dropped["steps"]
            gone = (f"; {n} record{'s' if n > 1 else ''} of step{f's {a}-{b}' if a != b else f' {a}'} removed "
                    f"from metrics.jsonl and the trackers (listed in the spike record)")
        log.warning(f"step {step}: loss spike ({reason}); rolled back to {path.name}, skipping global samples "
                    f"[{start}, {first_sample + gb}) ({len(window)} batch{'es' if len(window) > 1 else ''}){gone}")
        return True
