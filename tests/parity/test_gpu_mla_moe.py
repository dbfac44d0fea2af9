"""The GPU branch of the Mixture-of-Experts and DeepSeek-V3 models, executed on CPU: multi-head latent attention
(its value heads zero-padded to the query width, its RoPE part through the fused RoPE with one key head), the latent
norms through the fused RMSNorm, the routed experts through the grouped GEMM, the sigmoid group-limited router, the
multi-token prediction layer. Paddle's GPU-only calls stand behind references of their contracts
(tests/parity/gpu_references.py, tests/gpu_emulation.py `RefBatchedGemm`): `flashmask_attention` refusing what the
flash-attn library refuses (PaddlePaddle/flash-attention csrc/flash_attn/flash_attn.cu, `CHECK_FWD_EXECTUABLE`:
q, k, v of one head width, a multiple of 8 up to 256), sdpa recording the backend sdpa.py would pick
(`gpu_emulation.sdpa_backend`); the loss and every gradient must equal the CPU reference path's on the same weights.

A head width flash-attn refuses (the parity micro MLA's 12: qk 8 + 4, v 6) stopped a document-masked GPU run in
`flashmask_attention`, and a width above 192 stopped the first backward on a GPU other than compute capability
8.0 / 9.0 (`CHECK_BWD_EXECTUABLE`), where Paddle's sdpa picks flash-attn all the same: both failed here on the code
before `ops.gpu_attention.gpu_path`'s fallbacks. A forward alone (eval, generate, the context-parallel ring) runs
flash-attn there, and over 256 the causal path runs sdpa's memory-efficient kernel (`ops.flash_width.path`).
"""
import dataclasses
import functools
import json
import warnings
from collections import Counter

import numpy as np
import pytest

import gpu_emulation as emu
from gpu_emulation import paddle

import paddle.incubate.nn.functional as IF  # noqa: E402
import paddle.nn.functional as F  # noqa: E402

from gpu_references import ref_flashmask, ref_fused_rms_norm, ref_fused_rope, ref_sdpa, ref_swiglu  # noqa: E402
from pretrain_cli import runtime  # noqa: E402
from pretrain_cli.config.presets import PRESET_DIR  # noqa: E402
from pretrain_cli.data.samples import document_fields  # noqa: E402
from pretrain_cli.models import build_model  # noqa: E402
from pretrain_cli.models.config import ModelConfig  # noqa: E402
from pretrain_cli.ops import cpu_ops, flash_width, gpu_attention, kernels  # noqa: E402
from pretrain_cli.run_config import KernelConfig, MoeConfig  # noqa: E402

SEQ = 16


def _flash_attn_lib(name, fn, calls):
    """`fn` (a reference) behind the flash-attn library's forward checks (`CHECK_FWD_EXECTUABLE`), counted."""
    @functools.wraps(fn)
    def call(query, key, value, *args, **kwargs):
        widths = {query.shape[-1], key.shape[-1], value.shape[-1]}
        width = max(widths)
        if len(widths) != 1 or width % 8 or width > 256:
            raise ValueError(f"{name}: flash-attn's CHECK_FWD_EXECTUABLE refuses head widths {sorted(widths)}")
        calls[name] += 1
        return fn(query, key, value, *args, **kwargs)
    return call


