"""Mixed precision as one object the step calls unconditionally: fp32 is the object that does nothing.

On CPU Paddle silently ignores `auto_cast` (ARCHITECTURE.md facts: AMP), so `config.resolve` already turned
fp16/bf16 off there with a note; `Amp` is only built with a GPU and an AMP dtype. fp16 adds a loss
scaler (O1/O2); bf16 has fp32's range and needs none.

How a layout divides the scale out is its own (`Strategy.unscale`): `GradScaler.unscale_` runs the class's
`_unscale` (`super()._unscale`, amp/grad_scaler.py 3.3.1), whose legacy `check_finite_and_unscale` refuses the
semi-auto engine's DistTensor gradients (`SystemError: Unrecognized egr::EagerVariable type`); there the wrapper's
own `_unscale` (`dist.shard_scaler`) runs instead, which marks the optimizer unscaled as `unscale_` does.

The scaler never calls an optimizer's own `step()`: `GradScaler.step(optimizer)` (amp/grad_scaler.py, Paddle 3.3.1)
hands `found_inf` to the optimizer and calls `optimizer.step()` once, and for fleet's `HybridParallelOptimizer`
(ZeRO-1, ZeRO-1 x CP, sharded pipelines) that `step()` runs `_hybrid_sync_grad` again
(distributed/fleet/meta_optimizers/dygraph_optimizer/hybrid_parallel_optimizer.py 3.3.1), after `Step` already
called `strategy.sync_grads()`: every gradient reduced to its owner twice, and a pipeline's ZeRO-2 release
skipped. So the scaler sees `ScalerView`, whose `step()` is the strategy's own step path.

Whether a step overflowed is the step's verdict (a finite loss with a non-finite global gradient norm: the
same on every rank), handed to the scaler as its `found_inf` before `step` and `update`. The scaler's own flag
need not be: fleet's layouts unscale through the class's `_unscale` (the wrapper's, `fleet.distributed_scaler`,
which all-reduces the flag, does not mark the optimizer unscaled: `step` would divide the scale out again), which
leaves each rank its own flag, so ranks could disagree: some apply an update others skip, and their scales part
ways. A skipped step (non-finite or a spike) also sets the flag `update` reads
(`_cache_found_inf`, otherwise the last applied step's), so only an overflow lowers the scale.
"""
from __future__ import annotations

import contextlib
import logging

from pretrain_cli.run_config import Precision
from pretrain_cli.run_dir import STATE_FILE

log = logging.getLogger(__name__)


class Fp32:
    """No autocast, no scaler: backward and step as they are."""

    loss_scaling = False
    scaler = None  # fp16's loss scaler (`Amp`); a pipeline schedule scales each micro-batch's loss with it

    def autocast(self):
        return contextlib.nullcontext()

    def backward(self, loss) -> None:
        loss.backward()

    def unscale(self, optimizer) -> None:
        pass

    def overflowed(self, loss: float, norm: float) -> bool:
        """An fp16 overflow (finite loss, non-finite gradients) that the scaler handles by itself."""
        return False

    def skip(self, optimizer, overflow: bool = False) -> None:
        """A step whose update is dropped (non-finite, a spike): keep the scaler's bookkeeping right."""

    def step(self, optimizer, step_fn, overflow: bool = False) -> None:
        step_fn(optimizer)

    def wrap_scaler(self, strategy) -> None:
        """Let the parallel layout (`strategy`) wrap the loss scaler (ranks must agree on an overflow) and divide the
        scale out of its gradients (`Strategy.unscale`)."""


class ScalerView:
    """The optimizer as the loss scaler sees it: every attribute the optimizer's, but `step()` runs `step_fn` (the
    strategy's step path) on it. One view per optimizer, so the scaler's per-optimizer state (keyed by the object's
    id: unscaled, stepped) follows the step from `unscale_` to `step`. The skip on overflow stays Paddle's: the
    scaler sets `found_inf` on the optimizer (`_set_auxiliary_var`, found through the wrappers' `__getattr__` on the
    inner AdamW) and the AdamW's update pass skips every parameter when it is set (optimizer/optimizer.py 3.3.1)."""

    def __init__(self, optimizer):
        self.optimizer, self.step_fn = optimizer, None

    def __getattr__(self, name):
        return getattr(self.optimizer, name)

    def step(self):
        self.step_fn(self.optimizer)


