"""RoPE on Paddle's own ops: the reference path that `ops.kernels` falls back to and tests compare against.

The rotation is done as a GEMM with an exact ±1 rotate-half matrix (cheaper on CPU than slicing and
concatenating); cached per (head_dim, dtype, place) and per cos/sin table.

The per-table caches are keyed by tensor identity, which to_static's SOT cannot trace (Paddle 3.3.1 raised
`InnerError: [DictVariable] received (...) as key` at the first compiled forward with `cpu_fused_ops: false`).
The functions that read them call `psdb.fallback(recursive=True)` first: under SOT that runs the function eagerly
(a graph break), so a compiled forward reads the same cached tables as an eager one; outside SOT it does nothing.
"""
from __future__ import annotations


_ROTATIONS: dict = {}  # (head_dim, dtype, place) -> [head_dim, head_dim] rotate-half matrix


def _rotation(head_dim: int, dtype, place):
    """R with `x @ R == concat([-x2, x1])` (HF rotate_half), exact: one ±1 per column.

    Folded into the per-position RoPE matrix (`rope_reference`), it replaces slice+neg+concat,
    whose backward (SliceGrad: a zero-filled full tensor per slice) was the single largest
    non-matmul cost of a CPU step (docs/PERFORMANCE.md).
    """
    import numpy as np
    import paddle

    key = (head_dim, str(dtype), str(place))
    if key not in _ROTATIONS:
        half = head_dim // 2
        r = np.zeros([head_dim, head_dim], dtype=np.float32)
        r[np.arange(half) + half, np.arange(half)] = -1.0  # out[:half] = -x[half:]
        r[np.arange(half), np.arange(half) + half] = 1.0  # out[half:] = x[:half]
        _ROTATIONS[key] = paddle.to_tensor(r, place=place).astype(dtype)
    return _ROTATIONS[key]


def _rope_one(x, mats):
    """`x[b, p] @ M[p]` for every position p: one batched GEMM over positions."""
    import paddle

    bsz, seq_len, heads, head_dim = x.shape
    xt = x.transpose([1, 0, 2, 3]).reshape([seq_len, bsz * heads, head_dim])  # [seq_len, bsz*heads, head_dim]
    out = paddle.matmul(xt, mats).reshape([seq_len, bsz, heads, head_dim])  # [seq_len, bsz, heads, head_dim]
    return out.transpose([1, 0, 2, 3])  # [bsz, seq_len, heads, head_dim]


_ROPE_MATS: dict = {}  # (id(cos), id(sin)) -> (cos, sin, M): M per cached cos/sin table pair


def _build_rope_mats(cos, sin):
    import paddle

    seq_len, head_dim = cos.shape
    rot = _rotation(head_dim, "float32", cos.place)
    cos32, sin32 = cos.astype("float32"), sin.astype("float32")
    return paddle.diag_embed(cos32) + rot.unsqueeze(0) * sin32.unsqueeze(1)  # [seq_len, head_dim, head_dim]


def _rope_mats(cos, sin):
    """M[p] for a cos/sin pair, built once per table and shared by every layer and step.

    `RotaryEmbedding` caches its (cos, sin) tensors per length, so the same objects come back each
    call; tables that need no gradient (all of them in this project) are keyed by identity (the
    entry keeps the tensors alive, so ids cannot be reused). Anything else is built per call.
    """
    from paddle.jit.sot import psdb

    psdb.fallback(recursive=True)  # to_static: SOT runs this function eagerly (module docstring); else a no-op
    if not (cos.stop_gradient and sin.stop_gradient):
        return _build_rope_mats(cos, sin)
    key = (id(cos), id(sin))
    hit = _ROPE_MATS.get(key)
    if hit is None or hit[0] is not cos or hit[1] is not sin:
        mats = _build_rope_mats(cos, sin)
        mats.stop_gradient = True
        hit = _ROPE_MATS[key] = (cos, sin, mats)
        if len(_ROPE_MATS) > 16:  # generation walks offsets: keep the cache small
            _ROPE_MATS.pop(next(iter(_ROPE_MATS)))
    return hit[2]


_ROPE_ROWS: dict = {}  # (id(cos), id(position_ids)) -> (cos, sin, position_ids, cos rows, sin rows)


def _rope_rows(cos, sin, position_ids):
    """Each token's cos/sin rows `[bsz, seq_len, 1, head_dim]` (fp32), gathered once per forward: every layer
    gets the same table and `position_ids` objects, so they are keyed by identity (kept alive by the entry)."""
    import paddle
    from paddle.jit.sot import psdb

    psdb.fallback(recursive=True)  # to_static: SOT runs this function eagerly (module docstring); else a no-op
    key = (id(cos), id(position_ids))
    hit = _ROPE_ROWS.get(key)
    if hit is None or hit[0] is not cos or hit[1] is not sin or hit[2] is not position_ids:
        rows = [paddle.gather(t.astype("float32"), position_ids.reshape([-1]), axis=0)  # [bsz*seq_len, head_dim]
                .reshape([*position_ids.shape, 1, t.shape[-1]]) for t in (cos, sin)]  # [bsz, seq_len, 1, head_dim]
        _ROPE_ROWS.clear()  # one forward at a time
        hit = _ROPE_ROWS[key] = (cos, sin, position_ids, *rows)
    return hit[3], hit[4]


def rope_reference(q, k, cos, sin, position_ids=None):
    """HF rotate-half RoPE in fp32 as one per-position GEMM: `x·cos + rotate_half(x)·sin = x @ M[p]`.

    M[p] = diag(cos_p) + R·diag(sin_p) (R = the rotate-half matrix) is built once per cos/sin table
    (`_rope_mats`) and shared by q, k, every layer and every step. Two broadcast multiplies, an add and slice/concat per
    tensor (and their backward, SliceGrad being the worst) become one small GEMM each way: ~2.5× faster on CPU,
    equal to the elementwise form to ~5e-7 (docs/PERFORMANCE.md).
    With `position_ids` (positions restarting per packed document) the rows differ per sample, so the
    elementwise form runs, with `rotate_half(x) = x @ R` (no slice/concat either).
    """
    if position_ids is not None:
        import paddle

        c, s = _rope_rows(cos, sin, position_ids)  # [bsz, seq_len, 1, head_dim] each
        rot = _rotation(cos.shape[-1], "float32", cos.place)
        q32, k32 = q.astype("float32"), k.astype("float32")
        q_out = q32 * c + paddle.matmul(q32, rot) * s  # [bsz, seq_len, n_heads, head_dim]
        k_out = k32 * c + paddle.matmul(k32, rot) * s  # [bsz, seq_len, n_kv_heads, head_dim]
        return q_out.astype(q.dtype), k_out.astype(k.dtype)
    mats = _rope_mats(cos, sin)  # [seq_len, head_dim, head_dim]
    q_out = _rope_one(q.astype("float32"), mats)
    k_out = _rope_one(k.astype("float32"), mats)
    return q_out.astype(q.dtype), k_out.astype(k.dtype)
