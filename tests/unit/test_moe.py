"""The Mixture-of-Experts block's parts against plain references: the grouped expert compute against one expert
at a time over its own tokens, the dispatch (with and without a capacity) against a per-expert loop over all
tokens (transformers' form), the router's bias and renormalisation, the balance losses, the bias update, and the
config rules (sparse layers, transformers 5's key name, one-line errors)."""
import json
import re
from types import SimpleNamespace

import numpy as np
import pytest

from pretrain_cli import runtime

paddle = runtime.import_paddle()

from pretrain_cli.config.presets import PRESET_DIR  # noqa: E402
from pretrain_cli.errors import UserError  # noqa: E402
from pretrain_cli.models import build_model  # noqa: E402
from pretrain_cli.models.config import ModelConfig  # noqa: E402
from pretrain_cli.models.moe import Routing, capacity, dispatch_local  # noqa: E402
from pretrain_cli.models.moe_loss import (load_balancing_loss, log_values, sparse_blocks,  # noqa: E402
                                          update_expert_bias, z_loss)
from pretrain_cli.ops import kernels  # noqa: E402
from pretrain_cli.ops.grouped import grouped_mlp_cpu, grouped_mlp_padded, grouped_mlp_segments  # noqa: E402
from pretrain_cli.run_config import MoeConfig  # noqa: E402

nn_silu = paddle.nn.functional.silu


def _cfg(name="micro-qwen3-moe", **kw) -> ModelConfig:
    d = json.loads((PRESET_DIR / name / "config.json").read_text())
    return ModelConfig.from_dict({**d, **kw})


def _silu(x):
    return x / (1 + np.exp(-x))


def _expert_np(x, g, u, d):
    return (_silu(x @ g) * (x @ u)) @ d


def _weights(rng, n, h=8, f=6):
    return [tuple(paddle.to_tensor(rng.standard_normal(s).astype("float32") * 0.3) for s in ((h, f), (h, f), (f, h)))
            for _ in range(n)]


@pytest.mark.parametrize("grouped", [grouped_mlp_padded, grouped_mlp_segments, grouped_mlp_cpu])
def test_grouped_expert_compute_equals_one_expert_at_a_time(grouped):
    rng = np.random.default_rng(0)
    counts = [3, 0, 7, 1, 0, 2]  # uneven, with idle experts
    ws = _weights(rng, len(counts))
    x = rng.standard_normal((sum(counts), 8)).astype("float32")
    out = grouped(paddle.to_tensor(x), counts, ws, kernels.swiglu_packed).numpy()
    start = 0
    for (g, u, d), n in zip(ws, counts):
        want = _expert_np(x[start:start + n], g.numpy(), u.numpy(), d.numpy())
        np.testing.assert_allclose(out[start:start + n], want, rtol=1e-5, atol=1e-5)
        start += n
    assert grouped(paddle.zeros([0, 8]), [0] * 6, ws, kernels.swiglu_packed).shape == [0, 8]


def _stand_in_batched_gemm(monkeypatch) -> list:
    """Paddle's GPU-only `batched_gemm` replaced by a reference of its contract (below); returns the list of the
    (trans_lhs, trans_rhs) flags of its calls."""
    import paddle.incubate.nn.functional as incubate

    calls = []

    def batched_gemm(lhs, rhs, batch_sizes, trans_lhs=False, trans_rhs=False):
        calls.append((trans_lhs, trans_rhs))
        # the op's contract: rows cut by batch_sizes; rhs one matrix per segment, or (trans_lhs) rows as lhs's
        assert sum(batch_sizes) == lhs.shape[0]
        assert rhs.shape[0] == (lhs.shape[0] if trans_lhs else len(batch_sizes))
        a, b, out, at = lhs.numpy(), rhs.numpy(), [], 0
        for e, n in enumerate(batch_sizes):
            if trans_lhs:
                out.append(a[at:at + n].T @ b[at:at + n])
            else:
                out.append(a[at:at + n] @ (b[e].T if trans_rhs else b[e]))
            at += n
        return paddle.to_tensor(np.stack(out) if trans_lhs else np.concatenate(out))  # stop_gradient: no backward

    monkeypatch.setattr(incubate, "batched_gemm", batched_gemm, raising=False)
    return calls