class Amp(Fp32):
    def __init__(self, precision: Precision, scaler=None):
        self.precision, self.scaler = precision, scaler
        self.loss_scaling = scaler is not None
        self._view = None
        self._unscale = None  # the layout's `Strategy.unscale`, set by `wrap_scaler` before any step

    def view(self, optimizer) -> ScalerView:
        if self._view is None or self._view.optimizer is not optimizer:  # a rollback builds a new optimizer
            self._view = ScalerView(optimizer)
        return self._view

    def autocast(self):
        import paddle

        # PaddleNLP keeps these in fp32 under O1: reductions and the loss
        black = {"reduce_sum", "c_softmax_with_cross_entropy", *self.precision.black_list}
        return paddle.amp.auto_cast(True, custom_black_list=black, custom_white_list=set(self.precision.white_list),
                                    level=self.precision.level, dtype=self.precision.amp_dtype)

    def backward(self, loss) -> None:
        (self.scaler.scale(loss) if self.scaler else loss).backward()

    def unscale(self, optimizer) -> None:
        if self.scaler:
            self._unscale(self.scaler, self.view(optimizer))

    def overflowed(self, loss: float, norm: float) -> bool:
        import math

        return self.scaler is not None and math.isfinite(loss) and not math.isfinite(norm)

    def skip(self, optimizer, overflow: bool = False) -> None:
        if self.scaler:
            self.scaler._cache_found_inf = overflow  # what `update` reads: this step's, not the last applied one's
            self.scaler.update()  # (which also resets the scaler's per-optimizer state for the next unscale_)

    def wrap_scaler(self, strategy) -> None:
        if self.scaler is not None:
            self.scaler, self._unscale = strategy.wrap_scaler(self.scaler), strategy.unscale

    def step(self, optimizer, step_fn, overflow: bool = False) -> None:
        if self.scaler:
            import numpy as np

            from pretrain_cli.ops.tensors import from_numpy

            view = self.view(optimizer)
            view.step_fn = step_fn
            # the ranks' common verdict, not this rank's flag; every step, so not by `paddle.to_tensor` (it leaks)
            self.scaler._found_inf = from_numpy(np.array([overflow]))  # [1] bool
            self.scaler.step(view)  # the strategy's step once; the update skipped on overflow
            self.scaler.update()  # and the scale lowered
        else:
            step_fn(optimizer)

    def state_dict(self) -> dict | None:
        """The scaler's state that moves during a run: the scale the next step uses and Paddle's counts toward its
        next change (`incr_count`: finite steps in a row, `decr_count`: overflows since the last lowering). A
        checkpoint keeps them so that a resumed run, or a spike rollback, scales its steps as the run that saved
        it would (started again at `loss_scale`, a scale that had dropped overflows again: steps counted with no
        update). None without a scaler (bf16, fp32)."""
        if not self.scaler:
            return None
        scale = self.scaler._scale
        scale = scale._local_value() if scale.is_dist() else scale  # (`dist.shard_scaler` may have placed it)
        return {"scale": float(scale.numpy().reshape(())), "incr_count": int(self.scaler._incr_count),
                "decr_count": int(self.scaler._decr_count)}

    def load_state_dict(self, state: dict) -> None:
        """`state` (`state_dict`'s) into the scaler; its ratios and intervals stay the ones it was built with (not
        `GradScaler.load_state_dict`, which wants them all and rebuilds the scale as a [1] tensor)."""
        import numpy as np
        import paddle

        self.scaler._scale = paddle.to_tensor(np.array(state["scale"], np.float32))  # 0-D, as `build_amp` makes it
        self.scaler._incr_count, self.scaler._decr_count = int(state["incr_count"]), int(state["decr_count"])


def resume_loss_scale(amp, saved, ckpt) -> None:
    """fp16: the loss scale and counts of checkpoint `ckpt` (a `CheckpointDir`, or None) (`Amp.state_dict`; judged
    valid when the state was read, `checkpoint_dir.loss_scaler_problem`), on a resume and a spike rollback alike: the
    scale goes on where the checkpoint left it, whatever this run's scale_loss (where a run's scale starts), said in
    a note where the checkpoint's run was given another. A state without them (a run without fp16 wrote it, or a
    version that did not keep them) leaves the scaler as it is, at scale_loss, with a note."""
    if not amp.loss_scaling:
        return
    where = ckpt.path / STATE_FILE if ckpt is not None else "the trainer state"
    start = amp.precision.loss_scale
    if saved is None:
        log.info(f"note: {where} holds no fp16 loss scale (written without fp16, or by a version that did not "
                 f"keep it); the scale goes on from {amp.state_dict()['scale']:g}")
        return
    given = ckpt.run("precision", "loss_scale") if ckpt is not None else None
    if isinstance(given, (int, float)) and given != start:
        log.info(f"note: scale_loss {start:g} differs from the {given:g} {ckpt.name}'s run was given: the scale "
                 f"goes on from the checkpoint's {saved['scale']:g} (scale_loss is where a run's scale starts); "
                 f"to start at {start:g}, delete `loss_scaler` from {where}")
    amp.load_state_dict(saved)


def build_amp(model, optimizer, precision: Precision):
    """(model, optimizer, Fp32 | Amp); O2 casts weights to half with fp32 master weights."""
    if not precision.enabled:
        return model, optimizer, Fp32()
    import paddle

    if precision.master_weights:
        # fp32 master weights always; fp32 master gradients when asked (clip/decay/update in fp32)
        model, optimizer = paddle.amp.decorate(models=model, optimizers=optimizer, level="O2",
                                               dtype=precision.amp_dtype, master_weight=True,
                                               master_grad=precision.master_grad)
    scaler = None
    if precision.loss_scaling:
        scaler = paddle.amp.GradScaler(init_loss_scaling=precision.loss_scale)
        # its scale is a [1] tensor, and on an overflow `GradScaler._update` prints `float(self._scale)`
        # (amp/grad_scaler.py 3.3.1), which numpy >= 2.4 refuses for a 1-element array (TypeError): the first fp16
        # overflow would end the run. A 0-D scale is the same value to every op that reads it.
        scaler._scale = scaler._scale.reshape([])
    return model, optimizer, Amp(precision, scaler)
