"""`plan` and `plan --fit` for Mixture-of-Experts models: total vs active parameters, FLOPs on the active ones,
experts ÷ expert_parallel_degree in memory, the dispatch on its link, and the EP layouts --fit tries; the
`expert_parallel_degree` key's refusals and the ep groups of the Topology."""
from pathlib import Path
from types import SimpleNamespace

import pytest

from plan_helpers import fit, plan
from pretrain_cli.config.presets import resolve_model_dir
from pretrain_cli.distributed.layout.topology import Topology
from pretrain_cli.errors import UserError
from pretrain_cli.models.config import ModelConfig
from pretrain_cli.models.flops import flops_per_token, param_counts
from pretrain_cli.planning.experts import dispatch_bytes, expert_params
from pretrain_cli.run_layout import ParallelConfig

LLAMA = Path(__file__).resolve().parents[1] / "e2e" / "paddlenlp_configs" / "llama_pretrain_argument.json"
Q30 = ["--model_name_or_path", "Qwen/Qwen3-30B-A3B"]
Q235 = ["--model_name_or_path", "Qwen/Qwen3-235B-A22B"]
DP = ["--tensor_parallel_degree", "1", "--sharding", ""]  # the file's tp 2 x ZeRO-2 off: EP runs with data parallelism


def _cfg(name: str) -> ModelConfig:
    return ModelConfig.from_file(str(resolve_model_dir(name)))


def test_total_and_active_parameters_are_the_published_ones():
    """Qwen3-30B-A3B: 30.5 B total, 3.3 B activated; Qwen3-235B-A22B: 235 B, 22 B (the model cards); FLOPs per
    token count the active ones only."""
    for name, total, active in (("Qwen/Qwen3-30B-A3B", 30.5, 3.3), ("Qwen/Qwen3-235B-A22B", 235, 22)):
        cfg = _cfg(name)
        c = param_counts(cfg)
        digits = 10 if total < 100 else 1  # the cards truncate: 3.35 B is "3.3B"
        assert int(c["total"] / 1e9 * digits) / digits == total
        assert int(c["active"] / 1e9 * (10 if active < 10 else 1)) / (10 if active < 10 else 1) == active
        assert c["experts"] == sum(cfg.is_sparse_layer(i) for i in range(cfg.num_hidden_layers)) * \
            cfg.num_experts * 3 * cfg.hidden_size * cfg.moe_intermediate_size
        attn = 12 * cfg.num_hidden_layers * cfg.num_attention_heads * cfg.head_dim * 4096
        assert flops_per_token(cfg, 4096) == 6 * (c["active"] - c["embedding"]) + attn  # untied: the head counts
    dense = param_counts(_cfg("Qwen/Qwen3-8B"))
    assert dense["active"] == dense["total"] and dense["experts"] == 0


def test_plan_prints_active_parameters_and_the_expert_layout(capsys):
    from pretrain_cli.cli import main as cli_main

    code = cli_main(["plan", str(LLAMA), *Q30, *DP, "--expert_parallel_degree", "8", "--device", "H100",
                     "--gpus", "16"])
    out = capsys.readouterr().out
    assert code in (0, 1)
    assert "active per token: 3.35B [3,353,032,704]" in out and "1/8 on each rank" in out
    assert "128 experts (8 per token)" in out and "6N_active" in out
    assert "ep 8: 2 expert groups" in out and "(0, 1, 2, 3, 4, 5, 6, 7): inside a node" in out
    assert "expert dispatch" in out and "(in-node 450 GB/s)" in out


