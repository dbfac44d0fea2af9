"""The GPU path through the emulation of tests/gpu_emulation.py: Paddle's GPU calls with their real semantics
(flash attention's top-left causal alignment, the kernels' dtypes, AMP O1's lists and promotion), each written from
Paddle 3.3.1's source. Each test here failed on the code before issue #60 (context-parallel causal tiles, Qwen3's
q/k dtype under O1); its fp16 loss scaling under fleet: tests/unit/test_gpu_loss_scaling.py."""
import functools
from types import SimpleNamespace

import numpy as np
import pytest

import gpu_emulation as emu
from gpu_emulation import paddle

import paddle.incubate.nn.functional as IF  # noqa: E402
import paddle.nn.functional as F  # noqa: E402


def test_the_emulated_amp_lists_are_paddles_own():
    emu.check_amp_lists()


# ---------------------------------------------------------------- flash attention's causal alignment (bug 1)
class _OneRank:
    """cp 1: the ring's exchange hands a block back to its own rank."""

    def start(self, x):
        return SimpleNamespace(wait=lambda: x)


def _qkv(b=1, s=16, nh=4, nkv=2, d=8, seed=0):
    rng = np.random.default_rng(seed)
    return [paddle.to_tensor(rng.standard_normal((b, s, n, d)).astype("float32")) for n in (nh, nkv, nkv)]


def test_flash_causal_mask_is_top_left_for_unequal_lengths(monkeypatch):
    """The emulated kernel masks row i against keys 0..i whatever sk − sq (the fork's flash_fwd_kernel.h)."""
    q, k, v = (t.astype("bfloat16") for t in _qkv(s=6))
    out, _, _, _ = emu.ref_flash_attn(q[:, 4:], k, v, None, None, 0.0, True, False, True, "")
    first, _, _, _ = emu.ref_flash_attn(q[:, 4:5], k[:, :1], v[:, :1], None, None, 0.0, True, False, True, "")
    # query row 0 of the 2-row tile sees key 0 only, as the 1x1 call's row does
    assert float((out[:, :1].astype("float32") - first.astype("float32")).abs().max()) == 0.0
    with pytest.raises(ValueError, match="float16/bfloat16"):
        emu.ref_flash_attn(q.astype("float32"), k.astype("float32"), v.astype("float32"), None, None, 0.0, True,
                           False, True, "")


@pytest.mark.parametrize("tile", [4, 3])
def test_context_parallel_tiles_on_flash_blocks_equal_causal_attention(monkeypatch, tile):
    """Ring attention's diagonal tiles through flash attention (bf16) equal one causal attention over the sequence:
    each query tile must see its own keys, not a bottom-right-aligned slice."""
    from pretrain_cli.distributed.steps.context import context_attention
    from pretrain_cli.ops import gpu_attention
    from pretrain_cli.ops.attention import attention_math

    monkeypatch.setattr(paddle._C_ops, "flash_attn", emu.ref_flash_attn, raising=False)
    q, k, v = _qkv(s=16)
    qb, kb, vb = (t.astype("bfloat16") for t in (q, k, v))
    causal, _ = context_attention(_OneRank(), 1, 0, gpu_attention.block_forward_flash, tile=tile)
    got = causal(qb, kb, vb)
    want = attention_math(*(t.astype("float32") for t in (qb, kb, vb)))
    assert got.dtype == paddle.bfloat16
    assert float((got.astype("float32") - want).abs().max()) < 3e-2


# ---------------------------------------------------------------- Qwen3's q/k dtype under AMP O1 (bug 3)
def _ref_linear(x, weight, bias=None, name=None):
    """`F.linear` under the emulated auto_cast: `linear_v2` is on the white list, so its output is half (computed
    in fp32 here: the CPU has no half matmul, the values are stored half as the GPU's are)."""
    x, weight, bias = emu.amp_cast("linear_v2", x, weight, bias)
    out = paddle.matmul(x.astype("float32"), weight.astype("float32"))
    out = out if bias is None else out + bias.astype("float32")
    return out.astype(x.dtype)


