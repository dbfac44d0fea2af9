"""DeepSeek's routing beyond what the transformers parity covers (tests/parity/test_deepseek_parity.py): the
sequence-wise balance loss against its formula written out, the auxiliary-loss-free balancing bias lowering
the busiest expert's share from a collapsed start while a micro DeepSeek-V3 trains on a skewed corpus, which
routing keys each family takes (as transformers' routers), and the configs it refuses."""
import numpy as np
import pytest

from pretrain_cli import runtime

paddle = runtime.import_paddle()

from pretrain_cli.models import build_model  # noqa: E402
from pretrain_cli.errors import UserError  # noqa: E402
from pretrain_cli.models.config import ModelConfig  # noqa: E402
from pretrain_cli.models.deepseek_moe import GroupLimitedRouter, sequence_balance_loss  # noqa: E402
from pretrain_cli.models.moe import Routing  # noqa: E402
from pretrain_cli.models.moe_loss import read_load, sparse_blocks, update_expert_bias  # noqa: E402
from pretrain_cli.ops import kernels  # noqa: E402
from pretrain_cli.run_config import KernelConfig, MoeConfig  # noqa: E402

# a skewed corpus: token t has weight 1/(t+1) (Zipf over the vocabulary), every token still present
CORPUS = np.repeat(np.arange(64), (64 / np.arange(1, 65)).astype(int) + 1)
MICRO = dict(model_type="deepseek_v3", vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
             num_attention_heads=2, max_position_embeddings=64, q_lora_rank=16, kv_lora_rank=12,
             qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8, num_experts=8, num_experts_per_tok=2,
             moe_intermediate_size=16, n_shared_experts=1, first_k_dense_replace=1, n_group=4, topk_group=2,
             routed_scaling_factor=2.5, norm_topk_prob=True, topk_method="noaux_tc", num_nextn_predict_layers=0)


def test_sequence_balance_loss_is_the_papers_formula():
    rng = np.random.default_rng(0)
    bsz, seq, experts, k = 3, 5, 6, 2
    scores = rng.uniform(0.05, 1.0, (bsz * seq, experts)).astype("float32")
    indices = np.argsort(-scores, axis=-1)[:, :k]
    routing = Routing(None, paddle.to_tensor(scores), paddle.to_tensor(indices), None)
    got = float(sequence_balance_loss(routing, bsz, seq, k, normalise=True))
    want = 0.0
    for b in range(bsz):  # DeepSeek-V3 eqs. 17-20, one sequence at a time
        s = scores[b * seq:(b + 1) * seq]
        chosen = indices[b * seq:(b + 1) * seq]
        f = np.array([experts / (k * seq) * (chosen == i).sum() for i in range(experts)])
        p = (s / s.sum(axis=-1, keepdims=True)).mean(axis=0)
        want += (f * p).sum() / bsz
    assert abs(got - want) < 1e-6
    assert abs(float(sequence_balance_loss(routing, bsz, seq, k, normalise=False))
               - sum((np.array([experts / (k * seq) * (indices[b * seq:(b + 1) * seq] == i).sum()
                                for i in range(experts)]) * scores[b * seq:(b + 1) * seq].mean(axis=0)).sum()
                     for b in range(bsz)) / bsz) < 1e-6


def _busiest_shares(rate: float, steps: int, favour: float) -> list:
    """The sparse layer's busiest-expert share per step while training on the skewed corpus from a router whose
    balancing bias starts at `favour` for expert 0 (0 for the others), the bias moving at `rate` each step (no
    balance loss: the bias alone)."""
    paddle.seed(0)
    model = build_model(ModelConfig(**MICRO), kernels.select(KernelConfig(cpu_ops=False), "cpu"),
                        MoeConfig(bias_update_rate=rate, aux_loss_coef=0.0))
    with paddle.no_grad():
        for block in sparse_blocks(model):  # V3's router always holds the bias
            block.gate.e_score_correction_bias.set_value(
                paddle.to_tensor(np.eye(MICRO["num_experts"], dtype="float32")[0] * favour))
    opt = paddle.optimizer.AdamW(learning_rate=1e-4, parameters=model.parameters())
    rng = np.random.default_rng(1)
    shares = []
    for _ in range(steps):
        ids = paddle.to_tensor(CORPUS[rng.integers(0, len(CORPUS), (4, 17))])  # skewed corpus
        total, count = model(ids[:, :-1], labels=ids[:, 1:])
        (total / count).backward()
        update_expert_bias(model, rate)
        opt.step()
        opt.clear_grad()
        shares.append(read_load(model)["max_expert_share"][0])
    return shares


