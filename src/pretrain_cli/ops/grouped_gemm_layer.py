"""The autograd function of Paddle's grouped GEMM (`paddle.incubate.nn.functional.batched_gemm`), which Paddle 3.3.1
registers without a backward: its outputs would carry no gradient to the experts (`ops.grouped.grouped_mlp_gpu`).

Imported by `grouped_mlp_gpu` only, on a GPU (Paddle at the top): the rest of `ops.grouped` imports no Paddle.
The backward uses the op's own flags (its GPU and MUSA kernels under `phi/kernels/legacy/`): `trans_rhs` multiplies
segment e of lhs by rhs[e] transposed, `trans_lhs` segment e of lhs transposed by segment e of rhs, out
`[experts, in, out]`.
"""
from __future__ import annotations

import paddle
from paddle.autograd import PyLayer


def batched_gemm(lhs, rhs, counts, trans_lhs=False, trans_rhs=False):
    from paddle.incubate.nn.functional import batched_gemm as op

    out = op(lhs, rhs, counts, trans_lhs, trans_rhs)
    return out[0] if isinstance(out, (tuple, list)) else out  # documented as a tuple, returned as a Tensor


class BatchedGemm(PyLayer):
    """x `[rows, in]` (segments by `counts`) times w `[experts, in, out]` → `[rows, out]`, with a backward."""

    @staticmethod
    def forward(ctx, x, w, counts):
        ctx.save_for_backward(x, w)
        ctx.counts = counts
        return batched_gemm(x, w, counts)

    @staticmethod
    def backward(ctx, dy):
        x, w = ctx.saved_tensor()
        dx = batched_gemm(dy, w, ctx.counts, trans_rhs=True)  # [rows, in]
        dw = batched_gemm(x, dy, ctx.counts, trans_lhs=True)  # [experts, in, out]
        if 0 in ctx.counts:  # an expert without rows: a GEMM with k = 0, whose output is not promised to be 0
            keep = paddle.to_tensor([n > 0 for n in ctx.counts]).reshape([-1, 1, 1])  # [experts, 1, 1]
            dw = paddle.where(keep, dw, paddle.zeros_like(dw))
        return dx, dw
