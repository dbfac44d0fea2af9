"""Every reference kernel vs a naive numpy implementation, and the CPU fallback contract."""
import math
import warnings

import numpy as np
import pytest

from pretrain_cli import runtime

paddle = runtime.import_paddle()

from pretrain_cli.ops import gpu_attention, kernels  # noqa: E402
from pretrain_cli.ops.attention import repeat_kv  # noqa: E402


def _np_attention(q, k, v, doc_start=None):
    """Causal attention in float64 with KV head j serving query heads j*rep … (j+1)*rep-1; with `doc_start`
    [b, s], query i also sees only keys from doc_start[b, i] on."""
    b, s, h, d = q.shape
    rep = h // k.shape[2]
    k, v = np.repeat(k, rep, axis=2), np.repeat(v, rep, axis=2)
    scores = np.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(d)
    visible = np.tril(np.ones((s, s), bool))[None]  # [1, s, s]
    if doc_start is not None:
        visible = visible & (np.arange(s)[None, None, :] >= doc_start[:, :, None])  # [b, s, s]
    scores = np.where(visible[:, None], scores, -np.inf)
    p = np.exp(scores - scores.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return np.einsum("bhqk,bkhd->bqhd", p, v)


@pytest.fixture
def qkv():
    rng = np.random.default_rng(0)
    q = rng.standard_normal((2, 16, 4, 8)).astype("float32")
    k = rng.standard_normal((2, 16, 2, 8)).astype("float32")
    v = rng.standard_normal((2, 16, 2, 8)).astype("float32")
    return q, k, v


@pytest.mark.parametrize("fn", [kernels.attention_math, kernels.attention_sdpa_mask,
                                gpu_attention.attention_sdpa_causal])
def test_attention_paths_match_numpy_gqa(fn, qkv):
    q, k, v = qkv
    out = fn(*(paddle.to_tensor(x) for x in qkv)).numpy()
    np.testing.assert_allclose(out, _np_attention(*(x.astype("float64") for x in qkv)), atol=2e-6)


def test_sdpa_gqa_gradients_match_repeated_kv_math(qkv):
    def grads(fn, repeat):
        ts = [paddle.to_tensor(x, stop_gradient=False) for x in qkv]
        q, k, v = ts
        if repeat:
            k, v = repeat_kv(k, 2), repeat_kv(v, 2)
        (fn(q, k, v) * paddle.arange(8, dtype="float32")).sum().backward()
        return [t.grad.numpy() for t in ts]

    for a, b in zip(grads(kernels.attention_sdpa_mask, False), grads(kernels.attention_math, True)):
        np.testing.assert_allclose(a, b, atol=2e-6)


DOC_START = np.array([[0, 0, 0, 3, 3, 3, 3, 3, 8, 9, 9, 9, 9, 9, 9, 9],
                      [0] * 11 + [11] * 5], np.int64)  # documents of 3, 5, 1 and 7 tokens; of 11 and 5


@pytest.mark.parametrize("fn", [kernels.attention_math, kernels.attention_sdpa_mask])
def test_document_masked_paths_match_numpy(fn, qkv):
    out = fn(*(paddle.to_tensor(x) for x in qkv), paddle.to_tensor(DOC_START)).numpy()
    np.testing.assert_allclose(out, _np_attention(*(x.astype("float64") for x in qkv), DOC_START), atol=2e-6)


def test_document_mask_equals_attending_each_document_alone(qkv):
    """The property packing relies on: a document's outputs do not depend on its neighbours in the sample."""
    q, k, v = (paddle.to_tensor(x) for x in qkv)
    packed = kernels.attention_sdpa_mask(q, k, v, paddle.to_tensor(DOC_START)).numpy()
    for lo, hi in ((0, 3), (3, 8), (8, 9), (9, 16)):
        alone = kernels.attention_math(q[:1, lo:hi], k[:1, lo:hi], v[:1, lo:hi]).numpy()
        np.testing.assert_allclose(packed[:1, lo:hi], alone, atol=2e-6)


def test_sdpa_document_gradients_match_math(qkv):
    def grads(fn):
        ts = [paddle.to_tensor(x, stop_gradient=False) for x in qkv]
        (fn(*ts, paddle.to_tensor(DOC_START)) * paddle.arange(8, dtype="float32")).sum().backward()
        return [t.grad.numpy() for t in ts]

    for a, b in zip(grads(kernels.attention_sdpa_mask), grads(kernels.attention_math)):
        np.testing.assert_allclose(a, b, atol=2e-6)


def test_repeat_kv_order_is_consecutive():
    x = paddle.arange(2, dtype="float32").reshape([1, 1, 2, 1])  # kv heads [0, 1]
    assert repeat_kv(x, 3).numpy().ravel().tolist() == [0, 0, 0, 1, 1, 1]


def test_rms_norm_reference_matches_numpy():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 3, 16)).astype("float32") * 3
    w = rng.standard_normal(16).astype("float32")
    out = kernels.rms_norm_reference(paddle.to_tensor(x), paddle.to_tensor(w), 1e-6).numpy()
    x64 = x.astype("float64")
    want = x64 / np.sqrt((x64 ** 2).mean(-1, keepdims=True) + 1e-6) * w
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6)


