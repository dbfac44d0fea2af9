"""The Mixture-of-Experts router: its balancing bias (chooses experts, leaves the weights unbiased, updated from the
applied training steps' loads only), the balance losses by their formulas and in the training loss and the log, and
their gradients kept under recompute and to_static."""
from types import SimpleNamespace

import numpy as np
import pytest

from pretrain_cli import runtime

paddle = runtime.import_paddle()

from moe_helpers import moe_cfg  # noqa: E402
from pretrain_cli.models import build_model  # noqa: E402
from pretrain_cli.models.moe_loss import (load_balancing_loss, log_values, sparse_blocks,  # noqa: E402
                                          update_expert_bias, z_loss)
from pretrain_cli.ops import compiled_forward, kernels  # noqa: E402
from pretrain_cli.run_config import MoeConfig  # noqa: E402


def test_router_bias_chooses_experts_but_the_weights_stay_unbiased():
    cfg = moe_cfg(num_experts=4, num_experts_per_tok=2, norm_topk_prob=False)
    paddle.seed(0)
    model = build_model(cfg, kernels.select(None, "cpu"), MoeConfig(bias_update_rate=1e-3))
    gate = sparse_blocks(model)[0].gate
    assert gate.e_score_correction_bias.stop_gradient and gate.e_score_correction_bias.dtype == paddle.float32
    assert gate.e_score_correction_bias.name not in {p.name for p in model.parameters() if not p.stop_gradient}
    x = paddle.randn([5, cfg.hidden_size])
    plain = gate(x)
    gate.e_score_correction_bias.set_value(paddle.to_tensor([10.0, 10.0, -10.0, -10.0]))
    biased = gate(x)
    assert set(biased.indices.numpy().reshape(-1)) == {0, 1}  # the bias decides: experts 0 and 1 for every token
    np.testing.assert_allclose(biased.weights.numpy(),
                               np.take_along_axis(plain.scores.numpy(), biased.indices.numpy(), -1), rtol=1e-6)
    cfg_norm = moe_cfg(num_experts=4, num_experts_per_tok=2, norm_topk_prob=True)
    normed = build_model(cfg_norm, kernels.select(None, "cpu"))
    w = sparse_blocks(normed)[0].gate(x).weights.numpy()
    np.testing.assert_allclose(w.sum(-1), 1.0, rtol=1e-6)


def test_bias_update_lowers_the_busiest_expert_and_raises_the_idle_ones():
    cfg = moe_cfg(num_experts=4, num_experts_per_tok=1)
    model = build_model(cfg, kernels.select(None, "cpu"), MoeConfig(bias_update_rate=0.01))
    block = sparse_blocks(model)[0]
    block.step_load = paddle.to_tensor([6.0, 1.0, 1.0, 0.0])  # mean 2
    update_expert_bias(model, 0.01)
    np.testing.assert_allclose(block.gate.e_score_correction_bias.numpy(), [-0.01, 0.01, 0.01, 0.01])
    assert block.step_load is None and not sparse_blocks(model)[1].gate.e_score_correction_bias.numpy().any()


def test_the_expert_load_counts_training_forwards_only_and_a_skipped_step_s_load_moves_no_bias(monkeypatch):
    """Evaluation forwards (eval mode) once added their tokens to the logged load and to the next bias update, and
    a step the spike guard withheld left its counts for the next update: now the update sees the applied step's
    loads alone, and an eval forward counts nothing."""
    from pretrain_cli.distributed.strategies.strategy import Strategy
    from pretrain_cli.models import moe_loss
    from pretrain_cli.run_config import Schedule
    from pretrain_cli.run_layout import ParallelConfig
    from pretrain_cli.training.precision import Fp32
    from pretrain_cli.training.step import Layout, Step

    paddle.seed(0)
    model = build_model(moe_cfg(), kernels.select(None, "cpu"), MoeConfig(bias_update_rate=0.01))
    rng = np.random.default_rng(0)
    batches = [{"input_ids": ids, "labels": ids} for ids in (rng.integers(0, 512, (2, 8)) for _ in range(3))]
    model.eval()
    model(paddle.to_tensor(batches[0]["input_ids"]))
    assert all(b.load is None and b.step_load is None for b in sparse_blocks(model))  # eval: nothing counted
    model.train()
    seen = []  # each update's counts, and what the step's own forward counted

    def update(m, rate, *reduce):
        seen.append([b.step_load.numpy().copy() for b in sparse_blocks(m)])
        seen.append([b.record.counts.numpy().copy() for b in sparse_blocks(m)])

    monkeypatch.setattr(moe_loss, "update_expert_bias", update)
    verdicts = iter(["loss spike", None])  # the first step withheld, the second applied
    guard = SimpleNamespace(check=lambda stats, loss, norm: next(verdicts), accept=lambda stats, loss, norm: None)
    run = SimpleNamespace(loop=SimpleNamespace(grad_accum=1), schedule=Schedule("constant", 0.1, 0.1, 0, 10),
                          optimizer=SimpleNamespace(max_grad_norm=0.0), moe=MoeConfig(bias_update_rate=0.01))
    opt = paddle.optimizer.SGD(learning_rate=0.0, parameters=model.parameters())
    from pretrain_cli.distributed.comms.comm import NoComm

    step = Step(run, NoComm(), guard)  # one process: the verdict's sum is its own loss
    layout = Layout(model, opt, Fp32(), Strategy(ParallelConfig()), model)
    state = SimpleNamespace(global_step=0, spike_stats={})
    data = iter(batches[1:])
    assert step(layout, data, state).outcome == "spike" and not seen
    assert all(b.step_load is not None for b in sparse_blocks(model))  # the withheld step's counts ...
    assert step(layout, data, state).outcome == "applied"
    for load, own in zip(*seen):  # ... are not in the next update's
        np.testing.assert_array_equal(load, own)


