"""The references of Paddle's fused GPU ops (gpu_references.py) against numpy on random inputs, and, where
Paddle's CPU wheel runs the real op (`scaled_dot_product_attention` in fp32, `swiglu`), against the real op; the
flashmask reference keeps the real op's fp16/bf16 and int32 rules. test_gpu_branch.py runs the GPU branch of
`ops.kernels` with them behind it."""
import math

import numpy as np
import pytest

from pretrain_cli import runtime

paddle = runtime.import_paddle()

import paddle.nn.functional as F  # noqa: E402

from gpu_references import _t, ref_flashmask, ref_fused_rms_norm, ref_fused_rope, ref_sdpa, ref_swiglu  # noqa: E402

rng = np.random.default_rng(0)


def _np(t):
    return t.astype("float32").numpy()


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
