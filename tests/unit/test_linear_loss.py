"""The fused LM head + cross-entropy (ops/linear_loss.py) against the logits + Paddle's cross-entropy.

Odd shapes on purpose: 37 tokens in chunks of 16 (a short last chunk), vocab 203 (not a multiple of 16),
hidden 24; ignored (-100) labels; both weight layouts (a Linear's `[hidden, V]`, the tied embedding's
`[V, hidden]`); the C++ kernel and the chunked Paddle-op path (the GPU code, run here on CPU).
"""
import dataclasses

import numpy as np
import pytest

from pretrain_cli import runtime

paddle = runtime.import_paddle()

import paddle.nn.functional as F  # noqa: E402

from pretrain_cli.models import build_model  # noqa: E402
from pretrain_cli.models.config import ModelConfig  # noqa: E402
from pretrain_cli.ops import cpu_ops, kernels, linear_loss  # noqa: E402
from pretrain_cli.ops.loss import IGNORE_INDEX, causal_lm_loss_sum  # noqa: E402
from pretrain_cli.training.evaluation import loss_sum  # noqa: E402

N, D, V = 37, 24, 203
PATHS = [linear_loss.linear_cross_entropy_cpu, linear_loss.linear_cross_entropy_chunked]


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch):
    monkeypatch.setattr(linear_loss, "CHUNK_ELEMENTS", {"cpu": 16 * V, "gpu": 16 * V})
    monkeypatch.setattr(linear_loss, "KERNEL_CHUNK_ELEMENTS", 16 * V)
    assert linear_loss.chunk_rows(V) == 16  # 37 rows = 16 + 16 + 5
    assert linear_loss.chunk_rows(V, budget=linear_loss.KERNEL_CHUNK_ELEMENTS) == 16


def _inputs(vocab_major, seed=0, ignored=(3, 17, 36)):
    rng = np.random.default_rng(seed)
    h = rng.standard_normal((N, D)).astype("float32")
    w = (0.3 * rng.standard_normal((V, D) if vocab_major else (D, V))).astype("float32")
    labels = rng.integers(0, V, N).astype("int64")
    labels[list(ignored)] = IGNORE_INDEX
    return h, w, labels


def _run(fn, h, w, labels, vocab_major, need=(True, True)):
    """(loss sum, dh, dw) for d(loss)/d(sum) = 0.37 (the backward's scaling is part of what is checked)."""
    ht, wt = paddle.to_tensor(h), paddle.to_tensor(w)
    ht.stop_gradient, wt.stop_gradient = not need[0], not need[1]
    lt = paddle.to_tensor(labels)
    if fn is None:  # the reference: materialised logits, Paddle's cross-entropy
        logits = paddle.matmul(ht, wt, transpose_y=vocab_major)  # [N, V]
        total = F.cross_entropy(logits, lt, ignore_index=IGNORE_INDEX, reduction="sum")
    else:
        total = fn(ht, wt, lt, IGNORE_INDEX, vocab_major)
    (total * 0.37).backward()
    grads = [t.grad.numpy() if t.grad is not None else None for t in (ht, wt)]
    return float(total), *grads


@pytest.mark.parametrize("vocab_major", [False, True])
@pytest.mark.parametrize("fn", PATHS, ids=["cpu_kernel", "chunked"])
def test_loss_and_gradients_match_logits_and_cross_entropy(fn, vocab_major):
    args = _inputs(vocab_major)
    want = _run(None, *args, vocab_major)
    got = _run(fn, *args, vocab_major)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5)
    for g, r in zip(got[1:], want[1:]):
        np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-5 * np.abs(r).max())
    assert np.all(got[1][[3, 17, 36]] == 0)  # ignored tokens get no gradient


@pytest.mark.parametrize("fn", PATHS, ids=["cpu_kernel", "chunked"])
def test_gradient_only_where_asked_and_none_in_no_grad(fn):
    h, w, labels = _inputs(False)
    want = _run(None, h, w, labels, False)
    total, dh, dw = _run(fn, h, w, labels, False, need=(True, False))  # a frozen head
    assert dw is None
    np.testing.assert_allclose(dh, want[1], rtol=1e-5, atol=1e-5 * np.abs(want[1]).max())
    with paddle.no_grad():  # eval: the loss-only pass, same value
        ht, wt = paddle.to_tensor(h), paddle.to_tensor(w)
        wt.stop_gradient = False
        value = fn(ht, wt, paddle.to_tensor(labels), IGNORE_INDEX, False)
    assert value.stop_gradient and abs(float(value) - want[0]) <= 1e-5 * abs(want[0])


