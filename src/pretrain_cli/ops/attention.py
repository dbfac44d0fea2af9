"""Attention on Paddle's own ops, on any device: the causal and document-masked references and the
materialising `sdpa_mask` paths that `kernels.select` picks for `use_flash_attention: false`.

`attention_math` is the ground truth every path is tested against (`select` never picks it). Document
masking (packed samples, `attention_mask_type: document`) is described per query row: `doc_start[b, i]`
(int64 `[bsz, seq_len]`) is the first position of query i's document, so it sees keys doc_start[b, i] … i.
Layouts as in kernels.py: q `[bsz, seq_len, n_heads, head_dim]`, k/v `[bsz, seq_len, n_kv_heads, head_dim]`.
"""
from __future__ import annotations

import math

_MASKS: dict = {}  # (q_len, k_len, place) -> bool causal mask, reused across layers and steps


def repeat_kv(x, n_rep: int):
    """KV head j serves query heads j·n_rep … j·n_rep+n_rep−1 (HF `repeat_kv` order)."""
    if n_rep == 1:
        return x
    import paddle

    return paddle.repeat_interleave(x, n_rep, axis=2)  # [bsz, seq_len, n_kv_heads*n_rep, head_dim]


def attention_math(q, k, v, doc_start=None):
    """Naive causal attention with an fp32 softmax: the ground truth the other paths are tested against.

    With `doc_start` (packed documents, q_len == k_len) query i also stops seeing keys before its document.
    """
    import paddle
    import paddle.nn.functional as F

    bsz, seq_len, n_heads, head_dim = q.shape
    k_len = k.shape[1]
    n_rep = n_heads // k.shape[2]
    k, v = repeat_kv(k, n_rep), repeat_kv(v, n_rep)
    qt = q.transpose([0, 2, 1, 3])  # [bsz, n_heads, seq_len, head_dim]
    kt = k.transpose([0, 2, 1, 3])  # [bsz, n_heads, seq_len, head_dim]
    vt = v.transpose([0, 2, 1, 3])  # [bsz, n_heads, seq_len, head_dim]
    scores = paddle.matmul(qt, kt, transpose_y=True).astype("float32") / math.sqrt(head_dim)
    if doc_start is None:
        # bottom-right aligned: query i sits at position k_len − seq_len + i (a KV cache has k_len > seq_len)
        mask = paddle.triu(paddle.full([seq_len, k_len], float("-inf"), dtype="float32"), 1 + k_len - seq_len)
    else:
        mask = paddle.stack(_document_add_masks(doc_start, "float32")).unsqueeze(1)  # [bsz, 1, seq_len, seq_len]
    probs = F.softmax(scores + mask, axis=-1).astype(q.dtype)  # [bsz, n_heads, seq_len, seq_len]
    out = paddle.matmul(probs, vt)  # [bsz, n_heads, seq_len, head_dim]
    return out.transpose([0, 2, 1, 3])  # [bsz, seq_len, n_heads, head_dim]


def document_visible(doc_start):
    """`[bsz, seq_len, seq_len]` bool, True where query i (row) may see key j: doc_start[b, i] <= j <= i."""
    import paddle

    seq_len = doc_start.shape[1]
    pos = paddle.arange(seq_len, dtype="int64")
    causal = pos.reshape([1, 1, seq_len]) <= pos.reshape([1, seq_len, 1])  # [1, seq_len, seq_len]
    in_doc = pos.reshape([1, 1, seq_len]) >= doc_start.unsqueeze(-1)  # [bsz, seq_len, seq_len]
    return paddle.logical_and(causal, in_doc)


_DOC_MASKS: dict = {}  # (id(doc_start), dtype) -> (doc_start, masks): one forward's masks for every layer


def _document_add_masks(doc_start, dtype) -> list:
    """One `[seq_len, seq_len]` additive mask (0 visible, −inf hidden) per sample of `doc_start`.

    Per sample, so each is added with a trailing-dimension broadcast: adding one `[bsz, 1, 1, s, s]` mask to
    the `[bsz, kv, rep, s, s]` scores broadcasts over middle dimensions, which Paddle's CPU kernel does 2–3×
    slower than the whole causal add. Built once per forward and shared by every layer: the model passes
    the same `doc_start` tensor to all of them, so it is keyed by identity (the entry keeps the tensor
    alive, so the id cannot be reused). to_static's SOT cannot trace that key: `psdb.fallback` has it run this
    function eagerly (`ops.rope`).
    """
    import paddle
    from paddle.jit.sot import psdb

    psdb.fallback(recursive=True)  # to_static: SOT runs this function eagerly; else a no-op
    key = (id(doc_start), str(dtype))
    hit = _DOC_MASKS.get(key)
    if hit is None or hit[0] is not doc_start:
        visible = document_visible(doc_start)  # [bsz, seq_len, seq_len]
        m = paddle.where(visible, paddle.zeros([1], dtype=dtype), paddle.full([1], float("-inf"), dtype=dtype))
        m.stop_gradient = True
        _DOC_MASKS.clear()  # one forward at a time: the previous step's masks are not needed again
        hit = _DOC_MASKS[key] = (doc_start, paddle.unbind(m, axis=0))  # bsz x [seq_len, seq_len]
    return hit[1]


