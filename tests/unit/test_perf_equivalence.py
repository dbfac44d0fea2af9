"""The CPU fast path trains exactly like the reference path (≤ 1e-5 loss difference over 20 steps).

Reference: Paddle's ops only (`cpu_fused_ops: false`): naive attention (`attention_math`), separate gate/up
GEMMs, slice/concat RoPE, Paddle's RMSNorm ops and cross-entropy, eager.
Fast: the default CPU selection (the fused kernels of csrc/ for attention, RoPE, RMSNorm,
SwiGLU and the fused LM head + loss; packed gate|up GEMM), with and without `compiled_forward.compile_forward`
(to_static SOT). The fused head + loss alone (C++ kernel and the chunked Paddle-op path) against the logits
and Paddle's cross-entropy, tied and untied. All run `Trainer.train_step`.
"""
import dataclasses

import numpy as np

from pretrain_cli import runtime

paddle = runtime.import_paddle()

from run_helpers import resolve_run  # noqa: E402

from pretrain_cli.distributed.comms.comm import NoComm  # noqa: E402
from pretrain_cli.models import build_model  # noqa: E402
from pretrain_cli.models.config import ModelConfig  # noqa: E402
from pretrain_cli.ops import compiled_forward, kernels  # noqa: E402
from pretrain_cli.training.run import lay_out  # noqa: E402
from pretrain_cli.training.trainer import Trainer  # noqa: E402

CFG = ModelConfig(model_type="qwen2", vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
STEPS, BS, SEQ = 20, 2, 32


def _slice_rope(q, k, cos, sin):
    """The pre-optimisation rotate-half (slice + neg + concat), kept here as the oracle."""
    def rot(x):
        half = x.shape[-1] // 2
        return paddle.concat([-x[..., half:], x[..., :half]], axis=-1)

    c, s = cos.reshape([1, cos.shape[0], 1, -1]), sin.reshape([1, sin.shape[0], 1, -1])
    return q * c + rot(q) * s, k * c + rot(k) * s


def _batches(documents=False):
    """Two fixed batches in turn, so 20 steps visibly lower the loss (memorisation); `documents`: packed
    documents of 5-13 tokens, with doc_start and restarting position_ids (document masking)."""
    from pretrain_cli.data.samples import document_fields

    rng = np.random.default_rng(0)
    fixed = [rng.integers(0, CFG.vocab_size, (BS, SEQ + 1)).astype("int64") for _ in range(2)]
    fields = [document_fields(np.concatenate(([0], np.cumsum(rng.integers(5, 14, 6)))), SEQ) for _ in range(BS)]
    doc = {k: np.stack([f[k] for f in fields]) for k in fields[0]} if documents else {}
    for i in range(10**6):
        toks = fixed[i % 2]
        yield {"input_ids": toks[:, :-1], "labels": toks[:, 1:], **doc}


def _losses(chosen, compile_forward, documents=False, cfg=CFG, steps=STEPS):
    run = resolve_run("--learning_rate", "0.003", "--warmup_steps", "2", "--max_steps", str(STEPS),
                      "--max_grad_norm", "1.0", "--weight_decay", "0.01", "--to_static", str(compile_forward))
    paddle.seed(1)
    trainer = Trainer(lay_out(run, build_model(cfg, chosen), NoComm()), None, run, NoComm())  # as `train` builds it
    trainer.model.train()
    batches = _batches(documents)
    return np.array([trainer.train_step(batches)[0] for _ in range(steps)])


def test_fast_cpu_step_matches_reference_step():
    fast = kernels.select(kernels.KernelConfig(attention="flash"), "cpu")
    assert fast.attention is kernels.attention_cpu  # the fused kernels are what is being compared
    assert fast.linear_cross_entropy is kernels.linear_cross_entropy_cpu
    paddle_only = kernels.select(kernels.KernelConfig(cpu_ops=False, fused_loss=False), "cpu")
    assert paddle_only.linear_cross_entropy is None
    ref = dataclasses.replace(paddle_only, attention=kernels.attention_math, rope=_slice_rope, pack_mlp=False)
    want = _losses(ref, compile_forward=False)
    assert want[-1] < want[0] - 0.1  # it actually trains
    for compiled in (False, True):
        got = _losses(fast, compile_forward=compiled)
        print(f"max |Δloss| over 20 steps (to_static={compiled}):", float(np.abs(got - want).max()))
        np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)


def test_document_masked_fast_cpu_step_matches_reference_step():
    """Document masking through the fused CPU kernels (cpu_document attention, RoPE with position ids)
    trains like Paddle's ops with `attention_math`'s document mask, eager and compiled."""
    fast = kernels.select(kernels.KernelConfig(attention="flash"), "cpu")
    paddle_only = kernels.select(kernels.KernelConfig(attention="math", cpu_ops=False, fused_loss=False), "cpu")
    ref = dataclasses.replace(paddle_only, attention_document=kernels.attention_math, pack_mlp=False)
    want = _losses(ref, compile_forward=False, documents=True)
    assert want[-1] < want[0] - 0.1
    assert abs(want[0] - _losses(ref, compile_forward=False, steps=1)[0]) > 1e-4  # the mask is applied (step 1)
    for compiled in (False, True):
        got = _losses(fast, compile_forward=compiled, documents=True)
        np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)