@pytest.mark.parametrize("fn", PATHS, ids=["cpu_kernel", "chunked"])
def test_all_ignored_is_zero_loss_and_zero_gradient(fn):
    h, w, labels = _inputs(True, ignored=range(N))
    total, dh, dw = _run(fn, h, w, labels, True)
    assert total == 0.0 and not dh.any() and not dw.any()


def test_the_kernel_refuses_labels_outside_the_vocabulary():
    h, w, labels = _inputs(False)
    labels[5] = V
    with pytest.raises(Exception, match="outside the vocabulary"):
        linear_loss.linear_cross_entropy_cpu(paddle.to_tensor(h), paddle.to_tensor(w), paddle.to_tensor(labels),
                                             IGNORE_INDEX, False)


def test_selection_follows_the_request():
    assert cpu_ops.load() is not None
    assert kernels.select(None, "cpu").linear_cross_entropy is linear_loss.linear_cross_entropy_cpu
    assert kernels.select(kernels.KernelConfig(attention="math", cpu_ops=False), "cpu").linear_cross_entropy_name == "chunked"
    off = kernels.select(kernels.KernelConfig(fused_loss=False), "cpu")
    assert off.linear_cross_entropy is None and "head+loss=off" in off.describe()


CFG = ModelConfig(model_type="qwen2", vocab_size=V, hidden_size=D, intermediate_size=40, num_hidden_layers=1,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32, tie_word_embeddings=True)


def _model_grads(kern):
    paddle.seed(3)
    model = build_model(CFG, kern)
    rng = np.random.default_rng(4)
    ids = paddle.to_tensor(rng.integers(0, V, (2, 19)).astype("int64"))  # 38 tokens
    labels = rng.integers(0, V, (2, 19)).astype("int64")
    labels[0, :4] = IGNORE_INDEX
    total, count = model(ids, labels=paddle.to_tensor(labels))
    (total / count).backward()
    return float(total), float(count), {n: p.grad.numpy() for n, p in model.named_parameters()}, model, ids, labels


@pytest.mark.parametrize("fn", PATHS, ids=["cpu_kernel", "chunked"])
def test_tied_model_gradients_accumulate_into_the_embedding(fn):
    base = kernels.select(kernels.KernelConfig(fused_loss=False), "cpu")
    want_total, want_count, want, model, ids, labels = _model_grads(base)
    got_total, got_count, got, _, _, _ = _model_grads(dataclasses.replace(base, linear_cross_entropy=fn))
    assert got_count == want_count == 34
    np.testing.assert_allclose(got_total, want_total, rtol=1e-5)
    assert list(got) == list(want) and "model.embed_tokens.weight" in got and "lm_head.weight" not in got
    for name in want:  # the embedding's gradient: its lookup plus the head
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-5 * np.abs(want[name]).max())
    # the logits path is what eval and generation read: the same loss from the logits
    s, c = causal_lm_loss_sum(model(ids), paddle.to_tensor(labels))
    assert abs(float(s) - want_total) <= 1e-5 * want_total and float(c) == 34


def test_eval_loss_is_the_same_with_and_without_the_fused_head():
    rng = np.random.default_rng(5)
    batches = [{"input_ids": rng.integers(0, V, (2, 16)).astype("int64"),
                "labels": rng.integers(0, V, (2, 16)).astype("int64")} for _ in range(2)]
    sums = []
    for request in (kernels.KernelConfig(), kernels.KernelConfig(fused_loss=False)):
        paddle.seed(3)
        sums.append(loss_sum(build_model(CFG, kernels.select(request, "cpu")), batches))
    assert sums[0][1:] == sums[1][1:] == (64.0, 4)
    np.testing.assert_allclose(sums[0][0], sums[1][0], rtol=1e-6)


def _confident():
    """Logits the fused loss's fp16 gradients must not flush: every token its own label column, the right token's
    logit 21 and the others 0 (probabilities e^-21 ~ 8e-10), on fp16-representable values. Returns (labels, h, w,
    the loss scale, the fp32 reference `_run`, its dW after the scale, the columns no row is labelled with)."""
    rng = np.random.default_rng(3)
    labels = rng.permutation(V)[:N].astype("int64")
    h = rng.standard_normal((N, D)).astype("float32")
    h *= np.sqrt(21.0) / np.linalg.norm(h, axis=1, keepdims=True)
    w = np.zeros((D, V), dtype="float32")
    w[:, labels] = h.T
    h16, w16 = h.astype("float16").astype("float32"), w.astype("float16").astype("float32")
    scale = 2.0 ** 15 / N
    want = _run(None, h16, w16, labels, False)  # fp32 reference on the fp16 values, d(loss) 0.37
    dw_want = want[2] / 0.37 * scale
    small = np.setdiff1d(np.arange(V), labels)
    assert 1e-6 < np.abs(dw_want[:, small]).max() < 1e-4  # fp16 subnormals after the scale; 0 before it
    return labels, h16, w16, scale, want, dw_want, small


