"""The GPU kernel branch of `ops.kernels`, executed on CPU: reference implementations stand behind the exact
Paddle entry points it calls, the kernel selection a GPU run makes is forced, and the model must match HF.

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

Each reference is checked against numpy on random inputs (and, where Paddle's CPU wheel runs the real op —
`scaled_dot_product_attention` in fp32, `swiglu` — against the real op), then the model built with the GPU
selection (flash attention, flashmask for packed documents, fused RMSNorm/RoPE/SwiGLU, the chunked fused head +
loss) is compared with HF transformers at the tolerances of tests/parity/test_hf_parity.py. The real-kernel
tests stay in tests/gpu for GPU machines.
"""
import dataclasses
import functools
import math
from collections import Counter

import numpy as np
import pytest

from pretrain_cli import runtime

paddle = runtime.import_paddle()

import paddle.incubate.nn.functional as IF  # noqa: E402
import paddle.nn.functional as F  # noqa: E402
import torch  # noqa: E402

from pretrain_cli.data.samples import document_fields  # noqa: E402
from pretrain_cli.models import convert  # noqa: E402
from pretrain_cli.ops import cpu_ops, kernels, linear_loss  # noqa: E402
from pretrain_cli.ops.loss import IGNORE_INDEX  # noqa: E402
from parity_helpers import hf_loss_backward, load  # noqa: E402
from test_hf_document_parity import DOCS, SEQ, _hf, _pieces  # noqa: E402
from test_hf_parity import CASES, _hf_model, _ids  # noqa: E402

HALF = (paddle.float16, paddle.bfloat16)
rng = np.random.default_rng(0)


# ---------------------------------------------------------------- references, from Paddle's documentation
def ref_fused_rms_norm(x, norm_weight, norm_bias, epsilon, begin_norm_axis=1, bias=None, residual=None,
                       quant_scale=-1, quant_round_type=0, quant_max_bound=0, quant_min_bound=0):
    assert quant_scale <= 0, "the reference covers the unquantised op"
    axis = begin_norm_axis + x.ndim if begin_norm_axis < 0 else begin_norm_axis
    assert 0 <= axis < x.ndim and list(norm_weight.shape) == [int(np.prod(x.shape[axis:]))]
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

    def table(t):  # [seq, head_dim] or [1, seq, 1, head_dim] -> fp32 [seq, head_dim]
        assert t.ndim == 2 or (t.ndim == 4 and t.shape[0] == 1 and t.shape[2] == 1), t.shape
        return t.reshape([t.shape[-3] if t.ndim == 4 else t.shape[0], t.shape[-1]]).astype("float32")

    c, s = table(cos), table(sin)

    def rows(tab, x):  # each token's row: [1 or batch, seq, 1, head_dim]
        bsz, seq = x.shape[0], x.shape[1]
        if position_ids is None:
            return tab[:seq].reshape([1, seq, 1, -1])
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


# ---------------------------------------------------------------- the references against numpy
def _np(t):
    return t.astype("float32").numpy()


def _t(a, dtype="float32"):
    return paddle.to_tensor(np.asarray(a, dtype=np.float32)).astype(dtype)