def test_balancing_bias_lowers_the_busiest_experts_share():
    """A router that starts collapsed (its bias favours expert 0 by 0.1, far more than the sigmoid scores differ:
    every token picks it, a share of 1/top_k = 0.5 where balance is 1/8) on the skewed corpus: with the bias
    update (rate 1e-2, DeepSeek-V3's rule) the busiest expert's share falls from where it started within a few
    steps and stays down (measured: 0.48 -> about 0.24 from step 5 on); without it, it stays at 0.5."""
    steps = 20
    balanced = _busiest_shares(1e-2, steps, favour=0.1)
    plain = _busiest_shares(0.0, steps, favour=0.1)
    start = balanced[0]
    assert start > 0.45 and plain[0] == start, (balanced, plain)  # the same collapsed start
    assert np.mean(balanced[-10:]) < 0.6 * start, balanced
    assert min(plain) > 0.9 * start, plain


def _routing(**kw):
    """A router of MICRO changed by `kw`, on 32 random tokens: (its scores, its weights, its chosen experts)."""
    paddle.seed(0)
    router = GroupLimitedRouter(ModelConfig(**{**MICRO, **kw}), MoeConfig())
    r = router(paddle.randn([32, MICRO["hidden_size"]]))
    return r.scores.numpy(), r.weights.numpy(), r.indices.numpy()


def test_v3_normalises_a_single_expert_and_v2_never_normalises():
    """transformers' V3 router normalises whenever `norm_topk_prob` (top-1 too: each weight is then the scaling
    factor); its V2 router never does (only × routed_scaling_factor), whatever config.json says."""
    _, weights, _ = _routing(num_experts_per_tok=1)
    np.testing.assert_allclose(weights, 2.5, rtol=1e-6)
    _, weights, _ = _routing(num_experts_per_tok=1, norm_topk_prob=False)
    assert weights.max() < 2.5  # a sigmoid below 1, × 2.5
    v2 = dict(model_type="deepseek_v2", topk_method="greedy", routed_scaling_factor=1.5, num_experts_per_tok=3)
    scores, weights, chosen = _routing(**v2, norm_topk_prob=True)
    np.testing.assert_allclose(weights, np.take_along_axis(scores, chosen, axis=-1) * 1.5, rtol=1e-6)
    assert np.array_equal(weights, _routing(**v2, norm_topk_prob=False)[1])


@pytest.mark.parametrize("kw,words", [
    (dict(topk_method="greedy"), ["topk_method 'greedy'", "deepseek_v3", "use noaux_tc"]),
    (dict(topk_method="group_limited_greedy"), ["deepseek_v3", "use noaux_tc"]),
    (dict(model_type="deepseek_v2", topk_method="noaux_tc"), ["deepseek_v2", "use greedy or group_limited_greedy"]),
    (dict(n_group=3), ["n_group (3)", "must divide the 8 routed experts"]),
    (dict(num_experts_per_tok=5), ["num_experts_per_tok (5)", "raise topk_group"]),
    (dict(rope_scaling={"rope_type": "yarn", "original_max_position_embeddings": 16, "mscale_all_dim": 1.0}),
     ["rope_scaling.mscale_all_dim", "needs a numeric rope_scaling.factor"]),
])
def test_routing_and_mla_scaling_errors_are_one_line(kw, words):
    with pytest.raises(UserError) as e:
        ModelConfig(**{**MICRO, **kw}).validate("config.json")
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("config.json: ") and all(w in msg for w in words), msg


def test_yarn_without_factor_is_taken_where_mla_does_not_read_it():
    """Without `mscale_all_dim` the factor is the ratio of the context lengths (transformers' `factor: null`)."""
    ModelConfig(**{**MICRO, "rope_scaling": {"rope_type": "yarn", "original_max_position_embeddings": 16}}).validate()


def test_deepseek_v2s_norm_topk_prob_is_said_to_do_nothing():
    """transformers' V2 router ignores it (test above); a config.json setting it true gets a note, not silence."""
    import dataclasses

    from run_helpers import BASE
    from pretrain_cli.config.parser import parse_config
    from pretrain_cli.config.resolve import resolve
    from pretrain_cli.run_config import Target

    v2 = ModelConfig(**{**MICRO, "model_type": "deepseek_v2", "topk_method": "greedy", "norm_topk_prob": True})
    notes = resolve(parse_config(None, list(BASE)), v2, Target("cpu", 1, 0)).notes
    assert any(n.startswith("norm_topk_prob: true has no effect on DeepSeek-V2's routing") for n in notes), notes
    quiet = resolve(parse_config(None, list(BASE)), dataclasses.replace(v2, norm_topk_prob=False), Target("cpu", 1, 0))
    assert not any(n.startswith("norm_topk_prob") for n in quiet.notes)