def _causal_bool_mask(q_len: int, k_len: int, place):
    """`[q_len, k_len]` bool, True = visible; query row i sits at position k_len − q_len + i.

    Built once per shape and reused across layers and steps (sdpa's CPU path rebuilds a float
    triangle on every call).
    """
    import paddle

    key = (q_len, k_len, str(place))
    if key not in _MASKS:
        rows = paddle.arange(q_len).reshape([q_len, 1]) + (k_len - q_len)  # [q_len, 1]
        _MASKS[key] = paddle.arange(k_len).reshape([1, k_len]) <= rows  # [q_len, k_len]
    return _MASKS[key]


_ADD_MASKS: dict = {}  # (q_len, k_len, dtype, place) -> additive causal mask (0 visible, −inf hidden)


def _causal_add_mask(q_len: int, k_len: int, dtype, place):
    """`[q_len, k_len]` float: 0 where `_causal_bool_mask` is True, −inf elsewhere; cached per shape."""
    import paddle

    key = (q_len, k_len, str(dtype), str(place))
    if key not in _ADD_MASKS:
        visible = _causal_bool_mask(q_len, k_len, place)
        m = paddle.where(visible, paddle.zeros([1], dtype=dtype), paddle.full([1], float("-inf"), dtype=dtype))
        m.stop_gradient = True
        _ADD_MASKS[key] = m
    return _ADD_MASKS[key]


def attention_sdpa_mask(q, k, v, doc_start=None):
    """CPU default: the math of Paddle's CPU sdpa with a cached bool mask applied by `where`.

    On CPU `F.scaled_dot_product_attention` is Python matmul+softmax anyway; writing it out
    keeps the mask cached, lets `q_len < k_len` (a KV cache) align the mask bottom-right, skips
    the mask for one-token decode steps, and broadcasts GQA K/V instead of materialising
    `repeat_kv` (sdpa's expand + ExpandGrad: 1.5–6 % of a CPU step, depending on load).
    With `doc_start` each sample gets its own document mask (built once per forward).
    """
    import paddle
    import paddle.nn.functional as F

    bsz, q_len, n_heads, head_dim = q.shape
    k_len, n_kv = k.shape[1], k.shape[2]
    n_rep = n_heads // n_kv
    qt = (q * (1.0 / math.sqrt(head_dim))).transpose([0, 2, 1, 3])  # [bsz, n_heads, q_len, head_dim]
    kt = k.transpose([0, 2, 1, 3])  # [bsz, n_kv, k_len, head_dim]
    vt = v.transpose([0, 2, 1, 3])  # [bsz, n_kv, k_len, head_dim]
    # GQA by batch broadcasting: query heads [j·n_rep, (j+1)·n_rep) share KV head j; no K/V copy,
    # and the broadcast grad sums per head exactly as expand's grad does (bit-identical dK/dV).
    qt = qt.reshape([bsz, n_kv, n_rep, q_len, head_dim])  # [bsz, n_kv, n_rep, q_len, head_dim]
    kt = kt.unsqueeze(2)  # [bsz, n_kv, 1, k_len, head_dim]
    vt = vt.unsqueeze(2)  # [bsz, n_kv, 1, k_len, head_dim]
    scores = paddle.matmul(qt, kt, transpose_y=True)  # [bsz, n_kv, n_rep, q_len, k_len]
    if doc_start is not None:  # per sample: [1, n_kv, n_rep, q_len, k_len] + [q_len, k_len]
        parts = paddle.split(scores, bsz, axis=0)
        scores = paddle.concat([p + m for p, m in zip(parts, _document_add_masks(doc_start, scores.dtype))], axis=0)
    elif q_len > 1:
        # + 0 / + (−inf): same output, dK and dV as `where(mask, scores, −inf)` (dQ to ~1e-26), but a
        # broadcast add needs no expand of mask and fill (where's CPU path materialises both)
        scores = scores + _causal_add_mask(q_len, k_len, scores.dtype, q.place)
    probs = F.softmax(scores.astype("float32"), axis=-1).astype(q.dtype)
    out = paddle.matmul(probs, vt)  # [bsz, n_kv, n_rep, q_len, head_dim]
    out = out.reshape([bsz, n_heads, q_len, head_dim])  # [bsz, n_heads, q_len, head_dim]
    return out.transpose([0, 2, 1, 3])  # [bsz, q_len, n_heads, head_dim]
