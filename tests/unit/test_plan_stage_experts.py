"""`plan` under a pipeline of a Mixture-of-Experts model: each stage holds its own layers (DeepSeek's first dense ones,
the sparse ones' routed experts ÷ ep, the MTP module's on the last stage), and under expert parallelism with ZeRO-1
only those experts' AdamW state stays whole (`memory.stage_experts`). Counting the whole model's experts (÷ ep) on
every stage as its unsharded state, and a uniform 1/pp share of them as its parameters, would plan DeepSeek-V3 at
pp 16 × ep 16 at 293 GiB of optimizer state with `sharding: stage1` against 42 GiB without."""
import dataclasses

import pytest

from pretrain_cli.config.presets import resolve_model_dir
from pretrain_cli.distributed.strategies.hybrid import stage_of
from pretrain_cli.models.config import ModelConfig
from pretrain_cli.models.stages import stage_bounds, stage_layers
from pretrain_cli.planning.memory import GIB, Setup, pipeline_stages, stage_experts, stage_params

V3 = ModelConfig.from_file(str(resolve_model_dir("deepseek-ai/DeepSeek-V3")))
MICRO = ModelConfig.from_file(str(resolve_model_dir("micro-deepseek-v3")))


def test_interleaved_stages_hold_every_pth_chunk():
    """fleet's interleaved PipelineLayer: chunk c of L/(P·V) layers on stage c mod P."""
    assert stage_layers(12, 3, 2) == ((0, 1, 6, 7), (2, 3, 8, 9), (4, 5, 10, 11))
    assert stage_layers(10, 4) == ((0, 1), (2, 3, 4), (5, 6, 7), (8, 9))  # `stage_bounds`' runs without virtual stages
    for L, P, V in ((12, 3, 2), (61, 16, 1), (24, 4, 3)):
        bounds = stage_bounds(L, P * V)
        assert all(stage_of(f"model.layers.{i}.mlp.gate.weight", bounds, P) == s
                   for s, layers in enumerate(stage_layers(L, P, V)) for i in layers)


def test_deepseek_v3_pp16_ep16_zero1_keeps_each_stages_own_experts_state_whole():
    """By hand: one sparse layer's 256 experts are 256 × 3 × 7168 × 2048 parameters, 1/16 of them on a rank. Of the
    61 layers (3, 4 x 13, 3, 3 a stage) stage 0 holds the 3 dense ones, stages 1-13 four sparse, stage 14 three and
    stage 15 three and the MTP module's sparse layer. ZeRO-1 over the 16 data ranks shards the rest's AdamW state."""
    s = Setup(model=V3, micro_batch=1, seq_len=4096, compute_bytes=2, amp_level="O2", attention="flash",
              recompute="full", fused_rms_norm=True, fused_rope=True, pp=16, ep=16, micro_batches=16)
    layer = 256 * 3 * 7168 * 2048 / 16
    assert [stage_experts(s, st) / layer for st in range(16)] == [0] + [4] * 13 + [3, 4]
    zero1 = pipeline_stages(dataclasses.replace(s, sharding_stage=1, sharding_degree=16))
    for st, (sharded, whole) in enumerate(zip(zero1, pipeline_stages(s))):
        n, own = stage_params(s, st), stage_experts(s, st)
        assert sharded["optimizer_state"] == pytest.approx(8 * ((n - own) / 16 + own))
        assert sharded["master_weights"] == pytest.approx(4 * ((n - own) / 16 + own))
        assert whole["optimizer_state"] == pytest.approx(8 * n)
        assert sharded["optimizer_state"] < whole["optimizer_state"]
    assert zero1[0]["optimizer_state"] == pytest.approx(pipeline_stages(s)[0]["optimizer_state"] / 16)  # no experts
    # the fullest stage (the last) fits an 80 GB H100 with ZeRO-1 (it was planned at 497.80 GiB; 72.03 GiB with the
    # experts' backward, `experts.backward_bytes`); without it, not
    assert sum(max(zero1, key=lambda p: sum(p.values())).values()) < 80e9
    assert sum(max(pipeline_stages(s), key=lambda p: sum(p.values())).values()) / GIB > 80