@pytest.fixture
def gpu(monkeypatch):
    """(the GPU kernel selection, calls per GPU-only entry point): fp32 stand-ins (the CPU reference is fp32), the
    device probe answering a GPU for "gpu", the fused CPU library absent (a GPU run's tensors are not on the CPU)."""
    calls = Counter()

    def counted(name, fn):
        return lambda *a, **kw: calls.update([name]) or fn(*a, **kw)

    sdpa_backends = []

    def sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, *a, **kw):
        # Paddle's sdpa itself: flash-attn where `select_sdp_for_sdpa` takes it (fp32 here: judged as its half twin)
        half = [t.astype("bfloat16") for t in (query, key, value)]
        sdpa_backends.append(emu.sdpa_backend(*half, attn_mask, is_causal, kw.get("scale")))
        calls["sdpa"] += 1
        return ref_sdpa(query, key, value, attn_mask, dropout_p, is_causal, *a, **kw)

    monkeypatch.setattr(IF, "fused_rms_norm", counted("fused_rms_norm", ref_fused_rms_norm))
    monkeypatch.setattr(IF, "fused_rotary_position_embedding", counted("fused_rope", ref_fused_rope))
    monkeypatch.setattr(IF, "swiglu", counted("swiglu", ref_swiglu))
    monkeypatch.setattr(F, "swiglu", counted("swiglu", ref_swiglu))
    monkeypatch.setattr(F, "scaled_dot_product_attention", sdpa)
    monkeypatch.setattr(F, "flashmask_attention",
                        _flash_attn_lib("flashmask", functools.partial(ref_flashmask, half_only=False), calls))
    gemm = emu.gpu_experts(monkeypatch)  # batched_gemm: the grouped GEMM's contract, no backward of its own
    monkeypatch.setattr(kernels, "_gpu_available", lambda device: str(device).startswith("gpu"))
    monkeypatch.setattr(cpu_ops, "load", lambda: None)
    monkeypatch.setattr(gpu_attention, "_REFUSED", set())
    request = KernelConfig(attention="flash", rms_norm="fused", rope="fused", swiglu="fused", cpu_ops=False,
                           fused_loss=False)
    selected = kernels.select(request, "gpu")
    assert selected.attention is gpu_attention.attention_sdpa_causal and selected.grouped_mlp_name == "batched_gemm"
    yield selected, calls, sdpa_backends, gemm


def _config(preset, **kw):
    return ModelConfig.from_dict({**json.loads((PRESET_DIR / preset / "config.json").read_text()), **kw})


# the parity tests' micro MLA widths (tests/parity/test_deepseek_parity.py): qk 8 + 4 = 12, v 6
NARROW = dict(qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=6, kv_lora_rank=12)
CASES = {
    "deepseek-v3 (width 24)": ("micro-deepseek-v3", {}),
    "deepseek-v3 (width 12)": ("micro-deepseek-v3", NARROW),
    "deepseek-v3 plain rope": ("micro-deepseek-v3", {"rope_interleave": False}),
    "qwen3-moe": ("micro-qwen3-moe", {}),
}


def _loss_and_grads(model, ids, labels, extra):
    total, count = model(ids, labels=labels, **extra)
    loss = total / count
    loss.backward()
    grads = {n: p.grad.numpy() for n, p in model.named_parameters() if p.grad is not None}
    model.clear_gradients()
    return float(loss), grads


@pytest.mark.parametrize("documents", [False, True])
@pytest.mark.parametrize("case", list(CASES))
def test_the_gpu_branch_of_moe_and_mla_models_equals_the_cpu_reference(gpu, case, documents):
    selected, calls, backends, gemm = gpu
    preset, kw = CASES[case]
    cfg = _config(preset, **kw)
    moe = MoeConfig(aux_loss_coef=0.01, z_loss_coef=1e-3)
    paddle.seed(0)
    ref = build_model(cfg, kernels.select(KernelConfig(cpu_ops=False, fused_loss=False), "cpu"), moe)
    ours = build_model(cfg, selected, moe)
    ours.set_state_dict(ref.state_dict())
    rng = np.random.default_rng(1)
    ids = paddle.to_tensor(rng.integers(3, cfg.vocab_size, (2, SEQ + 1)).astype("int64"))
    extra = {}
    if documents:
        fields = [document_fields(np.array(s), SEQ, True) for s in ([0, 5, 11], [0, 9])]
        extra = {k: paddle.to_tensor(np.stack([f[k] for f in fields])) for k in fields[0]}
    inputs, labels = ids[:, :-1], ids[:, 1:]
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        got_loss, got = _loss_and_grads(ours, inputs, labels, extra)
    want_loss, want = _loss_and_grads(ref, inputs, labels, extra)
    assert abs(got_loss - want_loss) <= 1e-5, (got_loss, want_loss)
    assert got.keys() == want.keys()
    for name, g in want.items():
        np.testing.assert_allclose(got[name], g, atol=1e-5, rtol=1e-4, err_msg=name)
    # the GPU branch ran: the fused norms and RoPE, the grouped GEMM forward and backward (dx, dW), flash attention
    assert calls["fused_rms_norm"] and calls["fused_rope"] and calls["swiglu"]
    assert {(lhs, rhs) for lhs, rhs, _ in gemm.calls} == {(False, False), (False, True), (True, False)}
    refused = [str(w.message) for w in said if "flash-attn refuses" in str(w.message)]
    if kw is NARROW:  # no flash-attn at width 12 (sdpa takes its math path itself): the scores materialised, said once
        assert calls["flashmask"] == 0 and (calls["sdpa"] == 0) == documents
        assert backends == ["math"] * calls["sdpa"], backends  # not mem_efficient: half wants widths % 8 there too
        assert len(refused) == 1 and "head_dim 12" in refused[0]
    else:
        assert calls["flashmask" if documents else "sdpa"] > 0 and not refused
        assert set(backends) <= {"flash_attn"}, backends  # one head width for q, k and v (MLA's padded value)