def _ref_fused_rms_norm(x, norm_weight, norm_bias, epsilon, begin_norm_axis=1, **_):
    """`fused_rms_norm` (op `rms_norm`, on neither AMP list: O1 promotes it to fp32 when the weight is fp32)."""
    x, norm_weight = emu.amp_cast("rms_norm", x, norm_weight)
    if norm_weight.dtype != x.dtype:  # the kernel reads the weight as x's type (tests/parity/gpu_references.py)
        raise ValueError(f"fused_rms_norm: norm_weight is {norm_weight.dtype} and x {x.dtype}")
    x32 = x.astype("float32")
    inv = paddle.rsqrt(paddle.mean(x32 * x32, axis=-1, keepdim=True) + epsilon)
    return (x32 * inv * norm_weight.astype("float32")).astype(x.dtype), None, None


BACKENDS: list = []


def _ref_sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, training=True, backend=None,
              scale=None, enable_gqa=True, name=None):
    """`F.scaled_dot_product_attention`: records the backend sdpa.py would pick, then attends in fp32 as asked:
    causal (`is_causal`, which ignores a mask; square, the lengths sdpa.py's flash path takes), under `attn_mask`
    (bool: True attends; else added to the scores), or over every key."""
    BACKENDS.append(emu.sdpa_backend(query, key, value, attn_mask, is_causal, scale))
    import math

    sq, sk, heads, kv_heads = query.shape[1], key.shape[1], query.shape[2], key.shape[2]
    assert dropout_p == 0.0 and heads % kv_heads == 0 and (heads == kv_heads or enable_gqa)
    rep = heads // kv_heads
    q = query.astype("float32").transpose([0, 2, 1, 3])  # [b, h, sq, d]
    k = paddle.repeat_interleave(key.astype("float32"), rep, axis=2).transpose([0, 2, 1, 3])  # [b, h, sk, d]
    v = paddle.repeat_interleave(value.astype("float32"), rep, axis=2).transpose([0, 2, 1, 3])  # [b, h, sk, d]
    scores = paddle.matmul(q, k, transpose_y=True) * (scale or 1.0 / math.sqrt(query.shape[-1]))  # [b, h, sq, sk]
    if is_causal:
        if sq != sk:
            raise NotImplementedError("the stand-in attends causally over equal lengths only")
        scores = scores + paddle.triu(paddle.full([sq, sk], float("-inf"), "float32"), 1)
    elif attn_mask is not None:
        mask = attn_mask if attn_mask.dtype != paddle.bool else paddle.where(
            attn_mask, paddle.zeros([1], "float32"), paddle.full([1], float("-inf"), "float32"))
        scores = scores + mask.astype("float32")
    out = paddle.matmul(F.softmax(scores, axis=-1), v)  # [b, h, sq, d]
    return out.transpose([0, 2, 1, 3]).astype(query.dtype)  # [b, sq, h, d]


def test_the_sdpa_and_rms_norm_stand_ins_do_what_they_are_asked_and_refuse_what_the_kernels_refuse():
    """`_ref_sdpa` attends causally only when asked (a mask hides what it says; none: every key), so a caller that
    drops `is_causal` attends to the future here as on a GPU; `_ref_fused_rms_norm` refuses a weight of another type
    than x outside autocast, as the kernel does."""
    from pretrain_cli.ops.attention import attention_math

    q, k, v = _qkv(s=6)
    causal = _ref_sdpa(q, k, v, is_causal=True)
    np.testing.assert_allclose(causal.numpy(), attention_math(q, k, v).numpy(), atol=1e-5)
    full = _ref_sdpa(q, k, v)
    assert float((full - causal).abs().max()) > 1e-2  # the future keys count
    lower = paddle.to_tensor(np.tril(np.ones((6, 6), bool)).reshape(1, 1, 6, 6))
    np.testing.assert_allclose(_ref_sdpa(q, k, v, attn_mask=lower).numpy(), causal.numpy(), atol=1e-5)
    np.testing.assert_allclose(_ref_sdpa(q, k, v, attn_mask=lower, is_causal=True).numpy(), causal.numpy(), atol=1e-5)
    x = paddle.randn([2, 6, 8]).astype("bfloat16")
    _ref_fused_rms_norm(x, paddle.ones([8]).astype("bfloat16"), None, 1e-6, 2)
    with pytest.raises(ValueError, match="norm_weight is paddle.float32"):
        _ref_fused_rms_norm(x, paddle.ones([8]), None, 1e-6, 2)  # (no autocast: nothing promotes x)


