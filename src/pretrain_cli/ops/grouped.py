"""Grouped SwiGLU expert MLPs over rows sorted by expert: the experts of one MoE layer as one computation.

Inputs of every path: `x` `[rows, hidden]` grouped by expert, `counts` (host ints, rows per expert),
`weights` [(gate `[hidden, inter]`, up `[hidden, inter]`, down `[inter, hidden]`)] per expert (Paddle's Linear
layout; under ZeRO-3 each a `grouped_gemm_layer.Gathered` shard, which only `stacked_gemm` reads), `swiglu_packed`
(the kernel of `[..., 2·inter]` laid out [gate | up]). Output `[rows, hidden]`, same order.

- `grouped_mlp_padded`: the experts' weights stacked to `[experts, hidden, 2·inter]` and
  `[experts, inter, hidden]`, the rows scattered into `[experts, max_count, hidden]` (zero padding), two batched
  matmuls, the rows gathered back. One GEMM call per projection whatever the number of experts.
- `grouped_mlp_segments` (reference): one GEMM per expert over its own contiguous rows (never over all tokens);
  what the padded path is tested against, and the faster one when the counts are very uneven.
- `grouped_mlp_cpu` (CPU default): the padded path while padding wastes at most `PAD_WASTE` of its GEMMs
  (experts × max_count ≤ PAD_WASTE × rows), else the segments: `benchmarks/moe_experts.py` measured the padded
  path 10 % faster on a balanced router and 4× slower than the segments with half the tokens on one expert.
- `grouped_mlp_gpu`: Paddle's `batched_gemm` (`paddle.incubate.nn.functional`), a grouped GEMM over the segments
  of the stacked weights; GPU only (`ops.kernels.select` never picks it on CPU). Paddle registers no backward for
  it (3.3.1 has no grad node: its outputs would come out with `stop_gradient` and the experts would never train),
  so `grouped_gemm_layer.BatchedGemm` gives it one: dx = dy·Wᵀ (`trans_rhs`: each segment times rhs[e] transposed)
  and dW[e] = x_eᵀ·dy_e (`trans_lhs`: the segments of lhs transposed times the same segments of rhs, out
  `[experts, in, out]`), the kernel's own contract (its GPU and MUSA kernels, `phi/kernels/legacy/`). Its kernel
  is registered for fp32 and bf16 only, so an fp16 run takes the padded or segment path. Under autocast the rows
  go in as autocast's half dtype and the output comes back in x's: `batched_gemm` and `bmm` are on neither of
  AMP's lists (amp/amp_lists.py 3.3.1), so at O1, where x comes fp32 out of the norm (promoted by its fp32
  weight), they ran the experts' GEMMs in fp32 (and an fp16 run's padded path too, its segments in fp16: the
  white-listed matmul), while the dense MLP's and shared experts' matmuls ran in half; the combine after them
  sees x's dtype as before.

Every path multiplies by packed (gate | up) or stacked weights through `grouped_gemm_layer.stacked_gemm`, which keeps
the expert parameters for backward and packs them again there, never the packed copy: a sparse layer keeps no copy
of its experts' weights from forward to backward (`plan` counts none).
"""
from __future__ import annotations


def _gate_up(weights) -> list:
    """Each expert's gate and up, in turn: the two pieces of its packed `[hidden, 2·inter]` (`stacked_gemm`)."""
    return [t for g, u, _ in weights for t in (g, u)]


def grouped_mlp_segments(x, counts, weights, swiglu_packed):
    import paddle

    from pretrain_cli.ops.grouped_gemm_layer import Matmul, stacked_gemm

    parts = paddle.split(x, counts, axis=0) if len(counts) > 1 else [x]  # [count_e, hidden] each
    outs = []
    for part, (g, u, d), n in zip(parts, weights, counts):
        if n == 0:
            continue
        h = swiglu_packed(stacked_gemm(part, Matmul, [g, u], 2, stack=False))  # [count_e, inter]
        outs.append(stacked_gemm(h, Matmul, [d], 1, stack=False))  # [count_e, hidden]
    if not outs:
        return paddle.zeros_like(x)
    return paddle.concat(outs, axis=0) if len(outs) > 1 else outs[0]  # [rows, hidden]