def test_rope_reference_matches_pairwise_rotation():
    """Rotate-half = rotating each (i, i+d/2) pair by angle pos·inv_freq_i."""
    rng = np.random.default_rng(2)
    s, d = 5, 8
    q = rng.standard_normal((1, s, 2, d)).astype("float32")
    k = rng.standard_normal((1, s, 1, d)).astype("float32")
    inv = 1.0 / (10000 ** (np.arange(0, d, 2) / d))
    ang = np.outer(np.arange(s), inv)  # [s, d/2]
    emb = np.concatenate([ang, ang], -1)
    qo, ko = kernels.rope_reference(paddle.to_tensor(q), paddle.to_tensor(k),
                                    paddle.to_tensor(np.cos(emb).astype("float32")),
                                    paddle.to_tensor(np.sin(emb).astype("float32")))

    def rot(x):
        a, b = x[..., : d // 2], x[..., d // 2:]
        c, sn = np.cos(ang)[None, :, None], np.sin(ang)[None, :, None]
        return np.concatenate([a * c - b * sn, b * c + a * sn], -1)

    np.testing.assert_allclose(qo.numpy(), rot(q), atol=1e-5)
    np.testing.assert_allclose(ko.numpy(), rot(k), atol=1e-5)
    # per-token positions (packed documents restart at 0): token p of the sample uses table row pos[p]
    pos = np.array([[0, 1, 0, 1, 2]], np.int64)
    qp, kp = kernels.rope_reference(paddle.to_tensor(q), paddle.to_tensor(k),
                                    paddle.to_tensor(np.cos(emb).astype("float32")),
                                    paddle.to_tensor(np.sin(emb).astype("float32")), paddle.to_tensor(pos))
    ang = ang[pos[0]]
    np.testing.assert_allclose(qp.numpy(), rot(q), atol=1e-5)
    np.testing.assert_allclose(kp.numpy(), rot(k), atol=1e-5)


def test_swiglu_reference_matches_numpy():
    rng = np.random.default_rng(3)
    g, u = rng.standard_normal((2, 3, 8)).astype("float32"), rng.standard_normal((2, 3, 8)).astype("float32")
    out = kernels.swiglu_reference(paddle.to_tensor(g), paddle.to_tensor(u)).numpy()
    np.testing.assert_allclose(out, g / (1 + np.exp(-g)) * u, rtol=1e-5, atol=1e-6)


def test_paddle_only_cpu_selection_is_silent():
    """`cpu_fused_ops: false` (the fused CPU kernels are tested in test_cpu_ops.py and test_cpu_attention.py)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        k = kernels.select(kernels.KernelConfig(attention="math", cpu_ops=False), "cpu")
    assert k.attention is kernels.attention_sdpa_mask and k.rms_norm is kernels.rms_norm_reference
    # "math" materialises the scores on every device, with or without the fused CPU kernels
    assert kernels.select(kernels.KernelConfig(attention="math"), "cpu").attention is kernels.attention_sdpa_mask


def test_fused_requests_on_cpu_fall_back_with_one_warning():
    cfg = kernels.KernelConfig(attention="flash", rms_norm="fused", rope="fused", swiglu="fused", cpu_ops=False)
    with pytest.warns(RuntimeWarning) as rec:
        k = kernels.select(cfg, "cpu")
    msgs = [str(w.message) for w in rec if str(w.message).startswith("kernels on")]
    assert len(msgs) == 1
    for word in ("memory-light attention", "fused rms_norm", "fused rope", "fused swiglu"):
        assert word in msgs[0]
    assert (k.attention, k.rms_norm, k.rope, k.swiglu) == (
        kernels.attention_sdpa_mask, kernels.rms_norm_reference, kernels.rope_reference, kernels.swiglu_reference)
    assert "fused" not in k.describe()


def test_gpu_device_falls_back_only_without_a_cuda_build():
    if paddle.is_compiled_with_cuda():  # pragma: no cover - GPU builds (tests/gpu covers the fused path)
        assert kernels.select(kernels.KernelConfig(rms_norm="fused"), "gpu:0").rms_norm is kernels.rms_norm_fused
        return
    with pytest.warns(RuntimeWarning):
        k = kernels.select(kernels.KernelConfig(rms_norm="fused", cpu_ops=False), "gpu:0")
    assert k.rms_norm is kernels.rms_norm_reference
    assert kernels.select(kernels.KernelConfig(rms_norm="fused"), "gpu:0").rms_norm is kernels.rms_norm_cpu  # CPU kernel


def test_unknown_kernel_name_raises():
    with pytest.raises(ValueError):
        kernels.select(kernels.KernelConfig(attention="xformers"), "cpu")