def _ref_flashmask(query, key, value, startend_row_indices=None, *, causal=False, **_):
    """`flashmask_attention` (not on AMP's white list: gray, promoted to fp32 by an fp32 input), fp16/bf16 only."""
    query, key, value = emu.amp_cast("flashmask_attention", query, key, value)
    emu.half_only("flashmask_attention", query, key, value)
    return paddle.zeros(query.shape, dtype=query.dtype)


def _qwen3_attention(monkeypatch, level="O1"):
    from pretrain_cli.models.config import ModelConfig
    from pretrain_cli.models.layers import Attention
    from pretrain_cli.ops import gpu_attention, kernels

    monkeypatch.setattr(F, "linear", _ref_linear)
    monkeypatch.setattr(IF, "fused_rms_norm", _ref_fused_rms_norm)
    monkeypatch.setattr(F, "scaled_dot_product_attention", _ref_sdpa)
    monkeypatch.setattr(F, "flashmask_attention", _ref_flashmask)
    monkeypatch.setattr(emu.Amp, "level", level)
    BACKENDS.clear()
    cfg = ModelConfig(model_type="qwen3", hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=8)
    ks = kernels.Kernels(attention=gpu_attention.attention_sdpa_causal,
                         attention_document=gpu_attention.attention_flashmask, rms_norm=kernels.rms_norm_fused,
                         rope=kernels.rope_reference)
    paddle.seed(0)
    layer = Attention(cfg, ks, qkv_bias=False, o_bias=False, qk_norm=True)
    x = paddle.randn([1, 8, 32])
    ang = np.outer(np.arange(8), 1.0 / 10000 ** (np.arange(0, 8, 2) / 8))
    cos = paddle.to_tensor(np.cos(np.concatenate([ang, ang], -1)).astype("float32"))
    sin = paddle.to_tensor(np.sin(np.concatenate([ang, ang], -1)).astype("float32"))
    return layer, x, cos, sin


def test_qwen3_under_o1_reaches_flash_attention_with_one_half_dtype(monkeypatch):
    """O1 keeps the q/k norm weights fp32, so the normed q and k come out fp32 while v is half: sdpa.py then
    refuses flash (and memory-efficient) attention and materialises the scores."""
    layer, x, cos, sin = _qwen3_attention(monkeypatch)
    out = layer(x, cos, sin)
    assert BACKENDS == ["flash_attn"], BACKENDS
    assert out.dtype == paddle.bfloat16


def test_qwen3_under_o1_packed_documents_reach_flashmask_in_half(monkeypatch):
    layer, x, cos, sin = _qwen3_attention(monkeypatch)
    doc_start = paddle.to_tensor(np.array([[0, 0, 0, 3, 3, 3, 3, 7]], np.int64))
    out = layer(x, cos, sin, doc_start=doc_start)  # the flashmask stand-in raises on fp32 inputs
    assert out.dtype == paddle.bfloat16