def _gpu_attention_calls(monkeypatch, capability, width, backward):
    """(the three GPU attention paths' outputs against the reference, the GPU-only calls they made, the warnings)
    at head `width` on a GPU of `capability`; `backward`: q, k, v need gradients (else a forward alone)."""
    monkeypatch.setattr(runtime, "gpu_capability", lambda: capability)
    monkeypatch.setattr(gpu_attention, "_REFUSED", set())
    called = Counter()
    monkeypatch.setattr(F, "scaled_dot_product_attention", lambda *a, **kw: called.update(["sdpa"])
                        or ref_sdpa(*a, **kw))
    monkeypatch.setattr(F, "flashmask_attention", lambda *a, **kw: called.update(["flashmask"])
                        or ref_flashmask(*a, half_only=False, **kw))
    monkeypatch.setattr(paddle._C_ops, "flash_attn", lambda *a: called.update(["flash_attn"])
                        or emu.ref_flash_attn(*a), raising=False)
    monkeypatch.setattr(gpu_attention, "block_forward", lambda *a: called.update(["block"]) or (None, None))
    rng = np.random.default_rng(0)
    q, k, v = (paddle.to_tensor(rng.standard_normal((1, 8, 2, width)).astype("float32"), stop_gradient=not backward)
               for _ in range(3))
    doc_start = paddle.to_tensor(np.array([[0, 0, 0, 3, 3, 3, 3, 7]], np.int64))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        causal = gpu_attention.attention_sdpa_causal(q, k, v)
        document = gpu_attention.attention_flashmask(q, k, v, doc_start)
        heads = [t.transpose([0, 2, 1, 3]).reshape([1, 2, 1, 8, width]).astype("bfloat16") for t in (q, k, v)]
        gpu_attention.block_forward_flash(*heads, None, True)
    np.testing.assert_allclose(causal.numpy(), kernels.attention_math(q, k, v).numpy(), atol=1e-5)
    np.testing.assert_allclose(document.numpy(), kernels.attention_math(q, k, v, doc_start).numpy(), atol=1e-5)
    return called, [str(w.message) for w in caught if "flash-attn" in str(w.message)]


@pytest.mark.parametrize("capability,flash", [((8, 0), True), ((9, 0), True), ((8, 6), False), ((8, 9), False),
                                              (None, True)])