def test_the_gpu_grouped_gemm_call_with_a_reference_behind_it_trains_the_experts(monkeypatch):
    """`grouped_mlp_gpu` calls Paddle's `batched_gemm(lhs [rows, in], rhs [experts, in, out], batch_sizes)` (its
    docstring: row segment e times rhs[e]). The GPU op cannot run here, so a reference of its contract stands
    behind it, with its flags (`trans_rhs`: rhs[e] transposed; `trans_lhs`: segment e of lhs transposed times
    segment e of rhs, out `[experts, in, out]`) and, like the real op (no grad node in Paddle 3.3.1), no
    backward: its outputs are constants to autograd. The forward and every gradient must equal one expert at a
    time, an expert without rows included; fp16, which the kernel lacks, takes another path."""
    from pretrain_cli.ops import grouped

    calls = _stand_in_batched_gemm(monkeypatch)
    counts = [2, 0, 5, 1]

    def run(fn):  # the same weights and rows each time, a gradient of its own
        ws = [tuple(paddle.to_tensor(t.numpy(), stop_gradient=False) for t in trio)
              for trio in _weights(np.random.default_rng(5), len(counts))]
        x = paddle.to_tensor(np.random.default_rng(6).standard_normal((8, 8)).astype("float32"), stop_gradient=False)
        out = fn(x, counts, ws, kernels.swiglu_packed)
        (out * paddle.to_tensor(np.linspace(-1, 1, 64).reshape([8, 8]).astype("float32"))).sum().backward()
        return out.numpy(), x.grad.numpy(), [[t.grad for t in trio] for trio in ws]

    got, want = run(grouped.grouped_mlp_gpu), run(grouped_mlp_segments)
    assert (True, False) in calls and (False, True) in calls  # the backward ran through the op's own flags
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got[1], want[1], rtol=1e-5, atol=1e-6)
    for e, (g_trio, w_trio) in enumerate(zip(got[2], want[2])):
        for g, w in zip(g_trio, w_trio):
            if counts[e] == 0:  # the segments never touch an expert without rows; the stacked weights give it 0
                assert w is None and not np.any(g.numpy())
            else:
                np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=1e-5, atol=1e-6)
    calls.clear()
    monkeypatch.setattr(grouped, "grouped_mlp_cpu", lambda *a: "padded or segments")
    assert grouped.grouped_mlp_gpu(paddle.zeros([8, 8], dtype="float16"), counts, None, None) == "padded or segments"
    assert not calls