def test_balance_losses_by_their_formulas():
    rng = np.random.default_rng(3)
    logits = [rng.standard_normal((10, 4)).astype("float32") for _ in range(2)]
    probs = [np.exp(l) / np.exp(l).sum(-1, keepdims=True) for l in logits]
    top = [np.argsort(-p, -1)[:, :2] for p in probs]
    f = np.bincount(np.concatenate(top).reshape(-1), minlength=4) / 20
    want = 4 * (f * np.concatenate(probs).mean(0)).sum()
    got = load_balancing_loss([paddle.to_tensor(l) for l in logits], 4, 2)
    assert float(got) == pytest.approx(want, rel=1e-5)
    # "global": the counts summed over (here: a second, identical) data-parallel rank first: the same shares
    twice = load_balancing_loss([paddle.to_tensor(l) for l in logits], 4, 2, reduce_counts=lambda c: c * 2)
    assert float(twice) == pytest.approx(want, rel=1e-5)
    lse = [np.log(np.exp(l).sum(-1)) for l in logits]
    assert float(z_loss([paddle.to_tensor(l) for l in logits])) == pytest.approx(
        np.mean([np.mean(v ** 2) for v in lse]), rel=1e-5)


def test_the_training_loss_adds_the_router_losses_and_the_log_reads_them():
    cfg = moe_cfg()
    paddle.seed(0)
    model = build_model(cfg, kernels.select(None, "cpu"), MoeConfig(z_loss_coef=0.01))
    ids = paddle.to_tensor(np.random.default_rng(0).integers(0, 512, (2, 12)).astype("int64"))
    model.eval()
    ce_sum, count = model(ids, labels=ids)
    model.train()
    total, _ = model(ids, labels=ids)
    logits = [b.record.routing.logits for b in sparse_blocks(model)]
    extra = 0.001 * float(load_balancing_loss(logits, 8, 2)) + 0.01 * float(z_loss(logits))
    assert float(total / count) == pytest.approx(float(ce_sum / count) + extra, rel=1e-6)
    values = log_values(model)
    assert set(values) >= {"aux_loss", "z_loss", "moe_max_expert_share", "moe_dropped_share"}
    assert len(values["moe_expert_share_per_layer"]) == 2 and values["moe_dropped_share"] == 0
    assert 1 / 8 <= values["moe_max_expert_share"] <= 1
    assert log_values(model) == {}  # read and reset: nothing counted since


def test_recompute_keeps_the_router_losses_gradients():
    """The non-reentrant recompute (the default) runs the first forward under autograd: the router losses'
    gradients reach the router exactly as without recompute (the reentrant one loses them: refused above)."""
    from pretrain_cli.models.recompute import apply_recompute
    from pretrain_cli.run_config import Recompute

    cfg = moe_cfg()
    ids = paddle.to_tensor(np.random.default_rng(0).integers(0, 512, (2, 16)).astype("int64"))

    def grads(recompute):
        paddle.seed(0)
        model = apply_recompute(build_model(cfg, kernels.select(None, "cpu"), MoeConfig(0.5, z_loss_coef=0.1)),
                                recompute)
        total, count = model(ids, labels=ids)
        (total / count).backward()
        return {n: p.grad.numpy() for n, p in model.named_parameters() if p.grad is not None}

    plain, recomputed = grads(None), grads(Recompute("full", False))
    assert sorted(plain) == sorted(recomputed) and "model.layers.0.mlp.gate.weight" in plain
    for name in plain:
        np.testing.assert_allclose(recomputed[name], plain[name], atol=1e-7, err_msg=name)


def test_to_static_traces_the_moe_model_to_the_eager_loss_gradients_and_load():
    from pretrain_cli.models.moe_loss import log_values

    cfg = moe_cfg()
    ids = paddle.to_tensor(np.random.default_rng(0).integers(0, 512, (2, 16)).astype("int64"))

    def run(static):
        paddle.seed(0)
        model = build_model(cfg, kernels.select(None, "cpu"), MoeConfig(0.5))
        if static:
            model = compiled_forward.compile_forward(model)
        total, count = model(ids, labels=ids)
        (total / count).backward()
        return float(total / count), model.model.layers[0].mlp.gate.weight.grad.numpy(), log_values(model)

    (eager, g_eager, load_eager), (static, g_static, load_static) = run(False), run(True)
    assert static == pytest.approx(eager, abs=1e-6) and load_static == load_eager
    np.testing.assert_allclose(g_static, g_eager, atol=1e-7)