def test_fused_head_loss_step_matches_logits_step(monkeypatch):
    """20 steps with the fused LM head + loss (the C++ kernel, and the chunked Paddle-op path that is the GPU
    code) equal the logits + cross-entropy steps, untied and tied (the head's gradient lands in the embedding);
    the vocabulary 259 is not a multiple of 16, and the 64 tokens per batch are not a multiple of the chunk (20)."""
    from pretrain_cli.ops import linear_loss

    monkeypatch.setattr(linear_loss, "CHUNK_ELEMENTS", {"cpu": 259 * 20, "gpu": 259 * 20})  # 64 rows = 3 x 20 + 4
    monkeypatch.setattr(linear_loss, "KERNEL_CHUNK_ELEMENTS", 259 * 20)
    assert linear_loss.chunk_rows(259) == 20
    assert linear_loss.chunk_rows(259, budget=linear_loss.KERNEL_CHUNK_ELEMENTS) == 20
    for tied in (False, True):
        cfg = dataclasses.replace(CFG, vocab_size=259, tie_word_embeddings=tied)
        base = kernels.select(kernels.KernelConfig(fused_loss=False), "cpu")
        want = _losses(base, compile_forward=False, cfg=cfg)
        assert want[-1] < want[0] - 0.1
        for fused in (linear_loss.linear_cross_entropy_cpu, linear_loss.linear_cross_entropy_chunked):
            got = _losses(dataclasses.replace(base, linear_cross_entropy=fused), compile_forward=False, cfg=cfg)
            print(f"max |Δloss| tied={tied} {fused.__name__}:", float(np.abs(got - want).max()))
            np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)


def test_compile_forward_keeps_the_layer_and_its_names():
    paddle.seed(1)
    model = build_model(CFG)
    names = list(model.state_dict())
    assert compiled_forward.compile_forward(model) is model  # checkpoints keep using the same object
    assert list(model.state_dict()) == names


def test_gemm_rope_matches_slice_rope():
    rng = np.random.default_rng(2)
    q = paddle.to_tensor(rng.standard_normal((2, 5, 4, 8)).astype("float32"))
    k = paddle.to_tensor(rng.standard_normal((2, 5, 2, 8)).astype("float32"))
    ang = rng.standard_normal((5, 8)).astype("float32")
    cos, sin = paddle.to_tensor(np.cos(ang)), paddle.to_tensor(np.sin(ang))
    for a, b in zip(kernels.rope_reference(q, k, cos, sin), _slice_rope(q, k, cos, sin)):
        np.testing.assert_allclose(a.numpy(), b.numpy(), atol=1e-6, rtol=0)


def _optimizer_run(*flags):
    """20 `train_step`s with clipping active (max_grad_norm 0.5), weight decay with PaddleNLP's exclusions and a
    warm-up/cosine rate: (losses, grad norms, final parameters, optimizer state by HF name)."""
    from state_helpers import optimizer_tensors

    run = resolve_run("--learning_rate", "0.003", "--warmup_steps", "2", "--max_steps", str(STEPS),
                      "--max_grad_norm", "0.5", "--weight_decay", "0.01", *flags)
    paddle.seed(1)
    trainer = Trainer(lay_out(run, build_model(CFG, kernels.select(run.kernels, "cpu")), NoComm()), None, run,
                      NoComm())
    trainer.model.train()
    batches = _batches()
    steps = [trainer.train_step(batches) for _ in range(STEPS)]
    params = {n: p.numpy() for n, p in trainer.raw_model.named_parameters()}
    return (np.array([s[0] for s in steps]), np.array([s[1] for s in steps]), params,
            optimizer_tensors(trainer.raw_model, trainer.optimizer), trainer)


def test_fused_adamw_step_trains_like_paddles_adamw():
    """The multi-tensor AdamW + clipping step (`cpu_fused_optimizer`, the CPU default) against Paddle's AdamW
    and per-parameter clipping: the same losses, logged gradient norms, parameters and optimizer state."""
    loss_f, norm_f, params_f, state_f, fused = _optimizer_run()
    loss_p, norm_p, params_p, state_p, plain = _optimizer_run("--cpu_fused_optimizer", "false")
    assert fused.strategy.step_kernels.name == "fused_cpu" and plain.strategy.step_kernels.name == "paddle"
    assert type(fused.optimizer).__name__ == "FusedAdamW" and type(plain.optimizer).__name__ == "AdamW"
    assert (norm_p > 0.5).sum() >= 10  # clipping is exercised on most steps
    assert loss_p[-1] < loss_p[0] - 0.1
    print("max |Δloss|", float(np.abs(loss_f - loss_p).max()), "max |Δnorm|", float(np.abs(norm_f - norm_p).max()))
    np.testing.assert_allclose(loss_f, loss_p, atol=1e-5, rtol=0)
    np.testing.assert_allclose(norm_f, norm_p, rtol=1e-5)
    assert params_f.keys() == params_p.keys() and state_f.keys() == state_p.keys()
    for name in params_p:
        np.testing.assert_allclose(params_f[name], params_p[name], atol=1e-5, rtol=0, err_msg=name)
    for key in state_p:
        np.testing.assert_allclose(state_f[key], state_p[key], atol=1e-6, rtol=1e-4, err_msg=key)
