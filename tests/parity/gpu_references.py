"""Paddle's fused GPU ops as references that run on CPU, for the GPU kernel branch of `ops.kernels`
(test_gpu_branch.py installs them under Paddle's names; test_gpu_references.py checks them against numpy).

Paddle's fused GPU ops cannot run on a CPU (`fused_rms_norm` is a SIGILL there, flashmask has no CPU kernel),
so each is replaced by a reference written from Paddle's documented semantics (the docstrings of Paddle 3.3's
`paddle.incubate.nn.functional.fused_rms_norm` / `fused_rotary_position_embedding` / `swiglu` and
`paddle.nn.functional.scaled_dot_product_attention` / `flashmask_attention` / `swiglu`):

- `fused_rms_norm(x, norm_weight, norm_bias, epsilon, begin_norm_axis, bias=None, residual=None, ...)` returns
  the tuple `(out, residual_out, inv_var)` (the static-graph branch of the wrapper creates these three outputs);
  the norm runs over axes `begin_norm_axis..`, of `x + bias + residual`; `out` has x's dtype.
- `fused_rotary_position_embedding(q, k, v, sin, cos, position_ids, use_neox_rotary_style, time_major)` returns
  `(out_q, out_k, out_v)` (None where not given): q/k/v `[batch, seq, heads, head_dim]`, sin/cos `[seq, head_dim]`
  or `[1, seq, 1, head_dim]`, `position_ids` int64 `[batch, seq]` picks each token's table row;
  `use_neox_rotary_style=False` pairs the front half with the back half (HF rotate-half), True pairs
  adjacent numbers.
- `scaled_dot_product_attention(q, k, v, attn_mask, dropout_p, is_causal, ..., enable_gqa=True)`: layout
  `[batch, seq, heads, head_dim]`, scale 1/sqrt(head_dim), GQA when k/v have fewer heads.
- `flashmask_attention(q, k, v, startend_row_indices, *, causal, ...)`: q/k/v fp16/bf16 `[batch, seq, heads,
  head_dim]`; with `causal=True` and `startend_row_indices` int32 `[batch, 1 or kv_heads, k_seq, 1]`, key
  column j is hidden from rows >= startend_row_indices[..., j, 0] (on top of the causal mask); returns the
  output only (no `return_softmax_lse`).
- `swiglu(x, y=None)`: silu(x) * y; with y None, x's last axis is split in halves [gate | up].

Each reference refuses what its GPU kernel refuses (ValueError, as Paddle raises an InvalidArgument), so a call that
would fail on a GPU fails here too: `fused_rms_norm` reads the weight, bias and residual as x's type, so an fp32
weight beside a half x is refused, not cast. The 3.3.1 wheel's `fused_rms_norm` calls `_C_ops.fused_rms_norm_quant`
(incubate/nn/functional/fused_rms_norm.py), whose kernel its include/paddle/phi/kernels/rms_norm_kernel.h declares as
`RmsNormQuantKernel<T>`, one T for x, weight, bias and residual (the header's `RmsNormWrapper` and
`ResidualAddRmsNormWrapper` take them all as `const T*`). Its body, read in paddle/phi/kernels/gpu/rms_norm_kernel.cu
at PaddlePaddle/Paddle 02a5e4e0 (the same signature, then named `RmsNormKernel` and registered as `rms_norm`; no later
source was at hand), reads them by `norm_weight.data<T>()`, `residual.get().data<T>()`, `bias.get().data<T>()`, T
x's type. The fused RoPE kernel (paddle/phi/kernels/fusion/gpu/fused_rope_kernel.cu, `FusedRopeKernel`, read at
02ecffcb) wants sin and cos of one shape, 2-D or `[1, seq, 1, head_dim]`, of q's head_dim and q's type
(`sin.data<T>()`), a table exactly as long as q's sequence without `position_ids` and at least as long with them,
and k, v of q's type.

`_t` makes the float32 array the tests give these references a tensor of the dtype asked.
"""
import math

import numpy as np

from pretrain_cli import runtime

paddle = runtime.import_paddle()

import paddle.nn.functional as F  # noqa: E402

HALF = (paddle.float16, paddle.bfloat16)


