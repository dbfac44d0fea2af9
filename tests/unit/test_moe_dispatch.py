"""The Mixture-of-Experts dispatch (with and without a capacity) against a per-expert loop over all tokens
(transformers' form), and the experts no token reaches: a zero gradient, on one process and on an expert-parallel
rank."""
from types import SimpleNamespace

import numpy as np
import pytest

from pretrain_cli import runtime

paddle = runtime.import_paddle()

from moe_helpers import expert_np, moe_cfg  # noqa: E402
from pretrain_cli.models import build_model  # noqa: E402
from pretrain_cli.models.moe import Routing, capacity, dispatch_local  # noqa: E402
from pretrain_cli.models.moe_loss import sparse_blocks  # noqa: E402
from pretrain_cli.ops import kernels  # noqa: E402
from pretrain_cli.ops.grouped import grouped_mlp_padded, grouped_mlp_segments  # noqa: E402
from pretrain_cli.run_config import MoeConfig  # noqa: E402


def _naive_moe(x, indices, weights, experts, keep=None):
    """transformers' MixtralExperts loop: for every expert, the tokens that chose it (all of them scanned)."""
    out = np.zeros_like(x)
    for e, (g, u, d) in enumerate(experts):
        for t, k in zip(*np.nonzero(indices == e)):
            if keep is None or keep[t, k]:
                out[t] += weights[t, k] * expert_np(x[t:t + 1], g, u, d)[0]
    return out


def _block(num_experts=6, capacity_factor=0.0):
    cfg = moe_cfg(num_experts=num_experts, num_experts_per_tok=2, hidden_size=8, moe_intermediate_size=6,
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


def test_evaluation_is_dropless_under_a_capacity():
    """The run's own eval_loss dropped tokens under capacity_factor where `eval` and transformers ran dropless
    (1.25 at step 200: 6.4602 in the run, 6.4582 from `eval`): in eval mode the block computes every assignment,
    as the same block without a capacity does; in training it drops as before."""
    x = paddle.to_tensor(np.random.default_rng(3).standard_normal((2, 8, 8)).astype("float32"))
    capped, _ = _block(capacity_factor=0.5)
    free, _ = _block(capacity_factor=0.0)  # (the same seed: the same weights)
    capped.eval()
    free.eval()
    np.testing.assert_array_equal(capped(x).numpy(), free(x).numpy())
    assert float(capped.record.dropped) == 0
    capped.train()
    capped(x)
    assert float(capped.record.dropped) > 0


@pytest.mark.parametrize("grouped", [grouped_mlp_segments, grouped_mlp_padded])
def test_an_expert_no_token_reaches_gets_a_zero_gradient_and_the_rest_is_unchanged(grouped, monkeypatch):
    """An idle expert once got no gradient (None): paddle.DataParallel then errors and expert parallelism's
    per-parameter all-reduce ran a different number of collectives per rank. Forced idle by the balancing bias,
    expert 3 now gets zeros; the loss and every other gradient are what they were without the idle term."""
    import dataclasses

    from pretrain_cli.models.moe import Experts

    cfg = moe_cfg(num_experts=6, num_experts_per_tok=2)
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
