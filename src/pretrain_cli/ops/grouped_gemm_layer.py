"""The experts' GEMMs with their weights packed (each expert's gate | up side by side) or stacked per expert, as
one autograd function that keeps the parameters for backward, not the packed copy (`StackedGemm`), and Paddle's
grouped GEMM (`paddle.incubate.nn.functional.batched_gemm`), which Paddle 3.3.1 registers without a backward.

Why one function: a GEMM keeps its operands for backward, so `matmul(x, concat([g, u]))` or `bmm(x, stack(ws))` kept
a copy of the experts' weights per sparse layer and micro-batch in flight (on one process every routed expert's
weights again; under a pipeline without recompute, that times the micro-batches a stage holds), which `plan` did not
count (docs/PLAN.md, Mixture-of-Experts). `StackedGemm` keeps the parameters themselves, which live anyway, and
stacks them again in backward, one piece at a time for the one layer whose backward runs, as the old path's
backward copied the stack's gradient apart: measured on benchmarks/configs/moe.json's shape (one process, the old
and new path alternated in one run), a step's allocator peak 166 -> 139 MiB and its time unchanged (0.99-1.01x
wall, 0.95-1.01x CPU). Under ZeRO-3 the parameters it keeps are this rank's shards (`Gathered`): it gathers each
weight whole where a product reads it, in forward and again in backward, and returns the shards' gradients, so a
sparse layer keeps no gathered experts until its backward (tests/unit/test_zero3_expert_gather.py: 48 MiB less
kept by a forward of 4 sparse layers, the step bit for bit the same). Its products: `Matmul` (one expert's rows,
the segments path), `Bmm` (the padded path's `[experts, cap, in]`), `BatchedGemm` (the GPU's grouped GEMM over row
segments).

`batched_gemm`'s backward uses the op's own flags (its GPU and MUSA kernels under `phi/kernels/legacy/`): `trans_rhs`
multiplies segment e of lhs by rhs[e] transposed, `trans_lhs` segment e of lhs transposed by segment e of rhs, out
`[experts, in, out]`.

The dense MLP's gate|up GEMM (`ops.reference.gate_up_packed`, every dense MLP and shared expert on a GPU) kept its
`[hidden, 2·inter]` concatenation the same way; `PackedGemm` is its form of this: one GEMM, as before, the
parameters kept instead of the copy. Imported by `ops.grouped`'s and `ops.reference`'s functions, after Paddle
(Paddle at the top here).
"""
from __future__ import annotations

import numpy as np
import paddle
from paddle.autograd import PyLayer

from pretrain_cli.ops.tensors import from_numpy


def batched_gemm(lhs, rhs, counts, trans_lhs=False, trans_rhs=False):
    from paddle.incubate.nn.functional import batched_gemm as op

    out = op(lhs, rhs, counts, trans_lhs, trans_rhs)
    return out[0] if isinstance(out, (tuple, list)) else out  # documented as a tuple, returned as a Tensor


class Matmul:
    """x `[rows, in]` times w `[in, out]`: one expert's rows (`grouped_mlp_segments`)."""

    @staticmethod
    def forward(x, w):
        return paddle.matmul(x, w)  # [rows, out]

    @staticmethod
    def dx(dy, w):
        return paddle.matmul(dy, w, transpose_y=True)  # [rows, in]

    @staticmethod
    def dw(x, dy):
        return paddle.matmul(x, dy, transpose_x=True)  # [in, out]


class Bmm(Matmul):
    """x `[experts, cap, in]` times w `[experts, in, out]` (`grouped_mlp_padded`): `Matmul`'s products batched."""

    @staticmethod
    def forward(x, w):
        return paddle.bmm(x, w)  # [experts, cap, out]


class BatchedGemm:
    """x `[rows, in]` (segments by `counts`) times w `[experts, in, out]` → `[rows, out]` (`grouped_mlp_gpu`).

    An expert without rows gets a zero dW: its GEMM has k = 0, whose output the kernel does not write as 0 by
    contract. The mask saying which experts have rows is made once per layer call (three dW products use it), from
    the host counts by `ops.tensors.from_numpy`: `paddle.to_tensor` leaked a list each time, ~3 per sparse layer
    and micro-batch on a GPU."""

    def __init__(self, counts: list[int]):
        self.counts = counts
        self._has_rows = None

    def forward(self, x, w):
        return batched_gemm(x, w, self.counts)  # [rows, out]

    def dx(self, dy, w):
        return batched_gemm(dy.contiguous(), w, self.counts, trans_rhs=True)  # [rows, in]

    def dw(self, x, dy):
        dw = batched_gemm(x, dy.contiguous(), self.counts, trans_lhs=True)  # [experts, in, out]
        if 0 in self.counts:  # an expert without rows: a GEMM with k = 0, whose output is not promised to be 0
            if self._has_rows is None:
                self._has_rows = from_numpy(np.array(self.counts) > 0).reshape([-1, 1, 1])  # [experts, 1, 1]
            dw = paddle.where(self._has_rows, dw, paddle.zeros_like(dw))
        return dw