def test_fp16_gradients_keep_the_small_probabilities_a_loss_scale_would_save(monkeypatch):
    """fp16 (a GPU before Ampere): the fused loss forms the gradients of the loss SUM in its forward, before the
    loss scale. Confident logits leave the other tokens probabilities of ~1e-9, which fp16 flushes to 0: the two
    gradient GEMMs run in fp32 and dh, dW stay fp32 until backward has scaled them by d(loss) (here a loss scale of
    2**15 over the 37 tokens), then take the parameters' dtype. fp16 GEMMs are GPU-only: the emulation computes
    them in fp32 and rounds the output to fp16, as cuBLAS does with fp32 accumulation."""
    real = paddle.matmul

    def matmul(x, y, transpose_x=False, transpose_y=False):
        if x.dtype == paddle.float16 or y.dtype == paddle.float16:
            assert x.dtype == y.dtype, "a GEMM of mixed dtypes"
            return real(x.astype("float32"), y.astype("float32"), transpose_x, transpose_y).astype("float16")
        return real(x, y, transpose_x, transpose_y)

    monkeypatch.setattr(paddle, "matmul", matmul)
    labels, h16, w16, scale, want, dw_want, small = _confident()
    ht, wt = paddle.to_tensor(h16).astype("float16"), paddle.to_tensor(w16).astype("float16")
    ht.stop_gradient = wt.stop_gradient = False
    total = linear_loss.linear_cross_entropy_chunked(ht, wt, paddle.to_tensor(labels), IGNORE_INDEX, False)
    (total * scale).backward()
    assert ht.grad.dtype == paddle.float16 and wt.grad.dtype == paddle.float16
    np.testing.assert_allclose(wt.grad.numpy().astype("float32")[:, small], dw_want[:, small], rtol=2e-2, atol=2e-7)
    dh_want = want[1] / 0.37 * scale  # (its logits are fp16 here, rounded at 21 by 1/64: a looser match)
    np.testing.assert_allclose(ht.grad.numpy().astype("float32"), dh_want, atol=2e-2 * np.abs(dh_want).max())


@pytest.mark.parametrize("level", ["O1", "O2"])
def test_fp16_gradient_gemms_stay_fp32_under_gpu_autocast(monkeypatch, level):
    """The loss above under fp16 autocast, emulated (tests/gpu_emulation.py): a matmul is on AMP's white list, so it
    runs in fp16 whatever the code cast its inputs to, unless autocast is off around it. O2: h and the weight are
    fp16; O1: both fp32 (the norm's output is promoted to fp32, the weights stay fp32) and autocast makes the logits
    fp16. Either way the small probabilities must reach dW: before, O2's gradient GEMMs were cast back to fp16 and
    O1 formed them in fp16 outright, and the small columns came out 0."""
    import gpu_emulation as emu

    labels, h16, w16, scale, want, dw_want, small = _confident()
    monkeypatch.setattr(paddle.amp, "auto_cast", emu.fake_auto_cast)
    monkeypatch.setattr(paddle, "matmul", emu.ref_matmul_typed)
    dtype = paddle.float16 if level == "O2" else paddle.float32
    ht, wt = paddle.to_tensor(h16).astype(dtype), paddle.to_tensor(w16).astype(dtype)
    ht.stop_gradient = wt.stop_gradient = False
    emu.MATMULS.clear()
    with emu.fake_auto_cast(True, level=level, dtype="float16"):  # the step's autocast (training.precision.Amp)
        total = linear_loss.linear_cross_entropy_chunked(ht, wt, paddle.to_tensor(labels), IGNORE_INDEX, False)
    (total * scale).backward()
    assert emu.MATMULS == [paddle.float16, paddle.float32, paddle.float32] * 3, emu.MATMULS  # 3 chunks
    assert ht.grad.dtype == wt.grad.dtype == dtype
    np.testing.assert_allclose(wt.grad.numpy().astype("float32")[:, small], dw_want[:, small], rtol=2e-2, atol=2e-7)