def test_qwen3_under_o1_ring_attention_blocks_run_flash_attention(monkeypatch):
    """Context parallelism's blocks: flash attention only for one half dtype (else the materialising block)."""
    from pretrain_cli.ops import gpu_attention

    calls = []
    monkeypatch.setattr(paddle._C_ops, "flash_attn", lambda *a: calls.append(a[0].dtype) or emu.ref_flash_attn(*a),
                        raising=False)
    q, k, v = _qkv(s=8)
    heads = functools.partial(lambda x, n: x.transpose([0, 2, 1, 3]).reshape([1, 2, n, 8, 8]))
    qh, kh, vh = heads(q, 2), heads(k, 1), heads(v, 1).astype("bfloat16")  # q/k fp32 (O1's norms), v half
    out, lse = gpu_attention.block_forward_flash(qh, kh, vh, None, False)
    assert calls == [paddle.bfloat16] and out.dtype == paddle.bfloat16 and lse.dtype == paddle.float32


@pytest.mark.parametrize("documents", [False, True])
def test_ring_attention_tiles_give_one_attentions_output_and_gradients(documents):
    """The tiling itself (fp32, the reference blocks): tiles of 3 rows over chunks of 8, causal or document-masked,
    forward and backward equal one attention over the sequence (the diagonal's two pieces padded back in dK/dV)."""
    from pretrain_cli.distributed.steps.context import context_attention
    from pretrain_cli.ops.attention import attention_math
    from pretrain_cli.ops.block_attention import block_forward

    q, k, v = _qkv(s=16, b=2)
    for t in (q, k, v):
        t.stop_gradient = False
    doc = paddle.to_tensor(np.array([[0] * 5 + [5] * 7 + [12] * 4, [0] * 16], np.int64)) if documents else None
    causal, document = context_attention(_OneRank(), 1, 0, block_forward, tile=3)
    got = document(q, k, v, doc) if documents else causal(q, k, v)
    dout = paddle.to_tensor(np.random.default_rng(2).standard_normal(got.shape).astype("float32"))
    grads = paddle.grad([(got * dout).sum()], [q, k, v])
    want = attention_math(q, k, v, doc) if documents else attention_math(q, k, v)
    want_grads = paddle.grad([(want * dout).sum()], [q, k, v])
    assert float((got - want).abs().max()) < 1e-5
    for g, w in zip(grads, want_grads):
        assert float((g - w).abs().max()) < 1e-4


# ---------------------------------------------------------------- capability from the driver (plan and train)
def test_capability_comes_from_the_driver_and_one_rule_serves_plan_and_train(monkeypatch):
    """A card missing from the hardware table is judged by `get_device_capability()`: pre-Ampere → the math path;
    a bf16 request refused in one line naming the key and the two choices; `plan` of a table V100 applies the same
    rule (the table's 7.0) and warns, as `plan --fit` then moves the file to fp16."""
    from run_helpers import BASE, model_config

    from pretrain_cli import runtime
    from pretrain_cli.config.parser import parse_config
    from pretrain_cli.config.resolve import resolve
    from pretrain_cli.errors import UserError
    from pretrain_cli.orchestration import targets
    from pretrain_cli.planning import hardware
    from pretrain_cli.run_config import Target

    monkeypatch.setattr(runtime, "gpu_build_installed", lambda: True)
    monkeypatch.setattr(runtime, "gpu_name", lambda: "NVIDIA GeForce RTX 2080 Ti")  # Turing, 7.5: not in the table
    monkeypatch.setattr(runtime, "gpu_capability", lambda: (7, 5))
    target = targets.launcher_target()
    assert target.gpu_capability == (7, 5) and hardware.lookup(target.gpu_name) is None
    fp16 = parse_config(None, [*BASE, "--use_flash_attention", "true", "--fp16", "--device", "gpu"])
    run = resolve(fp16, model_config(), target)
    assert run.kernels.attention == "math" and any("predates Ampere" in n for n in run.notes)
    bf16 = parse_config(None, [*BASE, "--use_flash_attention", "true", "--bf16", "--device", "gpu"])
    with pytest.raises(UserError) as e:
        resolve(bf16, model_config(), target)
    line = str(e.value)
    assert line.count("\n") == 0 and line.startswith("bf16: NVIDIA GeForce RTX 2080 Ti has no bf16")
    assert "--fp16 true" in line and "fp32" in line  # (typed: the fix in command-line words)
    planned = resolve(bf16, model_config(), Target("gpu", 1, 0, 0, "V100-32GB", planned=True))
    assert any(n.startswith("bf16: WARNING: V100-32GB has no bf16") for n in planned.notes)
    # an Ampere card the table does not know: its driver capability gives it flash attention and bf16
    monkeypatch.setattr(runtime, "gpu_capability", lambda: (8, 6))
    assert resolve(bf16, model_config(), targets.launcher_target()).kernels.attention == "flash"
    assert hardware.pre_ampere(hardware.capability("T4")) and not hardware.pre_ampere(hardware.capability("H100"))