def test_experts_are_divided_by_ep_and_the_dispatch_takes_its_link():
    r8 = plan(str(LLAMA), [*Q30, *DP, "--expert_parallel_degree", "8"], device="H100", gpus=16,
              suggest_changes=False)
    r16 = plan(str(LLAMA), [*Q30, *DP, "--expert_parallel_degree", "16"], device="H100", gpus=16,
               suggest_changes=False)
    experts = param_counts(_cfg("Qwen/Qwen3-30B-A3B"))["experts"]
    # bf16 O2: weights 2 bytes a parameter; half the experts go away from ep 8 to 16
    saved = (r8["memory_breakdown_gib"]["weights"] - r16["memory_breakdown_gib"]["weights"]) * 2**30
    assert saved == pytest.approx(experts * 2 * (1 / 8 - 1 / 16))
    assert r8["parallel"]["ep"] == 8 and r16["parallel"]["ep"] == 16
    assert r8["layout"]["axes"]["ep"]["inside_node"] and not r16["layout"]["axes"]["ep"]["inside_node"]
    # the dispatch a GPU runs (NCCL's all-to-all): per sparse layer (48) each token's 8 rows to their experts' ranks
    # and back, forward and backward, (ep - 1)/ep x 8 rows x 4096 tokens x 2048 x 2 bytes each, 16 micro-batches
    per_micro = 48 * 4 * 4096 * 2048 * 2
    assert r8["traffic_gb_per_step"]["ep"] * 1e9 == pytest.approx(16 * per_micro * 8 * 7 / 8)
    assert r16["traffic_gb_per_step"]["ep"] * 1e9 == pytest.approx(16 * per_micro * 8 * 15 / 16)
    # at ep = top_k (8) that is what the all-gather form (CPU's) sends, ep - 1 token copies; above it ep/top_k times more
    shape = dict(model=_cfg("Qwen/Qwen3-30B-A3B"), recompute="selective", micro_batch=1, seq_len=4096, compute_bytes=2)
    sent = {(ep, d): dispatch_bytes(SimpleNamespace(**shape, ep=ep, device=d), 48) for ep in (8, 16)
            for d in ("gpu", "cpu")}
    assert sent[8, "cpu"] == pytest.approx(sent[8, "gpu"]) == pytest.approx(per_micro * 7)
    assert sent[16, "cpu"] == pytest.approx(2 * sent[16, "gpu"])


def test_ep_with_tp_plans_each_expert_cut_tp_ways_on_its_holders():
    """ep 8 x tp 2 on 16 GPUs (one expert group of the 8 data ranks at each tp position): the experts ÷ 16 on a rank,
    as they are ÷ 16 under ep 16 alone (`planning.experts.expert_params`), and the tp step's engine."""
    tp = plan(str(LLAMA), [*Q30, *DP, "--tensor_parallel_degree", "2", "--expert_parallel_degree", "8"],
              device="H100", gpus=16, suggest_changes=False)
    assert (tp["parallel"]["ep"], tp["parallel"]["tp"]) == (8, 2)
    cfg = _cfg("Qwen/Qwen3-30B-A3B")
    assert expert_params(SimpleNamespace(model=cfg, ep=8, tp=2)) == param_counts(cfg)["experts"] / 16