def ref_fused_rms_norm(x, norm_weight, norm_bias, epsilon, begin_norm_axis=1, bias=None, residual=None,
                       quant_scale=-1, quant_round_type=0, quant_max_bound=0, quant_min_bound=0):
    assert quant_scale <= 0, "the reference covers the unquantised op"
    axis = begin_norm_axis + x.ndim if begin_norm_axis < 0 else begin_norm_axis
    assert 0 <= axis < x.ndim and list(norm_weight.shape) == [int(np.prod(x.shape[axis:]))]
    for name, t in (("norm_weight", norm_weight), ("norm_bias", norm_bias), ("bias", bias), ("residual", residual)):
        if t is not None and t.dtype != x.dtype:
            raise ValueError(f"fused_rms_norm: {name} is {t.dtype} and x {x.dtype}: the kernel reads it as x's type")
    h = x.astype("float32")  # the sums in fp32 (Paddle's CPU kernels have no bf16 add)
    h = h if bias is None else h + bias.astype("float32")
    h = h if residual is None else h + residual.astype("float32")
    h32 = h.reshape([*h.shape[:axis], -1])  # [..., normalised]
    inv = paddle.rsqrt(paddle.mean(h32 * h32, axis=-1, keepdim=True) + epsilon)  # [..., 1]
    out = h32 * inv * norm_weight.astype("float32")
    if norm_bias is not None:
        out = out + norm_bias.astype("float32")
    return out.reshape(x.shape).astype(x.dtype), h.astype(x.dtype), inv.reshape(x.shape[:axis])


def ref_fused_rope(q, k=None, v=None, sin=None, cos=None, position_ids=None, use_neox_rotary_style=True,
                   time_major=False, rotary_emb_base=10000.0):
    assert sin is not None and cos is not None and not time_major, "the reference covers the tabled form"
    _check_rope(q, k, v, sin, cos, position_ids)

    def table(t):  # [seq, head_dim] or [1, seq, 1, head_dim] -> fp32 [seq, head_dim]
        return t.reshape([t.shape[-3] if t.ndim == 4 else t.shape[0], t.shape[-1]]).astype("float32")

    c, s = table(cos), table(sin)

    def rows(tab, x):  # each token's row: [1 or batch, seq, 1, head_dim]
        bsz, seq = x.shape[0], x.shape[1]
        if position_ids is None:
            return tab.reshape([1, seq, 1, -1])  # (the table is exactly seq long: `_check_rope`)
        assert position_ids.dtype == paddle.int64 and list(position_ids.shape) == [bsz, seq]
        return paddle.gather(tab, position_ids.reshape([-1]), axis=0).reshape([bsz, seq, 1, -1])

    def rotate(x):
        x32, half = x.astype("float32"), x.shape[-1] // 2
        if use_neox_rotary_style:  # adjacent pairs (2i, 2i+1)
            rot = paddle.stack([-x32[..., 1::2], x32[..., 0::2]], axis=-1).reshape(x32.shape)
        else:  # front half with back half
            rot = paddle.concat([-x32[..., half:], x32[..., :half]], axis=-1)
        return (x32 * rows(c, x) + rot * rows(s, x)).astype(x.dtype)

    return tuple(None if t is None else rotate(t) for t in (q, k, v))


def _check_rope(q, k, v, sin, cos, position_ids):
    """`FusedRopeKernel`'s checks (fused_rope_kernel.cu), each a ValueError as Paddle's InvalidArgument is."""
    bsz, seq, _, head_dim = q.shape
    if head_dim % 2:
        raise ValueError("fused_rope: the head_dim of input must be a multiple of 2")
    if sin.shape != cos.shape:
        raise ValueError(f"fused_rope: the dims of sin and cos must be the same: {sin.shape} and {cos.shape}")
    if not (sin.ndim == 2 or (sin.ndim == 4 and sin.shape[0] == 1 and sin.shape[2] == 1)):
        raise ValueError(f"fused_rope: sin and cos must be [seq_len, head_dim] or [1, seq_len, 1, head_dim]: "
                         f"{sin.shape}")
    rows = sin.shape[1 if sin.ndim == 4 else 0]
    if sin.shape[-1] != head_dim or (rows < seq if position_ids is not None else rows != seq):
        need = "at least" if position_ids is not None else "exactly"
        raise ValueError(f"fused_rope: sin and cos {sin.shape} against q {q.shape}: the table must be {need} q's "
                         f"seq_len long, with q's head_dim")
    for name, t in (("sin", sin), ("cos", cos), ("k", k), ("v", v)):
        if t is not None and t.dtype != q.dtype:
            raise ValueError(f"fused_rope: {name} is {t.dtype} and q {q.dtype}: the kernel reads it as q's type")
    for name, t in (("k", k), ("v", v)):
        if t is not None and t.shape[0] < bsz:
            raise ValueError(f"fused_rope: the batch_size of q ({bsz}) must be at most {name}'s ({t.shape[0]})")