def test_a_head_width_above_192_takes_flash_attention_only_where_its_backward_runs(monkeypatch, capability, flash):
    """Width 200 (an MLA of qk 136 + 64): flash-attn's backward refuses it off compute capability 8.0 / 9.0
    (`CHECK_BWD_EXECTUABLE`), which Paddle's sdpa does not check (its hardware rule is SM 8.0-12.1): the causal, the
    document-masked and the context-parallel block paths take their materialised forms there, decided in
    `ops.gpu_attention`, with one warning naming the keys and the fix. Capability unknown (no GPU build): flash."""
    called, said = _gpu_attention_calls(monkeypatch, capability, 200, backward=True)
    if flash:
        assert called == Counter(sdpa=1, flashmask=1, flash_attn=1) and not said
    else:
        assert called == Counter(block=1)
        assert said == [
            f"attention on GPU: flash-attn refuses head_dim 200 on compute capability {capability[0]}.{capability[1]} "
            "(flash-attn's backward above 192 runs on 8.0 and 9.0 only), so this process materialises the [b, heads, "
            "s, s] attention scores, which its kernels were not resolved for (config judged another GPU, one of "
            "unknown capability, or no model); for flash attention head_dim (under MLA max(qk_nope_head_dim + "
            "qk_rope_head_dim, v_head_dim)) must be a multiple of 8 of at most 192, or run on a GPU of compute "
            "capability 8.0 / 9.0 (A100, H100)"]  # once for all three


@pytest.mark.parametrize("capability", [(8, 6), (8, 9)])
def test_a_forward_alone_takes_flash_attention_where_only_its_backward_refuses(monkeypatch, capability):
    """eval and generate (`paddle.no_grad`), and context parallelism's ring (its forward under `no_grad`, its
    backward `block_backward`'s): flash-attn's forward takes 200 on every SM 8.x (`CHECK_FWD_EXECTUABLE`), so a
    forward alone runs it there, without a warning; they took the materialised paths and warned of a backward."""
    with paddle.no_grad():
        called, said = _gpu_attention_calls(monkeypatch, capability, 200, backward=True)
    assert called == Counter(sdpa=1, flashmask=1, flash_attn=1) and not said
    called, said = _gpu_attention_calls(monkeypatch, capability, 200, backward=False)  # (no tensor needs a gradient)
    assert called == Counter(sdpa=1, flashmask=1, flash_attn=1) and not said


def test_over_256_the_causal_path_runs_sdpas_memory_efficient_kernel_unwarned(monkeypatch):
    """Width 264 (a multiple of 8): sdpa picks its memory-efficient kernel itself (`emu.sdpa_backend`: no scores),
    so the causal path calls it and says nothing (it said the scores materialise); flashmask and the ring's flash
    block, which flash-attn's forward refuses, materialise, said once."""
    q = paddle.zeros([1, 8, 2, 264]).astype("bfloat16")
    assert emu.sdpa_backend(q, q, q, None, True) == "mem_efficient"
    monkeypatch.setattr(gpu_attention, "_REFUSED", set())
    monkeypatch.setattr(F, "scaled_dot_product_attention", ref_sdpa)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        gpu_attention.attention_sdpa_causal(q, q, q)
    assert not [w for w in caught if "flash-attn" in str(w.message)]  # the causal path alone
    called, said = _gpu_attention_calls(monkeypatch, (9, 0), 264, backward=True)
    assert called == Counter(sdpa=1, block=1)
    assert len(said) == 1 and said[0].startswith("attention on GPU: flash-attn refuses head_dim 264 (flash-attn takes "
                                                 "multiples of 8 up to 256), so this process materialises")


@pytest.mark.parametrize("capability,backward,bound", [((8, 9), True, "192 (256 on compute capability 8.0 / 9.0)"),
                                                        ((9, 0), True, "256"), ((9, 0), False, "256"),
                                                        ((8, 9), False, "256")])
def test_the_warning_at_a_width_no_gpu_takes_names_the_widest_head_that_runs(monkeypatch, capability, backward, bound):
    """Width 12 (the parity micro MLA's), which flash-attn takes on no GPU: the fix names 256 where it runs (a forward
    alone runs it on every SM 8.x; with a backward, 8.0 / 9.0), not "at most 192" alone (review R10 of ed329682), on
    the GPU this process runs on: an H100's backward says 256, as config's note does (review R16 of 0da8d41e: the
    device was asked only at 193-256, so it said "192 (256 on ...)" there)."""
    _, said = _gpu_attention_calls(monkeypatch, capability, 12, backward=backward)
    assert len(said) == 1 and said[0].startswith("attention on GPU: flash-attn refuses head_dim 12 (flash-attn takes "
                                                 "multiples of 8 up to 256), so this process materialises"), said
    assert said[0].endswith(f"v_head_dim)) must be a multiple of 8 of at most {bound}"), said


