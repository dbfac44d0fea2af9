"""One optimizer step, apart from the loop around it (`training.trainer`).

`Step` is `acc` micro-batches of forward/backward, the global gradient norm (used for clipping,
logging and the non-finite policy), the update. It has one code path for every layout and precision:
the distributed `Strategy`, the `Comm` and the precision object are no-ops where there is nothing to
do. Nothing else syncs with the host inside a step. It holds no model of its own: the `Layout` comes
with each call, so a rollback that builds the layout again needs nothing of the step replaced.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from pretrain_cli.data.loader import batch_hash
from pretrain_cli.ops.loss import mean_loss
from pretrain_cli.training.evaluation import model_inputs
from pretrain_cli.training.metrics import log
from pretrain_cli.run_config import RunConfig


@dataclass
class Layout:
    """What one optimizer step runs on, as `training.run.lay_out` builds it: the model wrapped for its layout,
    its optimizer, the precision object, the distributed `Strategy`, and the unwrapped model checkpoints read.
    One object because a rollback on the semi-auto engine replaces all five together."""

    model: object
    optimizer: object
    amp: object
    strategy: object
    raw_model: object


class Step:
    """The step's settings (accumulation, schedule, clipping) and the spike guard's verdict; `spike_reason`
    says why the last step's update was withheld as a spike (None otherwise)."""

    def __init__(self, run: RunConfig, comm, guard=None):
        self.grad_accum, self.schedule = run.loop.grad_accum, run.schedule
        self.max_grad_norm, self.comm, self.guard = run.optimizer.max_grad_norm, comm, guard
        self.spike_reason = None

    def _forward_loss(self, layout, batch):
        # int64 [bsz, seq_len] each (+ doc_start, position_ids: document masking), this rank's piece
        ids, extra, labels = model_inputs(batch, layout.strategy.shard_batch)
        with layout.amp.autocast():  # labels: the loss terms, not logits (the fused head + loss never holds them)
            total, count = layout.model(ids, labels=labels, **extra)
        return mean_loss(total, count)

    def _clip(self, layout, norm: float) -> None:
        if 0 < self.max_grad_norm < norm:
            layout.strategy.clip(layout.model, self.max_grad_norm / (norm + 1e-6))

    def __call__(self, layout: Layout, batches, state) -> tuple[float, float, bool]:
        """One optimizer step over `acc` micro-batches; returns (loss, grad_norm, applied). Not applied: a
        non-finite step, or a spike (`spike_reason` says why)."""
        acc = self.grad_accum
        layout.optimizer.set_lr(self.schedule.lr_at(state.global_step + 1))
        total = None
        schedule = getattr(layout.strategy, "forward_backward", None)  # a pipeline schedules its micro-batches itself
        if schedule is not None:
            taken = [next(batches) for _ in range(acc)]
            total, batch = schedule(layout.model, taken, layout.amp), taken[-1]
        for i in range(acc if schedule is None else 0):
            batch = next(batches)
            with layout.strategy.no_sync(layout.model, last_micro_batch=i == acc - 1):
                loss = self._forward_loss(layout, batch) / acc
                layout.amp.backward(loss)
            total = loss.detach() if total is None else total + loss.detach()
        state.last_batch_hash = batch_hash(batch)
        layout.strategy.sync_grads()
        layout.amp.unscale(layout.optimizer)
        norm = layout.strategy.grad_norm(layout.model)
        # the one host sync of the step
        stats = np.array([float(layout.strategy.to_host(total)), float(norm)], dtype=np.float64)
        loss_v, norm_v = float(stats[0]), float(stats[1])
        if layout.amp.overflowed(loss_v, norm_v):
            # fp16 overflow, routine with a large scale: the scaler skips this update and lowers the scale
            # (PaddleNLP counts the step too); only a non-finite loss is a NaN for nan_policy
            layout.amp.step(layout.optimizer, layout.strategy.step)
            layout.optimizer.clear_grad()
            log.warning(f"step {state.global_step + 1}: fp16 overflow, update skipped by the loss scaler")
            return loss_v, norm_v, True
        if not (math.isfinite(loss_v) and math.isfinite(norm_v)):
            layout.optimizer.clear_grad()
            layout.amp.skip(layout.optimizer)
            return loss_v, norm_v, False
        if self.guard is not None:
            global_loss = self.comm.mean(loss_v)  # the same verdict on every rank
            self.spike_reason = self.guard.check(state.spike_stats, global_loss, norm_v)
            if self.spike_reason is not None:
                layout.optimizer.clear_grad()
                layout.amp.skip(layout.optimizer)
                return loss_v, norm_v, False
            self.guard.accept(state.spike_stats, global_loss, norm_v)
        self._clip(layout, norm_v)
        layout.amp.step(layout.optimizer, layout.strategy.step)
        layout.optimizer.clear_grad()
        return loss_v, norm_v, True
