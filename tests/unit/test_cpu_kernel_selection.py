"""Which kernels a CPU run selects: the fused CPU kernels silently by default, Paddle's ops only with
`cpu_fused_ops: false`, Paddle's ops with one warning naming why when the library failed to build, and the fused
AdamW step as the run configuration asks (the kernels themselves: test_cpu_ops.py, test_cpu_attention.py)."""
import warnings

import numpy as np
import pytest

from pretrain_cli import runtime

paddle = runtime.import_paddle()

from pretrain_cli.ops import cpu_ops, kernels  # noqa: E402


def test_cpu_selection_uses_the_fused_kernels_silently():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        k = kernels.select(kernels.KernelConfig(attention="flash"), "cpu")
        fused_requests = kernels.select(kernels.KernelConfig(rms_norm="fused", rope="fused", swiglu="fused"), "cpu")
    assert (k.attention, k.rms_norm, k.rope, k.cross_entropy, k.swiglu_packed) == (
        kernels.attention_cpu, kernels.rms_norm_cpu, kernels.rope_cpu, kernels.cross_entropy_cpu,
        kernels.swiglu_packed_cpu)
    assert k.attention_cached is kernels.attention_cpu and k.add_rms_norm is kernels.add_rms_norm_cpu
    assert k.mlp_in is kernels.mlp_in_cpu and "gate|up GEMM + SwiGLU as one op" in k.describe()
    assert k.attention_document is kernels.attention_cpu_document and "documents: cpu_document" in k.describe()
    assert fused_requests.rms_norm is kernels.rms_norm_cpu  # a fused request is served by the CPU kernel
    assert "attention=cpu" in k.describe()


def test_cpu_ops_off_is_the_paddle_only_path(monkeypatch):
    """`cpu_fused_ops: false` is the one switch (no environment variable): nothing loads the fused CPU kernels."""
    from run_helpers import resolve_run

    assert resolve_run("--use_flash_attention").kernels.cpu_ops is True
    off = resolve_run("--use_flash_attention", "--cpu_fused_ops", "false").kernels
    assert off.cpu_ops is False
    k = kernels.select(off, "cpu")
    assert (k.attention, k.rms_norm, k.cross_entropy, k.add_rms_norm, k.mlp_in) == (
        kernels.attention_sdpa_mask, kernels.rms_norm_reference, kernels.cross_entropy_reference, None, None)
    assert k.attention_document is kernels.attention_sdpa_mask  # with the per-sample document mask
    monkeypatch.setattr(cpu_ops, "load", lambda: pytest.fail("cpu_fused_ops false loaded the fused CPU kernels"))
    h = paddle.randn([6, 8])
    h.stop_gradient = False
    w = paddle.randn([8, 11])
    w.stop_gradient = False
    k.linear_cross_entropy(h, w, paddle.to_tensor(np.arange(6) % 11), -100, False).backward()  # the chunked path
    assert k.linear_cross_entropy_name == "chunked" and h.grad is not None and w.grad is not None


def test_failed_build_falls_back_with_one_warning_naming_why(monkeypatch):
    monkeypatch.setattr(cpu_ops, "_STATE", {"error": "compiler failed: g++ not found"})
    with pytest.warns(RuntimeWarning) as rec:
        k = kernels.select(kernels.KernelConfig(), "cpu")
    msgs = [str(w.message) for w in rec if str(w.message).startswith("kernels on")]
    assert len(msgs) == 1 and "g++ not found" in msgs[0]
    assert k.attention is kernels.attention_sdpa_mask and k.rms_norm is kernels.rms_norm_reference
    with pytest.warns(RuntimeWarning, match="fused AdamW step needs the fused CPU kernels.*g\\+\\+ not found"):
        step = kernels.select_step(kernels.KernelConfig(), "cpu")
    assert step.adamw is None and step.global_sq_norm is kernels.global_sq_norm_reference


def test_step_selection_follows_the_run_configuration():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fused = kernels.select_step(kernels.KernelConfig(), "cpu")
        paddle_step = kernels.select_step(kernels.KernelConfig(optimizer="paddle"), "cpu")
        no_cpu_ops = kernels.select_step(kernels.KernelConfig(cpu_ops=False), "cpu")
    assert (fused.name, fused.adamw, fused.global_sq_norm) == ("fused_cpu", kernels.adamw_cpu,
                                                               kernels.global_sq_norm_cpu)
    assert paddle_step.adamw is None and no_cpu_ops.adamw is None