def test_flash_attentions_head_width_rule():
    """`flash_width.refusal` (in `gpu_path`'s words) and `flash_width.path`, the one rule of the three GPU attention
    paths (flash_attn.cu's two checks, sdpa.py's choice of kernel) and of `config.compute.flash_width`."""
    def refuses(width, capability, backward=True):
        why = flash_width.refusal(width, capability, backward)
        return None if why is None else gpu_attention._words(width, why)

    # DeepSeek-V2/V3's MLA width, on compute capability 8.x and 9.0 (Blackwell's 10.0 / 12.0 unverified: mla.py)
    assert refuses(192, (8, 6)) is None
    assert refuses(128, (7, 5)) is None  # (pre-Ampere GPUs never ask: `config.resolve` runs math)
    assert refuses(256, (8, 0)) is None and refuses(256, (9, 0)) is None
    assert refuses(256, (8, 9)).startswith("head_dim 256 on compute capability 8.9")
    assert refuses(256, (8, 9), backward=False) is None  # its forward runs on every SM 8.x
    for width in (12, 20, 264):
        assert refuses(width, (9, 0)) == f"head_dim {width} (flash-attn takes multiples of 8 up to 256)"
    paths = {(w, cap, sdpa, backward): flash_width.path(w, cap, sdpa, backward)
             for w in (12, 200, 260, 264) for cap in ((8, 6), (9, 0)) for sdpa in (True, False)
             for backward in (True, False)}
    assert {key for key, p in paths.items() if p == "flash"} == {
        (200, (9, 0), True, True), (200, (9, 0), False, True), (200, (9, 0), True, False),
        (200, (9, 0), False, False), (200, (8, 6), True, False), (200, (8, 6), False, False)}
    assert {key for key, p in paths.items() if p == "mem_efficient"} == {
        (264, cap, True, backward) for cap in ((8, 6), (9, 0)) for backward in (True, False)}  # causal sdpa only


def test_mla_pads_its_value_heads_to_the_query_width_so_sdpa_takes_flash_attention(gpu, monkeypatch):
    """sdpa.py 3.3.1 `check_head_dim_size_flash` wants one head width for q, k and v: DeepSeek-V3's q/k 192 (nope
    128 + rope 64) against v 128 reaches flash-attn only because MLA pads v to 192 (`models.mla._to_width`)."""
    from pretrain_cli.models.mla import LatentAttention

    selected, _, backends, _ = gpu
    cfg = dataclasses.replace(_config("deepseek-v3"), hidden_size=64, num_attention_heads=2, q_lora_rank=16,
                              kv_lora_rank=16)
    paddle.seed(0)
    layer = LatentAttention(cfg, selected, False, False)
    assert (layer.qk_dim, layer.v_dim, layer.width) == (192, 128, 192)
    seen, sdpa = [], F.scaled_dot_product_attention
    monkeypatch.setattr(F, "scaled_dot_product_attention",
                        lambda q, k, v, *a, **kw: seen.append((q.shape[-1], k.shape[-1], v.shape[-1]))
                        or sdpa(q, k, v, *a, **kw))
    cos, sin = _rope_tables(64, 4)
    out = layer(paddle.randn([1, 4, 64]), cos, sin)
    assert seen == [(192, 192, 192)] and backends == ["flash_attn"] and list(out.shape) == [1, 4, 64]


def _rope_tables(dim, length):
    ang = np.outer(np.arange(length), 1.0 / 10000 ** (np.arange(0, dim, 2) / dim))
    emb = np.concatenate([ang, ang], -1).astype("float32")
    return paddle.to_tensor(np.cos(emb)), paddle.to_tensor(np.sin(emb))