def _attention_np(q, k, v, visible):
    """q [b, sq, h, d], k/v [b, sk, kv, d], visible [b, sq, sk] bool → [b, sq, h, d]."""
    rep = q.shape[2] // k.shape[2]
    k, v = np.repeat(k, rep, axis=2), np.repeat(v, rep, axis=2)
    s = np.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(q.shape[-1])
    s = np.where(visible[:, None], s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    return np.einsum("bhqk,bkhd->bqhd", p / p.sum(-1, keepdims=True), v)


@pytest.mark.parametrize("dtype,atol", [("float32", 1e-5), ("bfloat16", 3e-2)])
def test_fused_rms_norm_reference(dtype, atol):
    x, w, res = rng.standard_normal((2, 5, 16)), rng.standard_normal(16), rng.standard_normal((2, 5, 16))
    out, residual_out, inv_var = ref_fused_rms_norm(_t(x, dtype), _t(w, dtype), None, 1e-6, 2, residual=_t(res, dtype))
    h = (x + res).astype(np.float32)
    want = h / np.sqrt((h * h).mean(-1, keepdims=True) + 1e-6) * w
    assert out.dtype == paddle.to_tensor(0.0).astype(dtype).dtype and list(inv_var.shape) == [2, 5]
    np.testing.assert_allclose(_np(out), want, atol=atol * 4, rtol=atol)
    np.testing.assert_allclose(_np(residual_out), h, atol=atol * 4)


@pytest.mark.parametrize("neox", [False, True])
def test_fused_rope_reference(neox):
    q, k = rng.standard_normal((2, 6, 4, 8)), rng.standard_normal((2, 6, 2, 8))
    ang = np.outer(np.arange(6), 1.0 / 10000 ** (np.arange(0, 8, 2) / 8))
    emb = np.concatenate([ang, ang], -1) if not neox else np.repeat(ang, 2, axis=-1)  # each style's table layout
    pos = np.array([[0, 1, 2, 0, 1, 2], [0, 1, 2, 3, 4, 5]])

    def rope_np(x):
        c, s = np.cos(emb)[pos][:, :, None], np.sin(emb)[pos][:, :, None]
        if neox:
            rot = np.stack([-x[..., 1::2], x[..., 0::2]], -1).reshape(x.shape)
        else:
            rot = np.concatenate([-x[..., 4:], x[..., :4]], -1)
        return x * c + rot * s

    for shape in ([6, 8], [1, 6, 1, 8]):  # both documented table shapes
        cos, sin = _t(np.cos(emb)).reshape(shape), _t(np.sin(emb)).reshape(shape)
        out_q, out_k, out_v = ref_fused_rope(_t(q), _t(k), None, sin=sin, cos=cos,
                                             position_ids=paddle.to_tensor(pos), use_neox_rotary_style=neox)
        assert out_v is None
        np.testing.assert_allclose(out_q.numpy(), rope_np(q), atol=1e-5)
        np.testing.assert_allclose(out_k.numpy(), rope_np(k), atol=1e-5)


def test_sdpa_reference_matches_numpy_and_paddles_own_cpu_op():
    q, k, v = rng.standard_normal((2, 7, 4, 8)), rng.standard_normal((2, 7, 2, 8)), rng.standard_normal((2, 7, 2, 8))
    causal = np.broadcast_to(np.tril(np.ones((7, 7), bool)), (2, 7, 7))
    got = ref_sdpa(_t(q), _t(k), _t(v), is_causal=True).numpy()
    np.testing.assert_allclose(got, _attention_np(q, k, v, causal), atol=1e-5)
    rep = lambda a: _t(np.repeat(a, 2, axis=2))  # noqa: E731 (Paddle's CPU math path, on MHA inputs)
    np.testing.assert_allclose(got, F.scaled_dot_product_attention(_t(q), rep(k), rep(v), is_causal=True).numpy(),
                               atol=1e-5)


def test_flashmask_reference_hides_columns_below_their_start_row():
    q, k, v = rng.standard_normal((2, 9, 4, 8)), rng.standard_normal((2, 9, 2, 8)), rng.standard_normal((2, 9, 2, 8))
    ends = np.array([[3, 3, 3, 7, 7, 7, 7, 9, 9], [9] * 9], np.int32)  # row 0: documents [0,3) [3,7) [7,9)
    visible = np.tril(np.ones((9, 9), bool))[None] & (np.arange(9)[None, :, None] < ends[:, None, :])
    idx = paddle.to_tensor(ends.reshape(2, 1, 9, 1))
    got = ref_flashmask(_t(q, "bfloat16"), _t(k, "bfloat16"), _t(v, "bfloat16"), idx, causal=True)
    assert got.dtype == paddle.bfloat16
    np.testing.assert_allclose(_np(got), _attention_np(q, k, v, visible), atol=3e-2)
    with pytest.raises(ValueError, match="float16 or bfloat16"):
        ref_flashmask(_t(q), _t(k), _t(v), idx, causal=True)
    with pytest.raises(AssertionError, match="int32"):
        ref_flashmask(_t(q, "bfloat16"), _t(k, "bfloat16"), _t(v, "bfloat16"), idx.astype("int64"), causal=True)


def test_swiglu_reference_matches_numpy_and_paddles_own_op():
    g, u = rng.standard_normal((3, 8)), rng.standard_normal((3, 8))
    want = g / (1 + np.exp(-g)) * u
    np.testing.assert_allclose(ref_swiglu(_t(g), _t(u)).numpy(), want, atol=1e-6)
    packed = _t(np.concatenate([g, u], -1))
    np.testing.assert_allclose(ref_swiglu(packed).numpy(), want, atol=1e-6)
    np.testing.assert_allclose(F.swiglu(packed).numpy(), want, atol=1e-6)  # the real op runs on CPU


# ---------------------------------------------------------------- the GPU branch with the references behind it
def _gpu_run(name: str):
    """PaddleNLP's argument file resolved for 8 GPUs as `train` resolves it (the model swapped for a tiny one)."""
    from pathlib import Path

    from pretrain_cli.orchestration.opened import build_model_config
    from pretrain_cli.orchestration.prepare import load_arguments
    from pretrain_cli.config.resolve import resolve
    from pretrain_cli.run_config import Target

    path = Path(__file__).resolve().parents[1] / "e2e" / "paddlenlp_configs" / name
    args = load_arguments(str(path), ["--model_name_or_path", "micro-llama", "--continue_training", "0"])
    return resolve(args, build_model_config(args)[1], Target(device="gpu", world_size=8))


@pytest.fixture
def gpu_branch(monkeypatch):
    """(the Kernels a GPU run selects, calls per entry point): the references installed under Paddle's names,
    the device probe answering "a GPU build on a GPU" for gpu devices, small fused-loss chunks, and the kernel
    request `config.resolve` makes of PaddleNLP's own files for 8 GPUs."""
    calls = Counter()

    def counted(name, fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            calls[name] += 1
            return fn(*args, **kwargs)
        return wrapper

    monkeypatch.setattr(IF, "fused_rms_norm", counted("fused_rms_norm", ref_fused_rms_norm))
    monkeypatch.setattr(IF, "fused_rotary_position_embedding", counted("fused_rope", ref_fused_rope))
    monkeypatch.setattr(IF, "swiglu", counted("swiglu", ref_swiglu))
    monkeypatch.setattr(F, "swiglu", counted("swiglu", ref_swiglu))
    monkeypatch.setattr(F, "scaled_dot_product_attention", counted("sdpa", ref_sdpa))
    # fp32 here, so HF can be matched at fp32 tolerances (the op-level test above holds the fp16/bf16 rule)
    monkeypatch.setattr(F, "flashmask_attention", counted("flashmask", functools.partial(ref_flashmask,
                                                                                          half_only=False)))
    monkeypatch.setattr(kernels, "_gpu_available", lambda device: str(device).lower().startswith(("gpu", "cuda")))
    monkeypatch.setattr(linear_loss, "CHUNK_ELEMENTS", {"cpu": 16 * 251, "gpu": 16 * 251})  # 16-row chunks
    # a GPU run's tensors are not on the CPU, so the fused loss's backward scales in place with Paddle's ops
    # instead of the CPU kernel library: make that library absent so the same branch runs here
    monkeypatch.setattr(cpu_ops, "load", lambda: None)
    llama, qwen = _gpu_run("llama_pretrain_argument.json"), _gpu_run("qwen_pretrain_argument.json")
    # PaddleNLP's llama file on 8 GPUs asks for every fused kernel; its tp 2 leaves the fused head + loss off, which
    # the qwen file (tp 1) resolves on: the union is the whole GPU branch
    request = dataclasses.replace(llama.kernels, fused_loss=qwen.kernels.fused_loss)
    assert (request.attention, request.rms_norm, request.rope, request.swiglu, request.fused_loss) == (
        "flash", "fused", "fused", "fused", True) and llama.device == "gpu"
    selected = kernels.select(request, llama.device)
    assert (selected.attention, selected.attention_document, selected.rms_norm, selected.rope, selected.swiglu,
            selected.linear_cross_entropy) == (kernels.attention_sdpa_causal, kernels.attention_flashmask,
                                               kernels.rms_norm_fused, kernels.rope_fused, kernels.swiglu_fused,
                                               linear_loss.linear_cross_entropy_chunked)
    return selected, calls


def test_gpu_branch_ops_equal_the_reference_paths(gpu_branch):
    """Each GPU-branch function of ops.kernels against the CPU reference path it replaces."""
    x, w = _t(rng.standard_normal((2, 6, 16))), _t(rng.standard_normal(16))
    np.testing.assert_allclose(kernels.rms_norm_fused(x, w, 1e-6).numpy(),
                               kernels.rms_norm_reference(x, w, 1e-6).numpy(), atol=1e-5)
    q, k, v = _t(rng.standard_normal((2, 9, 4, 8))), _t(rng.standard_normal((2, 9, 2, 8))), \
        _t(rng.standard_normal((2, 9, 2, 8)))
    ang = np.outer(np.arange(9), 1.0 / 10000 ** (np.arange(0, 8, 2) / 8))
    cos, sin = _t(np.cos(np.concatenate([ang, ang], -1))), _t(np.sin(np.concatenate([ang, ang], -1)))
    pos = paddle.to_tensor(np.array([[0, 1, 2, 0, 1, 2, 3, 0, 1], list(range(9))], np.int64))
    for p in (None, pos):
        for a, b in zip(kernels.rope_fused(q, k, cos, sin, p), kernels.rope_reference(q, k, cos, sin, p)):
            np.testing.assert_allclose(a.numpy(), b.numpy(), atol=1e-5)
    np.testing.assert_allclose(kernels.attention_sdpa_causal(q, k, v).numpy(),
                               kernels.attention_math(q, k, v).numpy(), atol=1e-5)
    doc_start = paddle.to_tensor(np.array([[0, 0, 0, 3, 3, 3, 3, 7, 7], [0] * 9], np.int64))
    np.testing.assert_allclose(kernels.attention_flashmask(q, k, v, doc_start).numpy(),
                               kernels.attention_math(q, k, v, doc_start).numpy(), atol=1e-5)
    g, u = _t(rng.standard_normal((3, 8))), _t(rng.standard_normal((3, 8)))
    np.testing.assert_allclose(kernels.swiglu_fused(g, u).numpy(), kernels.swiglu_reference(g, u).numpy(), atol=1e-6)
    assert set(gpu_branch[1]) == {"fused_rms_norm", "fused_rope", "sdpa", "flashmask", "swiglu"}


def test_a_wrong_tuple_index_or_layout_in_the_branch_is_caught(gpu_branch):
    """The mistakes the name/keyword scan of tests/unit/test_gpu_api.py cannot see now fail here."""
    x, w = _t(rng.standard_normal((2, 6, 16))), _t(rng.standard_normal(16))
    wrong_index = IF.fused_rms_norm(x, w, None, 1e-6, 2)[1]
    assert not np.allclose(wrong_index.numpy(), kernels.rms_norm_reference(x, w, 1e-6).numpy(), atol=0.1)
    q, k = _t(rng.standard_normal((1, 5, 2, 8))), _t(rng.standard_normal((1, 5, 2, 8)))
    ang = np.outer(np.arange(5), 1.0 / 10000 ** (np.arange(0, 8, 2) / 8))
    cos, sin = _t(np.cos(np.concatenate([ang, ang], -1))), _t(np.sin(np.concatenate([ang, ang], -1)))
    neox = IF.fused_rotary_position_embedding(q, k, None, sin=sin.reshape([1, 5, 1, 8]), cos=cos.reshape([1, 5, 1, 8]),
                                              use_neox_rotary_style=True)[0]
    assert not np.allclose(neox.numpy(), kernels.rope_reference(q, k, cos, sin)[0].numpy(), atol=0.1)
    transposed = kernels.attention_sdpa_causal(q.transpose([0, 2, 1, 3]), k.transpose([0, 2, 1, 3]),
                                               k.transpose([0, 2, 1, 3])).transpose([0, 2, 1, 3])
    assert not np.allclose(transposed.numpy(), kernels.attention_math(q, k, k).numpy(), atol=0.1)
    doc_start = paddle.to_tensor(np.array([[0, 0, 2, 2, 2]], np.int64))
    cols = paddle.arange(5, dtype="int64").unsqueeze(0)
    off_by_one = paddle.searchsorted(doc_start, cols, right=False, out_int32=True).reshape([1, 1, 5, 1])
    got = F.flashmask_attention(q, k, k, off_by_one, causal=True)
    assert not np.allclose(got.numpy(), kernels.attention_math(q, k, k, doc_start).numpy(), atol=0.1)


CAUSAL = {"llama": "llama-untied-llama3rope", "qwen2": "qwen2-tied", "qwen3": "qwen3-untied-bias"}


@pytest.mark.parametrize("family", list(CAUSAL))
def test_gpu_selection_matches_hf_logits_loss_and_grads(family, gpu_branch, tmp_path):
    """Causal: logits from the forward, loss and every gradient through the chunked fused head + loss."""
    selected, calls = gpu_branch
    if family == "qwen2":  # the unpacked MLP: gate and up through the two-argument swiglu
        selected = dataclasses.replace(selected, pack_mlp=False)
    model_type, kw = CASES[CAUSAL[family]]
    hf = _hf_model(model_type, kw)
    hf.save_pretrained(str(tmp_path), safe_serialization=True)
    ours, _ = load(tmp_path, selected)
    ids = _ids()
    inp = paddle.to_tensor(ids)
    logits = ours(inp[:, :-1]).numpy()
    total, count = ours(inp[:, :-1], labels=inp[:, 1:])
    loss = total / count
    loss.backward()
    h_logits, h_loss, _, h_params = hf_loss_backward(hf, ids)
    assert np.abs(logits - h_logits).max() <= 1e-4
    assert abs(float(loss) - h_loss) <= 1e-5
    for name, p in ours.named_parameters():
        g = p.grad.numpy()
        g = g.T if g.ndim == 2 and "embed" not in name else g
        np.testing.assert_allclose(g, h_params[name].grad.numpy(), atol=1e-4, err_msg=name)
    n_norms = 2 * 2 + 1 + (2 * 2 if family == "qwen3" else 0)  # per layer 2 (+ q/k norms), the final norm
    assert calls["fused_rms_norm"] == 2 * n_norms and calls["sdpa"] == 4 and calls["fused_rope"] == 4
    assert calls["swiglu"] == 4 and calls["flashmask"] == 0  # two forwards x two layers


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3"])
def test_gpu_selection_with_packed_documents_matches_hf_per_document(family, gpu_branch, tmp_path):
    """Document-masked: flashmask + fused RoPE with restarting positions give every token HF's logits on its own
    document, and the fused head's loss HF's per-document losses and gradients."""
    selected, calls = gpu_branch
    hf = _hf(family, tmp_path)
    ours, _ = load(tmp_path, selected)
    ids = np.random.default_rng(1).integers(3, 251, (2, SEQ + 1)).astype("int64")
    fields = [document_fields(np.cumsum([0] + d[:-1]), SEQ, True) for d in DOCS]
    extra = {k: paddle.to_tensor(np.stack([f[k] for f in fields])) for k in fields[0]}
    labels = ids[:, 1:].copy()
    for row in range(2):
        for a, e, end in _pieces(row):
            if end <= SEQ:
                labels[row, end - 1] = IGNORE_INDEX
    logits = ours(paddle.to_tensor(ids[:, :-1]), **extra).numpy()
    total, count = ours(paddle.to_tensor(ids[:, :-1]), labels=paddle.to_tensor(labels), **extra)
    loss = total / count
    loss.backward()
    hf_sum, n_hf = 0.0, 0
    for row in range(2):
        for a, e, end in _pieces(row):
            out = hf(input_ids=torch.from_numpy(ids[row:row + 1, a:e]),
                     position_ids=torch.arange(e - a).unsqueeze(0)).logits  # [1, e-a, vocab]
            assert np.abs(logits[row, a:e] - out.detach().numpy()[0]).max() <= 1e-4, (row, a)
            n = min(e, end - 1) - a
            target = torch.from_numpy(ids[row, a + 1:a + 1 + n])
            hf_sum, n_hf = hf_sum + torch.nn.functional.cross_entropy(out[0, :n], target, reduction="sum"), n_hf + n
    assert n_hf == int(float(count))
    hf_loss = hf_sum / n_hf
    hf_loss.backward()
    assert abs(float(loss) - float(hf_loss.detach())) <= 1e-5
    hf_params = dict(hf.named_parameters())
    for name, p in ours.named_parameters():
        g = p.grad.numpy()
        g = g.T if g.ndim == 2 and "embed" not in name else g
        np.testing.assert_allclose(g, hf_params[name].grad.numpy(), atol=1e-4, err_msg=name)
    assert calls["flashmask"] == 4 and calls["sdpa"] == 0 and calls["fused_rope"] == 4