@pytest.mark.parametrize("path", ["padded", "segments", "gpu"])
def test_the_experts_keep_no_copy_of_their_weights_for_backward(path, monkeypatch):
    """A GEMM keeps its operands for backward, so `bmm(x, stack(weights))` (the padded path, the GPU's grouped GEMM)
    and `matmul(x, concat([gate, up]))` (the segments) kept a copy of a layer's expert weights until its backward:
    every routed expert again on one process, once per micro-batch in flight under a pipeline, which `plan` does not
    count (benchmarks/plan_calibration.py --stages: 15 % over the plan with experts as large as here). Now a forward
    leaves its activations allocated and no weights (here under 1/4 of the weights; it was them and more), and every
    gradient is the plain per-expert products' (x's too), each a contiguous tensor (ZeRO-3's hook all-reduces the
    buffer as laid out). The GPU path behind `_stand_in_batched_gemm`."""
    from pretrain_cli.ops import grouped

    if path == "gpu":
        _stand_in_batched_gemm(monkeypatch)
    fn = {"padded": grouped_mlp_padded, "segments": grouped_mlp_segments, "gpu": grouped.grouped_mlp_gpu}[path]
    core = paddle.base.core
    counts, h, f = [8, 3, 12, 5, 9, 7, 10, 10], 64, 256  # 64 rows; 8 experts of 3 x 64 x 256 fp32: 1.5 MiB
    rng = np.random.default_rng(7)
    init = [[rng.standard_normal(s).astype("float32") * 0.1 for s in ((h, f), (h, f), (f, h))] for _ in counts]
    x0 = rng.standard_normal((sum(counts), h)).astype("float32")
    dy = paddle.to_tensor(rng.standard_normal((sum(counts), h)).astype("float32"))

    def leaves():
        return (paddle.to_tensor(x0, stop_gradient=False),
                [tuple(paddle.to_tensor(a, stop_gradient=False) for a in trio) for trio in init])

    x, ws = leaves()
    before = core.host_memory_stat_current_value("Allocated", 0)
    out = fn(x, counts, ws, kernels.swiglu_packed)
    kept = core.host_memory_stat_current_value("Allocated", 0) - before
    weights = 4 * 3 * h * f * len(counts)
    assert kept < weights / 4, (kept, weights)
    (out * dy).sum().backward()

    rx, rws = leaves()  # the reference: one expert at a time, Paddle's own autograd, no packing
    outs = []
    for part, (g, u, d) in zip(paddle.split(rx, counts), rws):
        outs.append(paddle.matmul(nn_silu(paddle.matmul(part, g)) * paddle.matmul(part, u), d))
    (paddle.concat(outs) * dy).sum().backward()
    np.testing.assert_allclose(out.numpy(), paddle.concat(outs).numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(x.grad.numpy(), rx.grad.numpy(), rtol=1e-5, atol=1e-5)
    for trio, ref in zip(ws, rws):
        for w, r in zip(trio, ref):
            assert w.grad.is_contiguous()
            np.testing.assert_allclose(w.grad.numpy(), r.grad.numpy(), rtol=1e-4, atol=1e-5)


def test_the_cpu_default_pads_only_a_balanced_routing(monkeypatch):
    from pretrain_cli.ops import grouped

    chosen = []
    monkeypatch.setattr(grouped, "grouped_mlp_padded", lambda *a: chosen.append("padded"))
    monkeypatch.setattr(grouped, "grouped_mlp_segments", lambda *a: chosen.append("segments"))
    grouped.grouped_mlp_cpu(None, [10, 11, 9, 12], None, None)  # 4 x 12 = 48 <= 1.3 x 42
    grouped.grouped_mlp_cpu(None, [30, 4, 4, 4], None, None)  # 4 x 30 = 120 > 1.3 x 42
    assert chosen == ["padded", "segments"]
    assert kernels.select(None, "cpu").grouped_mlp is grouped.grouped_mlp_cpu


def _naive_moe(x, indices, weights, experts, keep=None):
    """transformers' MixtralExperts loop: for every expert, the tokens that chose it (all of them scanned)."""
    out = np.zeros_like(x)
    for e, (g, u, d) in enumerate(experts):
        for t, k in zip(*np.nonzero(indices == e)):
            if keep is None or keep[t, k]:
                out[t] += weights[t, k] * _expert_np(x[t:t + 1], g, u, d)[0]
    return out


def _block(num_experts=6, capacity_factor=0.0):
    cfg = _cfg(num_experts=num_experts, num_experts_per_tok=2, hidden_size=8, moe_intermediate_size=6,
               num_attention_heads=2, num_key_value_heads=1, head_dim=4)
    paddle.seed(1)
    model = build_model(cfg, kernels.select(None, "cpu"), MoeConfig(capacity_factor=capacity_factor))
    return sparse_blocks(model)[0], cfg


@pytest.mark.parametrize("capacity_factor", [0.0, 0.5])
def test_dispatch_equals_a_loop_over_experts_and_drops_the_latest_tokens_past_capacity(capacity_factor):
    block, cfg = _block(capacity_factor=capacity_factor)
    rng = np.random.default_rng(2)
    x = rng.standard_normal((16, 8)).astype("float32")
    indices = np.stack([rng.permutation(6)[:2] for _ in range(16)])  # [16, 2], skewed towards expert 0 below
    indices[:10, 0] = 0
    weights = rng.random((16, 2)).astype("float32")
    routing = Routing(None, None, paddle.to_tensor(indices), paddle.to_tensor(weights))
    out, counts, dropped = dispatch_local(paddle.to_tensor(x), routing, block.experts, 6, capacity_factor)
    experts = [tuple(p.numpy() for p in (block.experts[e].gate_proj.weight, block.experts[e].up_proj.weight,
                                         block.experts[e].down_proj.weight)) for e in range(6)]
    keep = None
    full = np.bincount(indices.reshape(-1), minlength=6)
    if capacity_factor:
        cap = capacity(16, 2, 6, capacity_factor)  # ceil(0.5 * 32 / 6) = 3
        assert cap == 3
        seen, keep = np.zeros(6, int), np.zeros_like(indices, dtype=bool)
        for t in range(16):  # the earliest tokens of each expert are kept (token order, then choice order)
            for k in range(2):
                keep[t, k] = seen[indices[t, k]] < cap
                seen[indices[t, k]] += 1
        assert float(dropped) == (~keep).sum() > 0
        np.testing.assert_array_equal(counts.numpy(), np.minimum(full, cap))
    else:
        assert float(dropped) == 0
        np.testing.assert_array_equal(counts.numpy(), full)
    np.testing.assert_allclose(out.numpy(), _naive_moe(x, indices, weights, experts, keep), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("grouped", [grouped_mlp_segments, grouped_mlp_padded])
def test_an_expert_no_token_reaches_gets_a_zero_gradient_and_the_rest_is_unchanged(grouped, monkeypatch):
    """An idle expert once got no gradient (None): paddle.DataParallel then errors and expert parallelism's
    per-parameter all-reduce ran a different number of collectives per rank. Forced idle by the balancing bias,
    expert 3 now gets zeros; the loss and every other gradient are what they were without the idle term."""
    import dataclasses

    from pretrain_cli.models.moe import Experts

    cfg = _cfg(num_experts=6, num_experts_per_tok=2)
    ids = paddle.to_tensor(np.random.default_rng(0).integers(0, 512, (2, 8)).astype("int64"))

    def run(idle):
        if not idle:
            monkeypatch.setattr(Experts, "idle", lambda self, counts: None, raising=False)  # as before
        paddle.seed(0)
        model = build_model(cfg, dataclasses.replace(kernels.select(None, "cpu"), grouped_mlp=grouped),
                            MoeConfig(bias_update_rate=1e-3))
        for block in sparse_blocks(model):
            block.gate.e_score_correction_bias.set_value(paddle.to_tensor([0, 0, 0, -1e9, 0, 0], "float32"))
        total, count = model(ids, labels=ids)
        (total / count).backward()
        assert not any(float(b.record.counts[3]) for b in sparse_blocks(model))
        monkeypatch.undo()
        return float(total / count), {n: p.grad for n, p in model.named_parameters() if not p.stop_gradient}

    (loss, grads), (loss0, grads0) = run(True), run(False)
    assert loss == loss0
    for name, g in grads.items():
        if ".experts.3." in name:
            assert g is not None and not g.numpy().any(), name
            assert (grads0[name] is None) == (grouped is grouped_mlp_segments)  # (the padded path stacks them all)
        else:
            np.testing.assert_array_equal(g.numpy(), grads0[name].numpy(), err_msg=name)


def test_expert_parallel_keeps_a_rank_s_idle_experts_in_the_graph_and_zero_fills_their_gradients():
    """GatherDispatch on a rank whose experts got no row still runs them (0 · weight), and `sync_grads` reduces
    a None gradient as zeros (`ExpertGrads.reduce`) rather than skipping its all-reduce (replicas would disagree on
    the collectives)."""
    from pretrain_cli.distributed.steps.expert_parallel import GatherDispatch, keep_held
    from pretrain_cli.distributed.strategies.expert_strategy import ExpertGrads

    class OneRank:  # an expert group of one: all-gather and reduce-scatter are the identity
        def all_gather(self, x, group, axis=0):
            return x

        def reduce_scatter(self, x, group, ep, me, axis=0):
            return x

    block, _ = _block()
    keep_held(paddle.nn.LayerList([block]), range(3, 6))  # this rank holds experts 3-5; every token goes to 0-2
    x = paddle.randn([4, 8])
    routing = Routing(None, None, paddle.to_tensor([[0, 1], [1, 2], [2, 0], [0, 1]]), paddle.full([4, 2], 0.5))
    out, counts, _ = GatherDispatch(None, 1, 0, OneRank())(x, routing, block.experts, 6)
    out.sum().backward()
    params = list(block.experts.parameters())
    assert not out.numpy().any() and counts.numpy().tolist() == [3, 3, 2, 0, 0, 0]
    assert all(p.grad is not None and not p.grad.numpy().any() for p in params)
    params = list(_block()[0].experts.parameters())  # no backward yet: every gradient None
    assert all(p.grad is None for p in params)
    ExpertGrads(SimpleNamespace(params=params, replicas=None), 2, None).reduce()
    assert all(p.grad is not None and p.grad.shape == p.shape and not p.grad.numpy().any() for p in params)


def test_router_bias_chooses_experts_but_the_weights_stay_unbiased():
    cfg = _cfg(num_experts=4, num_experts_per_tok=2, norm_topk_prob=False)
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
    cfg_norm = _cfg(num_experts=4, num_experts_per_tok=2, norm_topk_prob=True)
    normed = build_model(cfg_norm, kernels.select(None, "cpu"))
    w = sparse_blocks(normed)[0].gate(x).weights.numpy()
    np.testing.assert_allclose(w.sum(-1), 1.0, rtol=1e-6)


def test_bias_update_lowers_the_busiest_expert_and_raises_the_idle_ones():
    cfg = _cfg(num_experts=4, num_experts_per_tok=1)
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
    model = build_model(_cfg(), kernels.select(None, "cpu"), MoeConfig(bias_update_rate=0.01))
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
    step = Step(run, SimpleNamespace(mean=lambda v: v), guard)
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
    cfg = _cfg()
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


def test_sparse_layers_follow_transformers_rule_and_config_round_trips():
    cfg = _cfg(num_hidden_layers=6, decoder_sparse_step=2, mlp_only_layers=[3])
    assert cfg.sparse_layers == [1, 5]
    model = build_model(cfg, kernels.select(None, "cpu"))
    assert [i for i, layer in enumerate(model.model.layers) if hasattr(layer.mlp, "gate")] == [1, 5]
    hf = cfg.to_hf_dict()
    assert hf["num_experts"] == 8 and hf["mlp_only_layers"] == [3] and "shared_expert_intermediate_size" not in hf
    again = ModelConfig.from_dict(hf)
    assert again.sparse_layers == [1, 5] and again.num_experts_per_tok == 2
    v5 = {k: v for k, v in hf.items() if k != "num_experts"} | {"num_local_experts": 8}  # transformers 5 writes it
    assert ModelConfig.from_dict(v5).num_experts == 8 and "num_local_experts" not in ModelConfig.from_dict(v5).extra
    dense = ModelConfig.from_file(str(PRESET_DIR / "micro-qwen2")).to_hf_dict()
    assert not {"num_experts", "router_aux_loss_coef", "mlp_only_layers"} & set(dense)
    q2 = _cfg("micro-qwen2-moe").to_hf_dict()
    assert q2["shared_expert_intermediate_size"] == 64 and "attention_bias" not in q2


@pytest.mark.parametrize("change, message", [
    (dict(num_experts_per_tok=9), "num_experts_per_tok (9) exceeds num_experts (8)"),
    (dict(moe_intermediate_size=0), "moe_intermediate_size must be a positive integer"),
    (dict(mlp_only_layers="0"), "mlp_only_layers must be a list of layer indices"),
])
def test_a_wrong_moe_config_is_one_line(change, message):
    with pytest.raises(UserError, match=re.escape(message)) as e:
        _cfg(**change)
    assert "\n" not in str(e.value)


def test_moe_keys_resolve_with_one_line_errors_and_a_note_on_a_dense_model(tmp_path):
    from pretrain_cli.config.moe import resolve_moe
    from pretrain_cli.config.parser import parse_config
    from pretrain_cli.errors import Problems
    from pretrain_cli.run_layout import ParallelConfig

    def resolved(model, parallel=ParallelConfig(), **keys):
        args = parse_config(None, ["--model_name_or_path", model, "--output_dir", str(tmp_path)]
                          + [x for k, v in keys.items() for x in (f"--{k}", str(v))])
        problems, notes = Problems(), []
        moe = resolve_moe(args, ModelConfig.from_file(str(PRESET_DIR / model)), parallel, notes, problems)
        return moe, notes, problems.items

    moe, notes, errors = resolved("micro-qwen3-moe", router_z_loss_coef=0.001, capacity_factor=1.25,
                                  moe_router_bias_update_rate=0.001)
    # the balance loss's weight decided here once: config.json's router_aux_loss_coef (0.001), DeepSeek's α
    assert moe == MoeConfig(0.001, "micro_batch", 0.001, 0.001, 1.25) and not notes and not errors
    assert resolved("micro-deepseek-v3")[0].aux_loss_coef == 1e-4  # no aux_loss_alpha: the V3 paper's α
    assert resolved("micro-deepseek-v3", router_aux_loss_coef=0.02)[0].aux_loss_coef == 0.02
    _, _, errors = resolved("micro-qwen3-moe", capacity_factor=-1)
    assert errors == ["capacity_factor: must be a finite number >= 0, got -1.0"]
    _, notes, _ = resolved("micro-qwen2", router_aux_loss_coef=0.01)
    assert notes == ["router_aux_loss_coef: the model (qwen2) has no experts; no effect"]
    pp2 = ParallelConfig(world_size=2, pp_degree=2)
    _, _, errors = resolved("micro-qwen3-moe", pp2, moe_aux_loss_scope="global")
    assert len(errors) == 1 and errors[0].startswith("moe_aux_loss_scope: global sums")
    assert errors[0].endswith("use micro_batch with pipeline_parallel_degree")
    # the semi-auto engine (tp alone or with ZeRO-2/3) counts over the global batch whatever the file says, and
    # DeepSeek's balance loss is per sequence (a note): neither is refused (both were, and the user who then set
    # micro_batch was told that micro_batch is not available there)
    for model, parallel in (("micro-qwen3-moe", ParallelConfig(world_size=2, tp_degree=2)),
                            ("micro-qwen3-moe", ParallelConfig(world_size=4, dp_degree=2, tp_degree=2,
                                                               sharding_stage=3)),
                            ("micro-deepseek-v3", ParallelConfig(world_size=2, tp_degree=2, manual_tp=True)),
                            ("micro-deepseek-v3", pp2)):
        assert not resolved(model, parallel, moe_aux_loss_scope="global")[2], (model, parallel)
    _, _, errors = resolved("micro-qwen3-moe", ParallelConfig(world_size=2, pp_degree=2))
    assert not errors  # the layouts a MoE model runs under: config.refusals' MoE rows (tests/unit/test_layout_steps.py)
    _, _, errors = resolved("micro-deepseek-v3", ParallelConfig(world_size=2, tp_degree=2))
    assert not errors  # the layouts multi-head latent attention runs under: config.refusals' MLA rows
    _, _, errors = resolved("micro-qwen3-moe", ParallelConfig(world_size=2, dp_degree=2), moe_aux_loss_scope="global")
    assert not errors
    # with expert parallelism the tp ranks are the tp step's, which route the same tokens: each counted tp times, the
    # shares unchanged (tests/distributed/test_expert_tp.py runs it against one process)
    ep_tp = ParallelConfig(world_size=4, dp_degree=2, tp_degree=2, ep_degree=2, manual_tp=True)
    assert not resolved("micro-qwen3-moe", ep_tp, moe_aux_loss_scope="global")[2]
    _, _, errors = resolved("micro-qwen3-moe", recompute="true", recompute_use_reentrant="true")
    assert len(errors) == 1 and errors[0].startswith("recompute_use_reentrant: true loses the router losses'")


def test_recompute_keeps_the_router_losses_gradients():
    """The non-reentrant recompute (the default) runs the first forward under autograd: the router losses'
    gradients reach the router exactly as without recompute (the reentrant one loses them: refused above)."""
    from pretrain_cli.models.recompute import apply_recompute
    from pretrain_cli.run_config import Recompute

    cfg = _cfg()
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

    cfg = _cfg()
    ids = paddle.to_tensor(np.random.default_rng(0).integers(0, 512, (2, 16)).astype("int64"))

    def run(static):
        paddle.seed(0)
        model = build_model(cfg, kernels.select(None, "cpu"), MoeConfig(0.5))
        if static:
            model = kernels.compile_forward(model)
        total, count = model(ids, labels=ids)
        (total / count).backward()
        return float(total / count), model.model.layers[0].mlp.gate.weight.grad.numpy(), log_values(model)

    (eager, g_eager, load_eager), (static, g_static, load_static) = run(False), run(True)
    assert static == pytest.approx(eager, abs=1e-6) and load_static == load_eager
    np.testing.assert_allclose(g_static, g_eager, atol=1e-7)


def test_a_paddlenlp_saved_qwen2_moe_loads_by_its_prefix_and_layout(tmp_path):
    """PaddleNLP's Qwen2-MoE names its tensors `qwen2_moe.layers.N...` in Paddle's [in, out] layout (its
    `_get_name_mappings` transposes every Linear, the router and the experts included)."""
    from safetensors.numpy import save_file

    from pretrain_cli.training.weight_source import load_weights

    cfg = _cfg("micro-qwen2-moe", tie_word_embeddings=False)
    paddle.seed(3)
    src = build_model(cfg, kernels.select(None, "cpu"))
    tensors = {n.replace("model.", "qwen2_moe.", 1): p.numpy() for n, p in src.named_parameters()}
    save_file(tensors, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps(cfg.to_hf_dict()))
    paddle.seed(4)
    ours = build_model(cfg, kernels.select(None, "cpu"))
    assert load_weights(ours, tmp_path) == "paddlenlp"
    for (name, a), (_, b) in zip(src.named_parameters(), ours.named_parameters()):
        np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=name)


@pytest.mark.parametrize("keys,world,refused", [
    (["--tensor_parallel_degree", "2"], 2, None),
    (["--sharding", "stage3", "--tensor_parallel_degree", "2"], 4, None),
    (["--pipeline_parallel_degree", "2", "--gradient_accumulation_steps", "4", "--router_z_loss_coef", "0.001",
      "--moe_router_bias_update_rate", "0.001"], 2, None),  # config.json's balance loss, the z-loss and the bias
    (["--tensor_parallel_degree", "2", "--sequence_parallel", "true"], 2,
     "sequence_parallel: true with a Mixture-of-Experts model (qwen3_moe) is not supported"),
])
def test_moe_layouts_resolve_or_are_refused_in_one_line(keys, world, refused):
    """tp, ZeRO-3 and a pipeline with every router term on resolve for a MoE model; sequence parallelism is refused
    by config.refusals' MoE row, in one line."""
    from run_helpers import resolve_run

    if refused is None:
        run = resolve_run(*keys, world=world, model="micro-qwen3-moe")
        assert run.parallel.world_size == world
        return
    with pytest.raises(UserError) as e:
        resolve_run(*keys, world=world, model="micro-qwen3-moe")
    lines = [line for line in str(e.value).splitlines() if refused in line]
    assert len(lines) == 1, str(e.value)