@pytest.mark.parametrize("layers,first_dense,pp,vpp", [(4, 1, 2, 1), (6, 2, 3, 2), (6, 3, 3, 1)])
def test_each_stage_holds_the_built_models_parameters_of_its_layers(layers, first_dense, pp, vpp):
    """micro-deepseek-v3 (8 routed experts, MLA, an MTP module whose layer is sparse) with `layers` decoder layers,
    the first `first_dense` dense: each stage's parameters are the built model's that `stage_of` (the checkpoint's
    split by name) puts on it, the routed experts ÷ ep 2, and on the last stage the embedding's copy the MTP lookups
    read. At pp 3 × 2 virtual stage 0 holds layers 0 and 3, so one dense layer, not two."""
    from pretrain_cli import runtime

    runtime.import_paddle()
    from pretrain_cli.models import build_model
    from pretrain_cli.run_config import MoeConfig

    cfg = dataclasses.replace(MICRO, num_hidden_layers=layers, first_k_dense_replace=first_dense)
    s = Setup(model=cfg, micro_batch=1, seq_len=16, pp=pp, vpp=vpp, ep=2, sharding_stage=1, sharding_degree=2,
              micro_batches=2 * pp)
    held, experts = [0.0] * pp, [0.0] * pp
    bounds = stage_bounds(layers, pp * vpp)
    for name, p in build_model(cfg, None, MoeConfig()).named_parameters():
        if name.endswith("e_score_correction_bias"):  # a buffer to `param_counts`, as in transformers
            continue
        st = stage_of(name, bounds, pp)
        routed = ".mlp.experts." in name
        held[st] += p.size / (2 if routed else 1)
        experts[st] += p.size / 2 if routed else 0
    held[-1] += cfg.vocab_size * cfg.hidden_size  # the last stage's copy of the (untied) embedding
    expert_layer = 8 * 3 * cfg.hidden_size * cfg.moe_intermediate_size / 2  # one sparse layer's 8 experts ÷ ep
    sparse = [sum(i >= first_dense for i in stage_layers(layers, pp, vpp)[st]) + (st == pp - 1) for st in range(pp)]
    assert experts == [n * expert_layer for n in sparse]
    assert [stage_params(s, st) for st in range(pp)] == pytest.approx(held)
    assert [stage_experts(s, st) for st in range(pp)] == pytest.approx(experts)
    # ZeRO-1 over 2 data ranks: the rest's AdamW state halved, the stage's own experts' whole
    for st, parts in enumerate(pipeline_stages(s)):
        assert parts["optimizer_state"] == pytest.approx(8 * ((held[st] - experts[st]) / 2 + experts[st]))
        assert parts["weights"] == pytest.approx(4 * held[st])
        assert parts["gradients"] == pytest.approx(4 * held[st])


@pytest.mark.parametrize("ep", [2, 1])
def test_data_parallel_traffic_reduces_each_stages_own_experts(ep):
    """`stage_traffic`'s dp term under pp 2 on 8 ranks (4 data ranks): micro-deepseek-v3 with 4 layers, the first dense,
    so stage 0 holds one sparse layer and stage 1 two and the MTP module's. By hand, one sparse layer's 8 experts
    are 8 x 3 x 64 x 32 = 49,152 parameters (÷ ep on a rank); the rest, a 1/2 share of the model without its routed
    experts and, on the last stage, the MTP module's own. With ep 2 the fullest stage's three layers of experts go
    over their 2 holders, the rest over the 4 data ranks; with ep 1 all of it over the 4. A stage counting
    all four sparse layers' experts (and the module's rest) would plan 4 layers' worth over the holders at ep 2."""
    from pretrain_cli.models.flops import param_counts
    from pretrain_cli.planning.memory import mtp_params
    from pretrain_cli.planning.speed import stage_traffic
    from pretrain_cli.run_layout import ParallelConfig

    cfg = dataclasses.replace(MICRO, num_hidden_layers=4, first_k_dense_replace=1)
    counts = param_counts(cfg)
    layer = 8 * 3 * 64 * 32
    assert counts["experts"] == 3 * layer and mtp_params(Setup(model=cfg, micro_batch=1, seq_len=16))[1] == layer
    s = Setup(model=cfg, micro_batch=1, seq_len=16, pp=2, ep=ep, micro_batches=2)
    par = ParallelConfig(world_size=8, dp_degree=4, pp_degree=2, ep_degree=ep)
    rest = (counts["total"] - counts["experts"]) / 2 + mtp_params(s)[0]  # the last stage's
    if ep == 2:
        want = 2 * 3 / 4 * rest + 2 * 1 / 2 * 3 * layer / 2
    else:
        want = 2 * 3 / 4 * (rest + 3 * layer)
    assert stage_traffic(s, par, counts)[-1]["dp"] == pytest.approx(4 * want)  # fp32 gradients