def packed(ws, stack: bool):
    """Weights as a product reads them: the experts' `[in, out]` stacked to `[experts, in, out]`, or (not `stack`)
    the one expert's tensor itself."""
    return paddle.stack(ws) if stack else ws[0]


class StackedGemm(PyLayer):
    """x times each expert's `pieces` consecutive tensors of `ws` side by side on the last axis (gate | up: the
    output `[..., 2·inter]` `swiglu_packed` reads), the experts stacked when `stack`; x and the tensors of `ws` are
    what it keeps for backward, never the stacked copies.

    One piece at a time, forward and backward (y = [x·G | x·U], dx = dy_G·Gᵀ + dy_U·Uᵀ, dG = xᵀ·dy_G): one piece's
    weights stacked are all a layer holds beyond its parameters while it runs, and without `stack` (one expert's
    rows) nothing is copied. Each parameter's gradient is a view of its piece's dW `[experts, in, out]` (Paddle
    3.3.1's stride kernels), a contiguous one: ZeRO-3's gradient hook all-reduces the buffer as laid out, and
    strided views of [dG | dU] gave it wrong values (tests/distributed/test_moe_layouts.py).

    `gathers` (None, or one `Gathered.gather` per tensor of `ws`): the tensors are this rank's shards of weights
    read whole (ZeRO-3's routed experts), and the shards are what it keeps; each weight is gathered whole where the
    product reads it, in forward and again in backward, and the whole weight's gradient goes back to its shard by
    the gather's own backward (`gather.shard_grad`), so no gathered weight outlives the product that read it.

    Dtypes: the weights are taken to x's dtype in forward and to the gradient's in backward, each gradient back to
    its input's: no-ops under fp32 (CPU) and O2; under O1 on a GPU (fp32 weights; autocast runs in forward only)
    the backward's products run in the dtype the forward's did. Read, not run: there is no GPU here."""

    @staticmethod
    def forward(ctx, x, product, pieces: int, stack: bool, gathers, *ws):
        ctx.product, ctx.pieces, ctx.stack, ctx.gathers = product, pieces, stack, gathers
        ctx.save_for_backward(x, *ws)
        ys = [product.forward(x, _as(packed(_whole(ws, gathers, p, pieces), stack), x.dtype))  # [..., out_p] each
              for p in range(pieces)]
        return paddle.concat(ys, axis=-1) if pieces > 1 else ys[0]  # [..., Σ out_p]

    @staticmethod
    def backward(ctx, dy):
        x, *ws = ctx.saved_tensor()
        product, pieces, stack, gathers = ctx.product, ctx.pieces, ctx.stack, ctx.gathers
        xc = _as(x, dy.dtype)
        dx, dws, start = None, [], 0  # dws: [pieces][experts]
        for p in range(pieces):  # dx = Σ_p dy_p · W_pᵀ, dW_p = xᵀ · dy_p
            w = _as(packed(_whole(ws, gathers, p, pieces), stack), dy.dtype)  # [experts, in, out_p] or [in, out_p]
            end = start + w.shape[-1]
            dy_p = dy[..., start:end] if pieces > 1 else dy  # [..., out_p], a view
            part = product.dx(dy_p, w)  # x's shape
            del w  # (a gathered stack: dropped before the next piece's is made)
            dx = part if dx is None else dx + part
            dw = product.dw(xc, dy_p)  # [experts, in, out_p] (stacked) or [in, out_p]
            # each expert's gradient a contiguous view of the piece's dW (an all-reduce hook reads the buffer as
            # laid out); a gathered one goes to its shard at once, so one piece's whole dW is alive at a time
            per = [_as(d, t.dtype) for d, t in zip(paddle.unbind(dw, axis=0) if stack else [dw], ws[p::pieces])]
            dws.append(per if gathers is None else [g.shard_grad(d) for g, d in zip(gathers[p::pieces], per)])
            start, per, dw = end, None, None
        grads = [dws[p][e] for e in range(len(ws) // pieces) for p in range(pieces)]
        return (_as(dx, x.dtype), *grads)


def _whole(ws, gathers, p: int, pieces: int) -> list:
    """Piece `p`'s tensors of every expert as the product reads them: gathered whole where `gathers` says how."""
    if gathers is None:
        return ws[p::pieces]
    return [g.whole() for g in gathers[p::pieces]]


class Gathered:
    """A weight this rank keeps as a shard and reads whole only inside `StackedGemm` (ZeRO-3's routed experts:
    `distributed.steps.local_kernels.ZeroGather`). `shard` is the tensor autograd sees and the GEMM keeps (this
    rank's block of the parameter, no copy); `gather` makes the weight whole, `gather.whole()` (a tensor without a
    graph, dropped after use), and takes the whole weight's gradient back to the shard, `gather.shard_grad(dw)`
    (the collectives the gather's autograd would run). Both are collectives: every rank runs them in the same order
    (every rank builds the same graph: `local_kernels._same_graph`)."""

    def __init__(self, shard, gather):
        self.shard, self.gather = shard, gather


class PackedGemm(PyLayer):
    """x · [w_0 | w_1 | …] (the dense MLP's gate | up: `ops.reference.gate_up_packed`) as ONE GEMM on the weights
    concatenated on their last axis, keeping x and the weights themselves for backward, never the concatenation.

    Why: `matmul(x, concat([g, u]))` keeps its operand, a `[hidden, 2·inter]` copy of the two weights, per layer and
    micro-batch in flight until backward (under O1 autocast's half cast of it instead): on a tiny model's forward
    (tests/unit/test_packed_gemm.py) exactly one such copy per decoder layer more than this form keeps. Here the
    concatenation is made in forward and again in backward and dropped after each, as `StackedGemm` re-forms the
    experts' stacks; the price is that second concatenation, one weight-sized copy per layer's backward.

    Numerics are the old path's, bit for bit: the forward runs the same ops (under the active autocast, as a
    `PyLayer` forward does), and the backward runs the same kernel the old path's grad node ran
    (`_C_ops.matmul_grad` on the x and the weight the GEMM read), then splits dW as `concat`'s backward did, each
    piece contiguous (an all-reduce hook reads a gradient's buffer as laid out). Under O1 (fp32 x and weights, a
    half GEMM) x is kept as the half copy the GEMM read, as the old path's matmul kept it, and the gradients go back
    to their inputs' dtypes as autocast's casts did; autocast is off in backward (fleet's pipeline runs backward
    under it), where every operand is already in dy's dtype. (O1 is checked on CPU one dtype wider, fp64 through an
    fp32 GEMM, in the test above: there is no GPU here.)"""

    @staticmethod
    def forward(ctx, x, packing, *ws):
        out = paddle.matmul(x, packing.pack(ws))  # [..., Σ out_i]; the concat freed on return
        ctx.packing, ctx.x_dtype = packing, x.dtype
        ctx.wanted = [not t.stop_gradient for t in (x, *ws)]  # Paddle wants None for an input without a gradient
        ctx.save_for_backward(_as(x, out.dtype), *ws)  # O1: x as the half GEMM read it
        return out

    @staticmethod
    def backward(ctx, dy):
        x, *ws = ctx.saved_tensor()
        with _autocast_off():
            w = _as(ctx.packing.pack(ws), dy.dtype)  # [in, Σ out_i], again, for this backward only
            dx, dw = ctx.packing.products(x, w, dy)  # x's shape, [in, Σ out_i]
            dws = ctx.packing.unpack(dw, ws)  # [in, out_i] each
        grads = (_as(dx, ctx.x_dtype), *(_as(d, t.dtype) for d, t in zip(dws, ws)))
        return tuple(g if wanted else None for g, wanted in zip(grads, ctx.wanted))


class Concat:
    """How `PackedGemm` packs on one device: the weights side by side on their last axis, the backward's products
    by the old grad node's kernel, the packed gradient cut back into contiguous pieces. A layout whose weights are
    distributed tensors passes its own (`distributed.steps.local_kernels`: each rank packs its own pieces)."""

    @staticmethod
    def pack(ws):
        return paddle.concat(ws, axis=-1)  # [in, Σ out_i]

    @staticmethod
    def products(x, w, dy):
        return paddle._C_ops.matmul_grad(x, w, dy, False, False)

    @staticmethod
    def unpack(dw, ws):
        return [d.contiguous() for d in paddle.split(dw, [t.shape[-1] for t in ws], axis=-1)]  # [in, out_i] each


def packed_gemm(x, *weights, packing=Concat):
    """`PackedGemm` of x and the weights `[in, out_i]`: `[..., Σ out_i]`."""
    return PackedGemm.apply(x, packing, *weights)


def _autocast_off():
    """Autocast off where it is on (entering Paddle's context costs ~40 µs on CPU, where it is never on)."""
    import contextlib

    from pretrain_cli.ops.fp32 import autocast_off

    return autocast_off() if paddle.amp.is_autocast_enabled() else contextlib.nullcontext()


def _as(t, dtype):
    return t if t.dtype == dtype else t.astype(dtype)


def stacked_gemm(x, product, weights, pieces: int, stack: bool = True):
    """`StackedGemm` of `weights` (a flat list, `pieces` per expert): tensors, or `Gathered` shards, all one or
    the other."""
    if weights and isinstance(weights[0], Gathered):
        return StackedGemm.apply(x, product, pieces, stack, tuple(w.gather for w in weights),
                                 *(w.shard for w in weights))
    return StackedGemm.apply(x, product, pieces, stack, None, *weights)
