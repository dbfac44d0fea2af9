"""Mixed precision as one object the step calls unconditionally: fp32 is the object that does nothing.

On CPU Paddle silently ignores `auto_cast` (ARCHITECTURE.md facts: AMP), so `config.resolve` already turned
fp16/bf16 off there with a note; `Amp` is only built with a GPU and an AMP dtype. fp16 adds a loss
scaler (O1/O2); bf16 has fp32's range and needs none.
"""
from __future__ import annotations

import contextlib
from pretrain_cli.run_config import Precision


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

    def skip(self, optimizer) -> None:
        """A step whose update is dropped (non-finite): keep the scaler's bookkeeping right."""

    def step(self, optimizer, step_fn) -> None:
        step_fn(optimizer)

    def wrap_scaler(self, wrap) -> None:
        """Let the parallel layout wrap the loss scaler (ranks must agree on an overflow)."""


class Amp(Fp32):
    def __init__(self, precision: Precision, scaler=None):
        self.precision, self.scaler = precision, scaler
        self.loss_scaling = scaler is not None

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
            self.scaler.unscale_(optimizer)

    def overflowed(self, loss: float, norm: float) -> bool:
        import math

        return self.scaler is not None and math.isfinite(loss) and not math.isfinite(norm)

    def skip(self, optimizer) -> None:
        if self.scaler:
            self.scaler.update()

    def wrap_scaler(self, wrap) -> None:
        if self.scaler is not None:
            self.scaler = wrap(self.scaler)

    def step(self, optimizer, step_fn) -> None:
        if self.scaler:
            self.scaler.step(optimizer)  # skips the update on overflow and lowers the scale
            self.scaler.update()
        else:
            step_fn(optimizer)


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
    scaler = paddle.amp.GradScaler(init_loss_scaling=precision.loss_scale) if precision.loss_scaling else None
    return model, optimizer, Amp(precision, scaler)