@pytest.mark.parametrize("model,gpus,change", [
    ("Qwen/Qwen3-30B-A3B", 16, {"pipeline_parallel_degree": 4, "expert_parallel_degree": None,
                                "tensor_parallel_degree": 2}),
    ("Qwen/Qwen3-235B-A22B", 64, {"pipeline_parallel_degree": 8, "expert_parallel_degree": 8, "sharding": None,
                                  "recompute": True}),
])
def test_fit_finds_a_layout_that_runs_for_qwen3_moe(model, gpus, change):
    """Two nodes of 8 H100 for Qwen3-30B-A3B, eight for Qwen3-235B-A22B, with config.json's balance loss on (a
    pipeline runs it). Qwen3-30B-A3B: 4 stages of 12 layers x tp 2 (the tp pair on NVLink, the stages across the
    nodes; EP 8 x ZeRO-1, PaddleNLP's layout, is predicted slower: docs/PLAN.md). Qwen3-235B-A22B: 8 stages with EP 8
    over each stage's eight data ranks and the file's ZeRO-1 kept (each stage's own experts' state whole, the rest's
    sharded) (EP's replicated 8 B parameters and whole expert state do not fit without the pipeline; tp 4 x ZeRO-3
    fits but gathers across the nodes). The last stage also runs the LM head (151,936 x hidden), so many short
    stages leave it the slowest by far: while every stage was an average one the fit chose 16 stages of 3 layers
    and 32 of 3 (or 4). Steady state and start-up both within the budget, and re-planned it says so."""
    base = ["--model_name_or_path", model, "--tensor_parallel_degree", "1", "--sharding", "stage1"]
    f = fit(str(LLAMA), base, device="H100", gpus=gpus)
    assert f["after"] is not None, f
    assert {k: f["change"].get(k) for k in change} == change, f["change"]
    assert max(f["after"]["memory_gib"], f["after"]["startup_gib"]) <= f["budget_gib"]
    again = plan(str(LLAMA), base + _tokens(f["change"]), device="H100", gpus=gpus, suggest_changes=False)
    assert again["fits"] and again["memory_gib"] == pytest.approx(f["after"]["memory_gib"])


def _tokens(change: dict) -> list[str]:
    import json

    return [tok for k, v in change.items() for tok in (f"--{k}", json.dumps(v) if isinstance(v, bool) else str(v))]


@pytest.mark.parametrize("extra,says", [
    (["--model_name_or_path", "Qwen/Qwen3-8B"], "needs a Mixture-of-Experts model"),
    (["--expert_parallel_degree", "3"], r"does not divide num_experts \(128\)"),
    (["--expert_parallel_degree", "32"], "does not divide the 16 data ranks"),
    (["--sharding", "stage2"], "with sharding: stage2 is not supported without a pipeline, tensor or context parallelism"),
    (["--sharding", "stage3"], "with sharding: stage3 is not supported"),
    (["--capacity_factor", "1.25"], "runs dropless"),
])
def test_expert_parallel_degree_is_refused_in_one_line(extra, says):
    base = [*Q30, *DP, "--expert_parallel_degree", "8"]
    with pytest.raises(UserError, match=says) as e:
        plan(str(LLAMA), base + extra, device="H100", gpus=16, suggest_changes=False)
    assert any(line.startswith("expert_parallel_degree: ") and says.replace("\\", "") in line
               for line in str(e.value).splitlines())


@pytest.mark.parametrize("stage", [1, 2])
@pytest.mark.parametrize("axes", [("--pipeline_parallel_degree",), ("--tensor_parallel_degree",),
                                  ("--pipeline_parallel_degree", "--tensor_parallel_degree")])
def test_expert_parallelism_with_zero1_or_zero2_in_a_pipeline_or_with_tp_is_planned(axes, stage):
    """EP x ZeRO-1/2 on fleet's hybrid groups runs (`ExpertHybrid`: PaddleNLP's DeepSeek-V3 layout), with tp inside
    the pipeline's stages too; all but pp/tp x ZeRO-1 were refused as not run (tests/distributed/
    test_expert_zero1_hybrid.py runs them now)."""
    extra = [tok for axis in axes for tok in (axis, "2")] + ["--sharding", f"stage{stage}"]
    data = 16 // 2 ** len(axes)
    parallel = plan(str(LLAMA), [*Q30, *DP, "--expert_parallel_degree", str(data), *extra], device="H100", gpus=16,
                    suggest_changes=False)["parallel"]
    assert (parallel["ep"], parallel["sharding_stage"], parallel["sharding_degree"], parallel["pp"] * parallel["tp"]) \
        == (data, stage, data, 2 ** len(axes))


