"""One optimizer step, apart from the loop around it (`training.trainer`).

`Step` is `acc` micro-batches of forward/backward, the global gradient norm (used for clipping,
logging and the non-finite policy), the update. It has one code path for every layout and precision:
the distributed `Strategy`, the `Comm` and the precision object are no-ops where there is nothing to
do. Nothing else syncs with the host inside a step. It holds no model of its own: the `Layout` comes
with each call, so a rollback that builds the layout again needs nothing of the step replaced.

With more than one process the step's verdict (applied, skipped, non-finite, spike) comes from the ranks' summed
loss, one scalar all-reduce, so every rank takes the same branch. The stop agreement (`trainer`, `Comm.any`) is a
second one, kept apart on purpose: it runs at the end of the step, after the log line and any evaluation, so a signal
that arrives during them still stops the run at this step's save. Riding on the verdict's all-reduce (before the
update) would save ~0.16 ms a step on gloo but stop one step later on a signal during an evaluation, inside the
launcher's stop limit (30 s under Paddle's launcher run directly).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from pretrain_cli.data.loader import batch_hash
from pretrain_cli.distributed.launcher import progress
from pretrain_cli.ops.loss import mean_loss
from pretrain_cli.training.evaluation import model_inputs
from pretrain_cli.training.metrics import log
from pretrain_cli.run_config import RunConfig


@dataclass
class Layout:
    """What one optimizer step runs on, as `training.run.lay_out` builds it: the model wrapped for its layout,
    its optimizer, the precision object, the distributed `Strategy`, the unwrapped model checkpoints read, and
    the checkpoint bytes this rank read to resume (None when starting fresh; the layout report shows them).
    One object because a rollback on the semi-auto engine replaces all of it together."""

    model: object
    optimizer: object
    amp: object
    strategy: object
    raw_model: object
    resume_bytes_read: int | None = None
    initialised: frozenset = frozenset()  # parameters from init though weights were read (`WeightSource.initialised`)
    routers_before: dict = field(default_factory=dict)  # routers read still in their grace (`WeightSource`'s)


class StepResult(NamedTuple):
    """What one optimizer step did. `outcome`: "applied"; "overflow" (fp16: the loss scaler skipped the update
    and lowered its scale; counted as a step, as PaddleNLP does); "non_finite" (loss or norm NaN/inf: nothing
    applied); "spike" (the guard withheld the update; `reason` says why). The loop decides what follows."""

    loss: float
    grad_norm: float
    outcome: str
    reason: str | None = None  # why a spike is one (the guard's phrase)

    @property
    def applied(self) -> bool:
        """Whether the step counts (the loop advances `global_step`)."""
        return self.outcome in ("applied", "overflow")


class Step:
    """The step's settings (accumulation, schedule, clipping) and the spike guard that judges each step."""

    def __init__(self, run: RunConfig, comm, guard=None):
        self.grad_accum, self.schedule = run.loop.grad_accum, run.schedule
        self.max_grad_norm, self.comm, self.guard = run.optimizer.max_grad_norm, comm, guard
        self.bias_update_rate = run.moe.bias_update_rate  # MoE auxiliary-loss-free balancing (0: off)

    def _forward_loss(self, layout, batch):
        start = time.perf_counter()
        # int64 [bsz, seq_len] each (+ doc_start, position_ids: document masking), this rank's piece
        ids, extra, labels = model_inputs(batch, layout.strategy.shard_batch)
        with layout.amp.autocast():  # labels: the loss terms, not logits (the fused head + loss never holds them)
            total, count = layout.model(ids, labels=labels, **extra)
        loss = mean_loss(total, count)
        progress.worked(time.perf_counter() - start)  # this rank's own work: a straggler's measure
        return loss

    def _clip(self, layout, norm: float) -> None:
        if 0 < self.max_grad_norm < norm:
            layout.strategy.clip(layout.model, self.max_grad_norm / (norm + 1e-6))

    def __call__(self, layout: Layout, batches, state) -> StepResult:
        """One optimizer step over `acc` micro-batches (the strategy's `forward_backward`: each with its own
        forward and backward, or a pipeline's schedule over all of them)."""
        layout.optimizer.set_lr(self.schedule.lr_at(state.global_step + 1))
        if self.bias_update_rate:  # the bias moves by this step's loads alone (a skipped step's are dropped)
            from pretrain_cli.models.moe_loss import forget_step_load

            forget_step_load(layout.raw_model)
        progress.mark("data", state.global_step + 1)  # what the rank watchers read (a hung rank, a straggler)
        taken = [next(batches) for _ in range(self.grad_accum)]
        progress.mark("forward/backward", state.global_step + 1)
        total = layout.strategy.forward_backward(layout.model, taken, layout.amp,
                                                 lambda batch: self._forward_loss(layout, batch))
        state.last_batch_hash = batch_hash(taken[-1])
        progress.mark("collective", state.global_step + 1)
        layout.strategy.sync_grads()
        layout.amp.unscale(layout.optimizer)
        norm = layout.strategy.grad_norm(layout.model)
        # the one host sync of the step
        stats = np.array([float(layout.strategy.to_host(total)), float(norm)], dtype=np.float64)
        loss_v, norm_v = float(stats[0]), float(stats[1])
        # the verdict, agreed: each rank's loss is its own (one rank's inf or NaN, an fp16 activation overflow, leaves
        # the global norm finite when its gradients are), so the branch below is chosen from the ranks' summed loss,
        # the same number on every rank, or two ranks would part (one stepping, a collective, one stopping alone)
        summed = self.comm.sum(loss_v) if self.comm is not None else loss_v
        agreed = summed if math.isfinite(summed) else math.nan  # nan: some rank's loss is not finite
        if layout.amp.overflowed(agreed, norm_v):
            # fp16 overflow, routine with a large scale: the scaler skips this update and lowers the scale
            # (PaddleNLP counts the step too); only a non-finite loss is a NaN for nan_policy
            layout.amp.step(layout.optimizer, layout.strategy.step, overflow=True)
            layout.strategy.drop_grads(layout.model, layout.optimizer)
            log.warning(f"step {state.global_step + 1}: fp16 overflow, update skipped by the loss scaler")
            return StepResult(loss_v, norm_v, "overflow")
        if not (math.isfinite(agreed) and math.isfinite(norm_v)):
            layout.strategy.drop_grads(layout.model, layout.optimizer)
            layout.amp.skip(layout.optimizer, overflow=not math.isfinite(norm_v))
            return StepResult(loss_v if math.isfinite(agreed) else summed, norm_v, "non_finite")
        if self.guard is not None:
            global_loss = agreed / getattr(self.comm, "world", 1)  # the ranks' mean: the same verdict on every rank
            reason = self.guard.check(state.spike_stats, global_loss, norm_v)
            if reason is not None:
                layout.strategy.drop_grads(layout.model, layout.optimizer)
                layout.amp.skip(layout.optimizer)
                return StepResult(loss_v, norm_v, "spike", reason)
            self.guard.accept(state.spike_stats, global_loss, norm_v)
        self._clip(layout, norm_v)
        if self.bias_update_rate:  # from this step's expert loads, as the update is applied (torchtitan)
            from pretrain_cli.models.moe_loss import update_expert_bias

            reduce = layout.raw_model.kernels.reduce_counts  # the data ranks' counts summed (None: one process)
            update_expert_bias(layout.raw_model, self.bias_update_rate, *([reduce] if reduce else []))
        layout.amp.step(layout.optimizer, layout.strategy.step)
        layout.strategy.drop_grads(layout.model, layout.optimizer)
        return StepResult(loss_v, norm_v, "applied")