def grouped_mlp_padded(x, counts, weights, swiglu_packed):
    import numpy as np
    import paddle

    from pretrain_cli.ops.grouped_gemm_layer import Bmm, stacked_gemm
    from pretrain_cli.ops.tensors import from_numpy

    rows, hidden = x.shape
    cap = max(counts) if counts else 0
    if rows == 0 or cap == 0:
        return paddle.zeros_like(x)
    n = len(counts)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype("int64")
    expert = np.repeat(np.arange(n, dtype="int64"), counts)  # [rows]
    slot = from_numpy(expert * cap + (np.arange(rows, dtype="int64") - starts[expert]))  # [rows] (to_tensor leaks)
    padded = paddle.zeros([n * cap, hidden], dtype=x.dtype)
    padded = paddle.scatter(padded, slot, x, overwrite=True).reshape([n, cap, hidden])  # [experts, cap, hidden]
    h = swiglu_packed(stacked_gemm(padded, Bmm, _gate_up(weights), 2))  # [experts, cap, inter]
    out = stacked_gemm(h, Bmm, [d for _, _, d in weights], 1).reshape([n * cap, hidden])  # [experts*cap, hidden]
    return paddle.gather(out, slot)  # [rows, hidden]


PAD_WASTE = 1.3


def grouped_mlp_cpu(x, counts, weights, swiglu_packed):
    rows = int(sum(counts))
    if counts and len(counts) * max(counts) <= PAD_WASTE * rows:
        return grouped_mlp_padded(x, counts, weights, swiglu_packed)
    return grouped_mlp_segments(x, counts, weights, swiglu_packed)


def autocast_half():
    """The half dtype a white-listed GEMM computes in under the active `paddle.amp.auto_cast`, or None (off)."""
    import paddle

    if not paddle.amp.is_autocast_enabled():
        return None
    return paddle.bfloat16 if paddle.amp.get_autocast_dtype() == "bfloat16" else paddle.float16


def batched_gemm_runs(dtype: str) -> bool:
    """Whether a GPU's experts compute in `batched_gemm`, each expert's rows as they are, in compute dtype `dtype`
    ("float32", "bfloat16", "float16"): its kernel is registered for fp32 and bf16 only, so an fp16 run (V100, T4)
    takes `grouped_mlp_cpu`'s padded or segment path. One rule for `grouped_mlp_gpu` and for `plan`
    (`planning.experts.padded_rows`), so the rows planned are the rows run."""
    return dtype in ("float32", "bfloat16")


def grouped_mlp_gpu(x, counts, weights, swiglu_packed, fp16_path=None):
    """`fp16_path`: the path an fp16 run takes instead, `grouped_mlp_cpu` unless given (`local_kernels._same_graph`
    passes the padded one, whose calls do not depend on the counts)."""
    half = autocast_half()
    if half is not None and x.dtype != half:  # O1: x came fp32 out of the promoted norm (module docstring)
        return grouped_mlp_gpu(x.astype(half), counts, weights, swiglu_packed, fp16_path).astype(x.dtype)
    if not batched_gemm_runs(str(x.dtype).removeprefix("paddle.")):  # fp16: batched_gemm has no kernel for it
        return (fp16_path or grouped_mlp_cpu)(x, counts, weights, swiglu_packed)
    from pretrain_cli.ops.grouped_gemm_layer import BatchedGemm, stacked_gemm

    gemm = BatchedGemm([int(n) for n in counts])
    h = swiglu_packed(stacked_gemm(x, gemm, _gate_up(weights), 2))  # [rows, inter]
    return stacked_gemm(h, gemm, [d for _, _, d in weights], 1)  # [rows, hidden]