def test_expert_groups_are_consecutive_data_ranks_and_replicas_hold_the_same_experts():
    par = ParallelConfig(world_size=8, dp_degree=8, ep_degree=4, rank=5)
    topo = Topology.of(par)
    assert topo.expert_group() == (4, 5, 6, 7) and topo.expert_rank() == 1
    assert topo.expert_replicas() == (1, 5)
    assert sorted({topo.expert_group(r) for r in range(8)}) == [(0, 1, 2, 3), (4, 5, 6, 7)]


def test_the_dispatch_counts_deepseek_v3s_multi_token_prediction_layer():
    """DeepSeek-V3's MTP module is a sparse decoder layer whose experts expert parallelism dispatches too."""
    cfg = _cfg("micro-deepseek-v3")
    assert cfg.num_nextn_predict_layers == 1
    sparse = len(cfg.sparse_layers)
    shape = dict(model=cfg, recompute="selective", micro_batch=1, seq_len=64, compute_bytes=2, device="cpu", ep=2)
    per_layer = 4 * (2 - 1) * 64 * cfg.hidden_size * 2
    assert dispatch_bytes(SimpleNamespace(**shape), sparse + 1) == pytest.approx((sparse + 1) * per_layer)
    from pretrain_cli.planning.memory import Setup
    from pretrain_cli.planning.speed import stage_traffic
    from pretrain_cli.run_layout import ParallelConfig

    s = Setup(model=cfg, micro_batch=1, seq_len=64, compute_bytes=2, device="cpu", ep=2)  # one stage: all of them
    t = stage_traffic(s, ParallelConfig(world_size=2, dp_degree=2, ep_degree=2), param_counts(cfg))
    assert len(t) == 1 and t[0]["ep"] == pytest.approx((sparse + 1) * per_layer)


def test_fit_tries_moe_under_context_parallelism_with_a_pipeline_zero2_and_ep():
    """Mixture-of-Experts under context parallelism runs with a pipeline, ZeRO-1/2 and EP (docs/DISTRIBUTED.md), so
    --fit's candidates hold cp x pp, cp with stage2 and cp x ep with stage2, each resolved by `config.resolve` (no
    refusal). Qwen3-30B-A3B at 64K tokens on 16 H100: the fastest layout that fits is cp 4 x pp 4 (64.42 GiB of the
    72 budget; cp alone would leave every rank all 30.5 B parameters, and tp and ZeRO-3 are refused with cp for MoE);
    layouts without cp fit too, slower, pp 2 x ep 8 the fastest of them (62.23 GiB with ZeRO-1; docs/PLAN.md's CP
    row). At 32K on 8 H100 nothing fits: cp splits no parameter, so the least a cp layout needs is cp 2 x pp 4's
    87.27 GiB, and without cp tp 4 x pp 2's 74.22 GiB."""
    from pretrain_cli.planning.fit_candidates import _splits

    current = {"sharding": "stage1", "tensor_parallel_degree": 1}
    keys = [k for _, k in _splits(current, 8, 32768, experts=128)]
    for want in ({"context_parallel_degree": 2, "pipeline_parallel_degree": 4, "sharding": "stage1"},
                 {"context_parallel_degree": 8, "sharding": "stage2", "pipeline_parallel_degree": 1},
                 {"context_parallel_degree": 2, "expert_parallel_degree": 4, "sharding": "stage2",
                  "pipeline_parallel_degree": 1}):
        assert any(all(k.get(a) == b for a, b in want.items()) for k in keys), want
        plan(str(LLAMA), Q30 + ["--tensor_parallel_degree", "1", "--max_seq_length", "32768"]
             + _tokens(want), device="H100", gpus=8, suggest_changes=False)  # resolves: no UserError
    base = Q30 + ["--tensor_parallel_degree", "1", "--sharding", "stage1", "--max_seq_length", "65536"]
    f = fit(str(LLAMA), base, device="H100", gpus=16)
    assert f["after"] is not None and f["change"]["context_parallel_degree"] > 1
    assert f["change"]["pipeline_parallel_degree"] > 1, f["change"]
