"""The autograd function of the fused LM head + loss (`ops.linear_loss`): its forward runs a pass that returns the
loss sum together with the gradients of that sum (dh, dW), which backward only scales by d(loss).

Imported by `linear_loss` when a gradient is wanted, after the environment is set (Paddle at the top): the rest
of `linear_loss` imports no Paddle, so `planning` can read its chunk arithmetic without it.
"""
from __future__ import annotations

import paddle
from paddle.autograd import PyLayer


class FusedLinearLoss(PyLayer):
    """Forward returns the loss sum; the gradients it produced are scaled by d(loss) in backward."""

    @staticmethod
    def forward(ctx, h, w, labels, run, ops):
        total, dh, dw = run(h, w, labels)
        ctx.save_for_backward(dh, dw)
        ctx.needs = (not h.stop_gradient, not w.stop_gradient)
        ctx.dtypes = (h.dtype, w.dtype)  # an fp16 run's dh and dW come fp32, cast once scaled
        ctx.ops = ops
        return total

    @staticmethod
    def backward(ctx, dloss):
        dh, dw = ctx.saved_tensor()
        g = dloss.astype("float32").reshape([1])
        ops = ctx.ops if dh.place.is_cpu_place() and dh.dtype == paddle.float32 else None
        # in place: no second weight-sized buffer at the start of the backward
        if ops is not None:  # the CPU kernel's path: threaded (Paddle's CPU multiply_ runs on one thread)
            dh, dw = ops.scale_by_(dh, g), ops.scale_by_(dw, g)
        else:
            dh, dw = dh.multiply_(g.astype(dh.dtype)), dw.multiply_(g.astype(dw.dtype))
        dh, dw = (t if t.dtype == want else t.astype(want) for t, want in zip((dh, dw), ctx.dtypes))
        return (dh if ctx.needs[0] else None), (dw if ctx.needs[1] else None)
