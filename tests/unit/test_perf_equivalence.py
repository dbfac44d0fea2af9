"""The CPU fast path trains exactly like the reference path (≤ 1e-5 loss difference over 20 steps).

Reference: naive attention (`attention_math`), separate gate/up GEMMs, slice/concat RoPE, eager.
Fast: the default CPU selection (cached-mask attention with broadcast GQA, packed gate|up GEMM +
swiglu, per-position GEMM RoPE) plus `kernels.compile_forward` (to_static SOT). Both run `Trainer.train_step`.
"""
import dataclasses

import numpy as np

from pretrain_cli import runtime

paddle = runtime.import_paddle()

from pretrain_cli import kernels  # noqa: E402
from pretrain_cli.arg_parser import parse_config  # noqa: E402
from pretrain_cli.config import ParallelConfig  # noqa: E402
from pretrain_cli.models import build_model  # noqa: E402
from pretrain_cli.models.config import ModelConfig  # noqa: E402
from pretrain_cli.optim import build_optimizer, build_schedule  # noqa: E402
from pretrain_cli.resolve import Resolved  # noqa: E402
from pretrain_cli.trainer import Trainer  # noqa: E402

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


def _batches():
    """Two fixed batches in turn, so 20 steps visibly lower the loss (memorisation)."""
    rng = np.random.default_rng(0)
    fixed = [rng.integers(0, CFG.vocab_size, (BS, SEQ + 1)).astype("int64") for _ in range(2)]
    for i in range(10**6):
        toks = fixed[i % 2]
        yield {"input_ids": toks[:, :-1], "labels": toks[:, 1:]}


def _losses(chosen, compile_forward):
    args = parse_config(None, ["--learning_rate", "0.003", "--warmup_steps", "2", "--max_steps", str(STEPS),
                               "--max_grad_norm", "1.0", "--weight_decay", "0.01"])
    t = args.training
    paddle.seed(1)
    model = build_model(CFG, chosen)
    schedule = build_schedule(t, Resolved(warmup_steps=2, decay_steps=STEPS))
    opt = build_optimizer(model, t, schedule)
    if compile_forward:
        model = kernels.compile_forward(model)
    trainer = Trainer(model, opt, schedule, None, args, Resolved(), ParallelConfig(), throughput=None)
    model.train()
    batches = _batches()
    return np.array([trainer.train_step(batches)[0] for _ in range(STEPS)])


def test_fast_cpu_step_matches_reference_step():
    fast = kernels.select(None, "cpu")
    ref = dataclasses.replace(fast, attention=kernels.attention_math, rope=_slice_rope, pack_mlp=False)
    want = _losses(ref, compile_forward=False)
    got = _losses(fast, compile_forward=True)
    assert want[-1] < want[0] - 0.1  # it actually trains
    print("max |Δloss| over 20 steps:", float(np.abs(got - want).max()))
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)


def test_compile_forward_keeps_the_layer_and_its_names():
    paddle.seed(1)
    model = build_model(CFG)
    names = list(model.state_dict())
    assert kernels.compile_forward(model) is model  # checkpoints keep using the same object
    assert list(model.state_dict()) == names


def test_gemm_rope_matches_slice_rope():
    rng = np.random.default_rng(2)
    q = paddle.to_tensor(rng.standard_normal((2, 5, 4, 8)).astype("float32"))
    k = paddle.to_tensor(rng.standard_normal((2, 5, 2, 8)).astype("float32"))
    ang = rng.standard_normal((5, 8)).astype("float32")
    cos, sin = paddle.to_tensor(np.cos(ang)), paddle.to_tensor(np.sin(ang))
    for a, b in zip(kernels.rope_reference(q, k, cos, sin), _slice_rope(q, k, cos, sin)):
        np.testing.assert_allclose(a.numpy(), b.numpy(), atol=1e-6, rtol=0)



def _fwd_bwd(fn, *arrays):
    ts = [paddle.to_tensor(a) for a in arrays]
    for t in ts:
        t.stop_gradient = False
    outs = fn(*ts)
    outs = outs if isinstance(outs, tuple) else (outs,)
    sum((o * o).sum() for o in outs).backward()
    return [o.numpy() for o in outs] + [t.grad.numpy() for t in ts]


def test_round2_kernels_are_bit_identical_to_round1_forms():
    """Cached RoPE matrix == per-call matrix (exactly); additive mask == `where` mask (dQ to ~1e-26)."""
    rng = np.random.default_rng(3)
    ang = rng.standard_normal((6, 8)).astype("float32")
    cos, sin = paddle.to_tensor(np.cos(ang)), paddle.to_tensor(np.sin(ang))
    q = rng.standard_normal((2, 6, 4, 8)).astype("float32")
    k = rng.standard_normal((2, 6, 2, 8)).astype("float32")
    v = rng.standard_normal((2, 6, 2, 8)).astype("float32")
    for _ in range(2):  # second pass hits the RoPE matrix cache
        old = _fwd_bwd(lambda a, b: kernels.rope_reference_uncached(a, b, cos, sin), q, k)
        new = _fwd_bwd(lambda a, b: kernels.rope_reference(a, b, cos, sin), q, k)
        for a, b in zip(old, new):
            np.testing.assert_array_equal(a, b)
    for q_len in (6, 2):  # full causal, and a KV-cache-style bottom-right mask
        old = _fwd_bwd(kernels.attention_sdpa_mask_where, q[:, :q_len], k, v)
        new = _fwd_bwd(kernels.attention_sdpa_mask, q[:, :q_len], k, v)
        for a, b in zip(old[:1] + old[2:], new[:1] + new[2:]):  # output, dK, dV: exactly equal
            np.testing.assert_array_equal(a, b)
        np.testing.assert_allclose(old[1], new[1], atol=1e-20, rtol=0)  # dQ: equal up to ~1e-26 residues
