"""Fused/flash kernels vs their reference paths; needs a GPU build of Paddle and a GPU (not in CI)."""
import numpy as np
import pytest

from pretrain_cli import runtime

paddle = runtime.import_paddle()

from pretrain_cli.ops import gpu_attention, kernels  # noqa: E402

pytestmark = pytest.mark.gpu
if not paddle.is_compiled_with_cuda():  # pragma: no cover - a collection error, not a silent skip
    raise RuntimeError("tests/gpu needs a GPU build of Paddle and a GPU; scripts/test.sh leaves this directory out")


def _rand(*shape, dtype="float32"):
    return paddle.to_tensor(np.random.default_rng(0).standard_normal(shape).astype("float32")).astype(dtype)


def test_select_on_gpu_uses_fused():
    k = kernels.select(kernels.KernelConfig(attention="flash", rms_norm="fused", rope="fused", swiglu="fused"), "gpu")
    assert k.rms_norm is kernels.rms_norm_fused and k.attention is gpu_attention.attention_sdpa_causal
    assert k.attention_document is gpu_attention.attention_flashmask


@pytest.mark.parametrize("dtype,atol", [("float16", 2e-3), ("bfloat16", 2e-2)])
def test_flash_attention_vs_math(dtype, atol):
    q, k, v = _rand(2, 128, 8, 64, dtype=dtype), _rand(2, 128, 2, 64, dtype=dtype), _rand(2, 128, 2, 64, dtype=dtype)
    got = gpu_attention.attention_sdpa_causal(q, k, v).astype("float32").numpy()
    ref = kernels.attention_math(q.astype("float32"), k.astype("float32"), v.astype("float32")).numpy()
    np.testing.assert_allclose(got, ref, atol=atol)


@pytest.mark.parametrize("dtype,atol", [("float16", 2e-3), ("bfloat16", 2e-2)])
def test_flashmask_document_attention_vs_math(dtype, atol):
    starts = np.zeros((2, 128), np.int64)
    for b, cuts in enumerate(([0, 5, 64, 100], [0, 1, 127])):
        for c in cuts:
            starts[b, c:] = c
    doc_start = paddle.to_tensor(starts)
    q, k, v = _rand(2, 128, 8, 64, dtype=dtype), _rand(2, 128, 2, 64, dtype=dtype), _rand(2, 128, 2, 64, dtype=dtype)
    got = gpu_attention.attention_flashmask(q, k, v, doc_start).astype("float32").numpy()
    ref = kernels.attention_math(q.astype("float32"), k.astype("float32"), v.astype("float32"), doc_start).numpy()
    np.testing.assert_allclose(got, ref, atol=atol)


def test_fused_rope_with_position_ids_vs_reference():
    q, k = _rand(2, 16, 4, 32), _rand(2, 16, 2, 32)
    ang = np.outer(np.arange(16), 1.0 / (10000 ** (np.arange(0, 32, 2) / 32)))
    emb = np.concatenate([ang, ang], -1).astype("float32")
    cos, sin = paddle.to_tensor(np.cos(emb)), paddle.to_tensor(np.sin(emb))
    pos = paddle.to_tensor(np.array([list(range(5)) + list(range(11)), list(range(16))], np.int64))
    for a, b in zip(kernels.rope_fused(q, k, cos, sin, pos), kernels.rope_reference(q, k, cos, sin, pos)):
        np.testing.assert_allclose(a.numpy(), b.numpy(), atol=1e-5)


def test_fused_rms_norm_vs_reference():
    x, w = _rand(2, 16, 64), _rand(64)
    np.testing.assert_allclose(kernels.rms_norm_fused(x, w, 1e-6).numpy(),
                               kernels.rms_norm_reference(x, w, 1e-6).numpy(), atol=1e-5)


def test_fused_rope_vs_reference():
    q, k = _rand(2, 16, 4, 32), _rand(2, 16, 2, 32)
    ang = np.outer(np.arange(16), 1.0 / (10000 ** (np.arange(0, 32, 2) / 32)))
    emb = np.concatenate([ang, ang], -1).astype("float32")
    cos, sin = paddle.to_tensor(np.cos(emb)), paddle.to_tensor(np.sin(emb))
    for a, b in zip(kernels.rope_fused(q, k, cos, sin), kernels.rope_reference(q, k, cos, sin)):
        np.testing.assert_allclose(a.numpy(), b.numpy(), atol=1e-5)


def test_fused_swiglu_vs_reference():
    g, u = _rand(2, 16, 64), _rand(2, 16, 64)
    np.testing.assert_allclose(kernels.swiglu_fused(g, u).numpy(), kernels.swiglu_reference(g, u).numpy(), atol=1e-6)


# ---------------------------------------------------------------- the CPU emulation (tests/gpu_emulation.py) checked
# against the real kernels: where it is wrong, the CPU tests built on it prove nothing
def test_the_emulated_flash_attention_is_the_real_one_top_left_causal_for_unequal_lengths():
    import gpu_emulation as emu

    q, k, v = _rand(1, 96, 4, 64, dtype="bfloat16"), _rand(1, 160, 2, 64, dtype="bfloat16"), \
        _rand(1, 160, 2, 64, dtype="bfloat16")
    for qq, causal in ((q, True), (q, False), (q[:, :64], True)):
        kk, vv = (k, v) if qq.shape[1] == 96 else (k[:, :64], v[:, :64])
        real_out, _, real_lse, _ = paddle._C_ops.flash_attn(qq, kk, vv, None, None, 0.0, causal, False, True, "")
        emu_out, _, emu_lse, _ = emu.ref_flash_attn(qq.cpu(), kk.cpu(), vv.cpu(), None, None, 0.0, causal, False,
                                                    True, "")
        n = qq.shape[1]
        np.testing.assert_allclose(real_out.astype("float32").numpy(), emu_out.astype("float32").numpy(), atol=2e-2)
        np.testing.assert_allclose(real_lse[:, :, :n].numpy(), emu_lse[:, :, :n].numpy(), atol=2e-2)


def test_the_emulated_sdpa_backend_choice_is_the_real_ones():
    """sdpa.py's selection for the cases the CPU tests lean on: one half dtype → flash; q/k fp32 with v half → math."""
    import gpu_emulation as emu
    from paddle.nn.functional import sdpa

    q, k, v = _rand(1, 128, 4, 64, dtype="bfloat16"), _rand(1, 128, 2, 64, dtype="bfloat16"), \
        _rand(1, 128, 2, 64, dtype="bfloat16")
    sdpa.init_config()
    for qq, kk in ((q, k), (q.astype("float32"), k.astype("float32"))):
        params = sdpa.SDPParams(query_shape=qq.shape, key_shape=kk.shape, value_shape=v.shape, attn_mask_shape=None,
                                dropout=0.0, is_causal=True, scale=None, query_stop_gradient=True,
                                dtype=(qq.dtype, kk.dtype, v.dtype), place=(qq.place, kk.place, v.place))
        assert sdpa.select_sdp_for_sdpa(params) == emu.sdpa_backend(qq, kk, v, None, True, None)
