"""Mixed precision on GPU (bf16/fp16, O1/O2, fp16 loss scaling); CPU runs stay fp32.

On CPU Paddle silently ignores `auto_cast` (PADDLE_CPU.md §4), so `resolve.py` already turned
fp16/bf16 off there with a note; this module is only reached with a GPU and an AMP dtype.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class AmpContext:
    dtype: str  # "bfloat16" | "float16"
    level: str  # "O1" | "O2"
    scaler: object = None  # paddle.amp.GradScaler for fp16
    black_list: tuple = ()
    white_list: tuple = ()

    def autocast(self):
        import paddle

        # PaddleNLP keeps these in fp32 under O1: reductions and the loss
        black = {"reduce_sum", "c_softmax_with_cross_entropy", *self.black_list}
        return paddle.amp.auto_cast(True, custom_black_list=black, custom_white_list=set(self.white_list),
                                    level=self.level, dtype=self.dtype)


def build_amp(model, optimizer, resolved, training):
    """(model, optimizer, AmpContext | None); O2 casts weights to half with fp32 master weights."""
    if resolved.amp_dtype is None:
        return model, optimizer, None
    import paddle

    if resolved.amp_level == "O2":
        # fp32 master weights always; fp32 master gradients when asked (clip/decay/update in fp32)
        model, optimizer = paddle.amp.decorate(models=model, optimizers=optimizer, level="O2",
                                               dtype=resolved.amp_dtype, master_weight=True,
                                               master_grad=bool(training.amp_master_grad))
    scaler = None
    if resolved.amp_dtype == "float16":
        scaler = paddle.amp.GradScaler(init_loss_scaling=training.scale_loss)
    ctx = AmpContext(resolved.amp_dtype, resolved.amp_level, scaler,
                     tuple(training.amp_custom_black_list or ()), tuple(training.amp_custom_white_list or ()))
    return model, optimizer, ctx
