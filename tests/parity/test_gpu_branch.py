"""The GPU kernel branch of `ops.kernels`, executed on CPU: reference implementations (gpu_references.py, written
from Paddle's documentation and checked in test_gpu_references.py) stand behind the exact Paddle entry points it
calls, the kernel selection a GPU run makes is forced, and the model must match HF.

The model built with the GPU selection (flash attention, flashmask for packed documents, fused RMSNorm/RoPE/SwiGLU,
the chunked fused head + loss) is compared with HF transformers at the tolerances of
tests/parity/test_hf_parity.py. The real-kernel tests stay in tests/gpu for GPU machines.
"""
import dataclasses
import functools
from collections import Counter

import numpy as np
import pytest

from pretrain_cli import runtime

paddle = runtime.import_paddle()

import paddle.incubate.nn.functional as IF  # noqa: E402
import paddle.nn.functional as F  # noqa: E402
import torch  # noqa: E402

from gpu_references import _t, ref_flashmask, ref_fused_rms_norm, ref_fused_rope, ref_sdpa, ref_swiglu  # noqa: E402
from pretrain_cli.data.samples import document_fields  # noqa: E402
from pretrain_cli.ops import cpu_ops, gpu_attention, kernels, linear_loss  # noqa: E402
from pretrain_cli.ops.loss import IGNORE_INDEX  # noqa: E402
from parity_helpers import hf_loss_backward, load  # noqa: E402
from test_hf_document_parity import DOCS, SEQ, _hf, _pieces  # noqa: E402
from test_hf_parity import CASES, _hf_model, _ids  # noqa: E402

rng = np.random.default_rng(0)


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
    # fp32 here, so HF can be matched at fp32 tolerances (test_gpu_references.py's op-level test holds the
    # fp16/bf16 rule)
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
            selected.linear_cross_entropy) == (gpu_attention.attention_sdpa_causal, gpu_attention.attention_flashmask,
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
    np.testing.assert_allclose(gpu_attention.attention_sdpa_causal(q, k, v).numpy(),
                               kernels.attention_math(q, k, v).numpy(), atol=1e-5)
    doc_start = paddle.to_tensor(np.array([[0, 0, 0, 3, 3, 3, 3, 7, 7], [0] * 9], np.int64))
    np.testing.assert_allclose(gpu_attention.attention_flashmask(q, k, v, doc_start).numpy(),
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
    transposed = gpu_attention.attention_sdpa_causal(q.transpose([0, 2, 1, 3]), k.transpose([0, 2, 1, 3]),
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