# ---------------------------------------------------------------- sdpa's backend choice (review of 5cc91543)
@pytest.mark.parametrize("capability", [(8, 0), (8, 6), (9, 0)])
def test_the_emulated_sdpa_backend_is_paddles_own_choice_at_every_width(monkeypatch, capability):
    """`emu.sdpa_backend` against sdpa.py 3.3.1's own `select_sdp_for_sdpa`, its device probes answered as a GPU of
    `capability` with flash and memory-efficient kernels built (bf16 among flash's dtypes, as on Ampere): the
    emulator said mem_efficient for half precision at width 12, where sdpa's `minimum_gemm_alignment` (8 for half)
    sends it to math; over 256 (a multiple of 8) sdpa runs mem_efficient, which holds no scores."""
    import paddle.nn.functional.sdpa as S

    S.init_config()
    monkeypatch.setitem(S._config["flash_attn"], "support_dtypes", emu.HALF)
    monkeypatch.setitem(S._config["mem_efficient_attn"], "support_dtypes", (*emu.HALF, paddle.float32))
    monkeypatch.setattr(S, "check_all_tensors_on_device", lambda params: True)
    monkeypatch.setattr(S, "get_device_capability", lambda device_id: capability)
    monkeypatch.setattr(S, "check_flash_attention_hardware_support", lambda device_id: (8, 0) <= capability <= (12, 1))
    monkeypatch.setattr(S, "check_mem_efficient_hardware_support", lambda device_id: (5, 0) <= capability <= (12, 1))
    monkeypatch.setattr(S, "_get_enabled_backends", lambda: [S.SDPBackend.MATH, S.SDPBackend.FLASH_ATTENTION,
                                                              S.SDPBackend.EFFICIENT_ATTENTION])
    S.use_tensor_cores.cache_clear()
    S.minimum_gemm_alignment.cache_clear()
    seen = {}
    try:
        for dtype in (paddle.float16, paddle.bfloat16, paddle.float32):
            for width in (12, 20, 36, 192, 200, 256, 260, 264, 320):
                q = paddle.zeros([1, 4, 2, width]).astype(dtype)
                params = S.SDPParams(q.shape, q.shape, q.shape, None, 0.0, True, None, False, (dtype,) * 3,
                                     (q.place,) * 3)
                seen[(str(dtype), width)] = want = S.select_sdp_for_sdpa(params)
                assert emu.sdpa_backend(q, q, q, None, True, None, capability) == want, (dtype, width, want)
    finally:
        S.use_tensor_cores.cache_clear()
        S.minimum_gemm_alignment.cache_clear()
    half = {w: seen[("paddle.float16", w)] for w in (12, 20, 192, 200, 256, 264, 320)}
    assert half == {12: "math", 20: "math", 192: "flash_attn", 200: "flash_attn", 256: "flash_attn",
                    264: "mem_efficient", 320: "mem_efficient"}  # the reviewer's probe (R2), on every capability