def _attend(query, key, value, hidden, scale):
    """softmax(q·kᵀ·scale, hidden → -inf) · v in fp32, GQA by repeating K/V heads; `hidden`: [b|1, h|1, sq, sk]
    bool."""
    bsz, sq, heads, dim = query.shape
    rep = heads // key.shape[2]
    qt = query.astype("float32").transpose([0, 2, 1, 3])  # [b, h, sq, d]
    kt = paddle.repeat_interleave(key.astype("float32"), rep, axis=2).transpose([0, 2, 1, 3])  # [b, h, sk, d]
    vt = paddle.repeat_interleave(value.astype("float32"), rep, axis=2).transpose([0, 2, 1, 3])  # [b, h, sk, d]
    scores = paddle.matmul(qt, kt, transpose_y=True) * (scale or 1.0 / math.sqrt(dim))  # [b, h, sq, sk]
    scores = paddle.where(hidden, paddle.full([1], float("-inf"), "float32"), scores)
    out = paddle.matmul(F.softmax(scores, axis=-1), vt)  # [b, h, sq, d]
    return out.transpose([0, 2, 1, 3]).astype(query.dtype)  # [b, sq, h, d]


def _above_diagonal(sq, sk):
    return (paddle.arange(sk).reshape([1, sk]) > paddle.arange(sq).reshape([sq, 1])).reshape([1, 1, sq, sk])


def ref_sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, training=True, backend=None,
             scale=None, enable_gqa=True, name=None):
    assert dropout_p == 0.0 and backend is None and query.ndim == 4
    sq, sk, heads, kv_heads = query.shape[1], key.shape[1], query.shape[2], key.shape[2]
    assert heads % kv_heads == 0 and (heads == kv_heads or enable_gqa)
    if is_causal:
        assert sq == sk, "the reference covers self-attention"
        hidden = _above_diagonal(sq, sk)
    elif attn_mask is not None:
        assert attn_mask.dtype == paddle.bool, "the reference covers bool masks"
        hidden = paddle.logical_not(attn_mask)
    else:
        hidden = paddle.zeros([1, 1, sq, sk], dtype="bool")
    return _attend(query, key, value, hidden, scale)


def ref_flashmask(query, key, value, startend_row_indices=None, *, dropout=0.0, causal=False, window_size=None,
                  return_softmax_lse=False, return_seed_offset=False, fixed_seed_offset=None, rng_name="",
                  training=True, name=None, softmax_scale=None, block_mask=None, half_only=True):
    assert dropout == 0.0 and window_size is None and block_mask is None and not return_seed_offset
    if half_only and query.dtype not in HALF:
        raise ValueError(f"flashmask_attention: dtype must be float16 or bfloat16, got {query.dtype}")
    bsz, sq, _, _ = query.shape
    sk, kv_heads = key.shape[1], key.shape[2]
    idx = startend_row_indices
    assert causal and idx is not None, "the reference covers causal masks with row indices"
    assert idx.dtype == paddle.int32, f"startend_row_indices must be int32, got {idx.dtype}"
    assert idx.ndim == 4 and idx.shape[0] == bsz and idx.shape[1] in (1, kv_heads) and idx.shape[2] == sk
    assert idx.shape[3] == 1, "the reference covers the lower-triangular start form [..., 1]"
    start = idx[..., 0].astype("int64").unsqueeze(2)  # [b, 1|kv_heads, 1, sk]
    if start.shape[1] == kv_heads and kv_heads > 1:  # a KV head's mask serves its group of query heads
        start = paddle.repeat_interleave(start, query.shape[2] // kv_heads, axis=1)
    rows = paddle.arange(sq, dtype="int64").reshape([1, 1, sq, 1])
    hidden = paddle.logical_or(rows >= start, _above_diagonal(sq, sk))  # [b, h|1, sq, sk]
    out = _attend(query, key, value, hidden, softmax_scale)
    assert not return_softmax_lse, "the GPU branch takes the output only"
    return out


def ref_swiglu(x, y=None, name=None):
    if y is None:
        x, y = paddle.chunk(x, 2, axis=-1)
    return (F.silu(x.astype("float32")) * y.astype("float32")).astype(x.dtype)


def _t(a, dtype="float32"):
    return paddle.to_tensor(np.asarray(a, dtype=np.float32)).astype(dtype)
