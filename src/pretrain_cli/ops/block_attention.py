"""Attention of one query block against one key block, with the log-sum-exp, and its backward: the pieces
context parallelism (`distributed.steps.context`) assembles a whole sequence's attention from.

A rank holds only some query positions and sees the keys block by block, so no single call has every key.
Each block returns its softmax-normalised output and the per-row log-sum-exp (lse) of its scores; `merge`
combines two such partial results exactly (online softmax: out = Σ exp(lse_i − lse)·out_i, lse = log Σ
exp(lse_i)), which is what flash attention returns per block on GPU too (`kernels.select`'s
`attention_block`). The backward needs only the final output and lse (flash attention's recurrence):
p = exp(s − lse), dV = pᵀ·dO, dS = p·(dO·Vᵀ − rowsum(dO·O)), dQ = dS·K·scale, dK = dSᵀ·Q·scale, so
no block's probabilities are kept between forward and backward.

Layouts, head-major with GQA by broadcasting (as `ops.attention.attention_sdpa_mask`): q
`[bsz, n_kv, n_rep, q_len, head_dim]`, k/v `[bsz, n_kv, 1, k_len, head_dim]`, out the shape of q, lse
`[bsz, n_kv, n_rep, q_len, 1]` fp32. `visible` is a bool mask broadcastable to the scores
`[bsz, n_kv, n_rep, q_len, k_len]` (True = the query sees the key), or None: every key visible; `causal`
says it is exactly the causal diagonal (q_len == k_len, same positions), which flash attention masks itself.
A row that sees no key of a block gets lse −inf and output 0, which `merge` weighs by exp(−inf) = 0.
"""
from __future__ import annotations

import math

NEG_INF = float("-inf")
# query rows per block call: a block's fp32 scores, probabilities and their gradient are [b, heads, ROW_TILE, keys]
# (the memory a block needs is bounded whatever the sequence length; planning.memory counts it)
ROW_TILE = 1024


def _scores(q, k, visible):
    """Scaled scores `[bsz, n_kv, n_rep, q_len, k_len]` fp32, −inf where not visible. The product itself is fp32:
    fp16/bf16 q and k are cast first, as flash attention keeps its scores and lse in fp32. A half-precision
    product rounded before the cast (bf16 spacing 0.125 at scores of 16–32) would give exp(s − lse) off by
    percents against a flash block's fp32 lse, and rows whose probabilities do not sum to 1."""
    import paddle

    if q.dtype != paddle.float32:
        q, k = q.astype("float32"), k.astype("float32")
    scale = 1.0 / math.sqrt(q.shape[-1])
    s = paddle.matmul(q, k, transpose_y=True) * scale  # [bsz, n_kv, n_rep, q_len, k_len]
    if visible is not None:
        s = paddle.where(visible, s, paddle.full([1], NEG_INF, dtype="float32"))
    return s


def _zero_hidden(p, visible):
    """exp(−inf) is not 0 on CPU: Paddle's vectorised exp kernel returns ~3e-39 for −inf in a 5-D tensor
    (measured on 3.3.1), which would give a row that sees nothing the mean of V; hidden entries are zeroed."""
    import paddle

    return p if visible is None else paddle.where(visible, p, paddle.zeros([1], dtype=p.dtype))


def _safe(m):
    """−inf row maxima (rows that see nothing) replaced by 0, so exp(s − m) is 0, not NaN."""
    import paddle

    return paddle.where(paddle.isinf(m), paddle.zeros_like(m), m)


def block_forward(q, k, v, visible=None, causal: bool = False):
    """(out `[bsz, n_kv, n_rep, q_len, head_dim]` in q's dtype, lse `[bsz, n_kv, n_rep, q_len, 1]` fp32). With
    autocast off (`ops.fp32`): the ring's forward runs under GPU autocast, which would make the scores' GEMM half."""
    from pretrain_cli.ops.fp32 import autocast_off

    with autocast_off():
        return _block_forward(q, k, v, visible)


def _block_forward(q, k, v, visible):
    import paddle

    s = _scores(q, k, visible)
    m = _safe(paddle.max(s, axis=-1, keepdim=True))  # [bsz, n_kv, n_rep, q_len, 1]
    p = _zero_hidden(paddle.exp(s - m), visible)  # [bsz, n_kv, n_rep, q_len, k_len]
    denom = paddle.sum(p, axis=-1, keepdim=True)  # [bsz, n_kv, n_rep, q_len, 1]
    out = paddle.matmul((p / paddle.clip(denom, min=1e-30)).astype(v.dtype), v)  # [bsz, n_kv, n_rep, q_len, head_dim]
    lse = paddle.where(denom > 0, m + paddle.log(paddle.clip(denom, min=1e-30)), paddle.full([1], NEG_INF, "float32"))
    return out, lse  # −inf for rows that see nothing


def merge(out_a, lse_a, out_b, lse_b):
    """Two partial results over disjoint key sets → the result over their union (either may be None)."""
    import paddle

    if out_a is None:
        return out_b, lse_b
    m = _safe(paddle.maximum(lse_a, lse_b))  # [bsz, n_kv, n_rep, q_len, 1]
    wa, wb = paddle.exp(lse_a - m), paddle.exp(lse_b - m)  # [bsz, n_kv, n_rep, q_len, 1] each
    total = wa + wb
    lse = m + paddle.log(total)
    inv = 1.0 / paddle.clip(total, min=1e-30)
    out = (out_a.astype("float32") * (wa * inv) + out_b.astype("float32") * (wb * inv)).astype(out_a.dtype)
    return out, lse


def block_backward(q, k, v, out, lse, dout, visible=None):
    """(dq `[bsz, n_kv, n_rep, q_len, head_dim]`, dk, dv `[bsz, n_kv, 1, k_len, head_dim]`) of this block's share,
    from the final (merged over every block) `out` and `lse` of these queries and the upstream `dout`. Its GEMMs
    fp32 with autocast off (`ops.fp32`): a pipeline's schedule runs the backward under autocast."""
    from pretrain_cli.ops.fp32 import autocast_off

    with autocast_off():
        return _block_backward(q, k, v, out, lse, dout, visible)


def _block_backward(q, k, v, out, lse, dout, visible):
    import paddle

    scale = 1.0 / math.sqrt(q.shape[-1])
    p = _zero_hidden(paddle.exp(_scores(q, k, visible) - lse), visible)  # [bsz, n_kv, n_rep, q_len, k_len]
    do32 = dout.astype("float32")
    dv = paddle.sum(paddle.matmul(p, do32, transpose_x=True), axis=2, keepdim=True)  # [bsz, n_kv, 1, k_len, d]
    dp = paddle.matmul(do32, v.astype("float32"), transpose_y=True)  # [bsz, n_kv, n_rep, q_len, k_len]
    row = paddle.sum(do32 * out.astype("float32"), axis=-1, keepdim=True)  # [bsz, n_kv, n_rep, q_len, 1]
    ds = p * (dp - row) * scale  # [bsz, n_kv, n_rep, q_len, k_len]
    dq = paddle.matmul(ds, k.astype("float32"))  # [bsz, n_kv, n_rep, q_len, head_dim]
    dk = paddle.sum(paddle.matmul(ds, q.astype("float32"), transpose_x=True), axis=2, keepdim=True)  # [.., k_len, d]
    return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype)
