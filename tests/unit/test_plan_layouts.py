"""`plan` on a three-dimensional layout (tensor × pipeline × ZeRO-1): the fullest stage's memory with its TP share,
the bubble, the TP and PP traffic, and which groups stay inside a node, checked against hand arithmetic for
PaddleNLP's Llama recipe shape, Llama-3.1-70B as tp 8 × pp 4 × `sharding: stage1` on 64 × H100."""
import dataclasses
from pathlib import Path

import pytest

from pretrain_cli.orchestration.planned import parse as parsed
from pretrain_cli.orchestration import planned
from pretrain_cli.planning import layout
from pretrain_cli.planning.memory import GIB, pipeline_stages
from pretrain_cli.planning.plan import report, setup_for, target_device
from pretrain_cli.planning.report import format_report
from pretrain_cli.run_layout import ParallelConfig

LLAMA = Path(__file__).resolve().parents[1] / "e2e" / "paddlenlp_configs" / "llama_pretrain_argument.json"
H, I, V, L, KV = 8192, 28672, 128256, 80, 1024
LAYER = 2 * H * H + 2 * H * KV + 3 * H * I + 2 * H  # q, o; k, v; gate, up, down; two norms


def _tp8_pp4_stage1():
    """The 64-rank run: the file resolved for tp 8 × ZeRO-1 on one stage's 16 ranks, then laid out over 4 stages
    with the embedding and LM head whole on every tensor-parallel rank of their stage (the pipeline engine's TP
    splits the decoder layers only): what `config.resolve` gives for the file with pp 4 where TP × PP runs."""
    args, cfg = parsed(str(LLAMA), ["--model_name_or_path", "meta-llama/Llama-3.1-70B", "--tensor_parallel_degree",
                                     "8", "--sharding", "stage1"])
    dev = target_device("H100")
    run = planned._resolved(args, cfg, dev, 16)
    assert (run.parallel.tp_degree, run.parallel.sharding_degree, run.parallel.sharding_stage) == (8, 2, 1)
    run = dataclasses.replace(run, parallel=dataclasses.replace(run.parallel, world_size=64, pp_degree=4,
                                                                vocab_parallel=False))
    return run, cfg, dev


def test_fullest_stage_with_its_tp_share_by_hand():
    run, cfg, dev = _tp8_pp4_stage1()
    stages = pipeline_stages(setup_for(run, cfg, dev))
    first = stages[0]
    n0 = 20 * (LAYER - 2 * H) / 8 + 20 * 2 * H + V * H  # 20 layers ÷ tp 8 but their norms, and the whole embedding
    assert first["weights"] == pytest.approx(2 * n0)  # bf16 O2
    assert first["gradients"] == pytest.approx(2 * n0)  # bf16 (no amp_master_grad), whole under ZeRO-1
    assert first["optimizer_state"] == pytest.approx(8 * n0 / 2)  # AdamW m, v ÷ the ZeRO-1 group of 2
    assert first["master_weights"] == pytest.approx(4 * n0 / 2)
    # per token per layer, bf16 (c = 2), flash on GPU, fused RMSNorm and RoPE, no recompute; projections ÷ tp:
    norm = 2 * 2 * H + 4  # fused RMSNorm keeps input, output, rstd
    per_layer = (2 * H  # the layer input
                 + norm - 2 * H + 2 * (H + 2 * KV) / 8  # attention norm beyond its input, q/k/v outputs
                 + (2 * (H + KV) + 4 * 64) / 8  # flash: q, k after RoPE + fp32 log-sum-exp per head
                 + 2 * H / 8  # attention output
                 + norm + 3 * 2 * I / 8)  # MLP norm; the gate|up output and SwiGLU product (not 4: PackedGemm)
    assert per_layer == 93992
    assert first["activations"] == pytest.approx(4 * 20 * per_layer * 4096)  # 1F1B: 4 micro-batches in flight
    assert first["logits_loss"] == 0 < stages[3]["logits_loss"]
    r = report(run, cfg, dev, groups=planned.rank_groups(run.parallel))
    assert r.memory_gib * GIB == pytest.approx(max(sum(s.values()) for s in stages))
    assert r.parallel.pipeline_bubble == pytest.approx(3 / (16 + 3))  # (P-1)/(m+P-1), 16 micro-batches
    # start-up: the fullest stage's fp32 share (stage 3 adds the final norm and the whole head)
    n3 = 20 * (LAYER - 2 * H) / 8 + 20 * 2 * H + H + V * H  # the norms whole (`models.tp_plan`)
    assert r.startup_breakdown_gib["weights"] * GIB == pytest.approx(4 * n3)
    # + the transient: the layers' tp slices are created as slices (twice the largest), the LM head whole on the
    # last stage (one tensor): here the head, larger than twice any layer's slice
    assert r.startup_breakdown_gib["transient"] * GIB == pytest.approx(4 * V * H)


def test_tp_and_pp_traffic_by_hand():
    run, cfg, dev = _tp8_pp4_stage1()
    r = report(run, cfg, dev, groups=planned.rank_groups(run.parallel))
    act = 1 * 4096 * H * 2  # one [b, s, hidden] bf16 activation
    t = r.traffic_gb_per_step
    # 16 micro-batches x 20 layers of this stage x 4 all-reduces x 2(t-1)/t of the activation, + the pipeline's
    # partial sends: the receiver all-gathers the tp pieces of each activation and gradient over the tp group
    assert t["tp"] * 1e9 == pytest.approx(16 * 20 * 4 * 2 * 7 / 8 * act + 16 * 2 * 7 / 8 * act)
    # fleet's partial send on NCCL without sequence parallelism: each tp rank sends 1/8 of the activation and of
    # its gradient, per micro-batch (before, the whole activation was counted: 8 x these bytes)
    assert t["pp"] * 1e9 == pytest.approx(16 * 2 * act / 8) and t["zero3"] == 0
    # once per step the ZeRO-1 pair moves an all-reduce's worth of the bf16 gradients of a stage's TP slice
    params = V * H * 2 + L * LAYER + H
    assert t["dp"] * 1e9 == pytest.approx(2 * (2 - 1) / 2 * params / 8 / 4 * 2)
    from pretrain_cli.planning.speed import speed
    sp = speed(r)
    # the TP group is one node (H100 NVLink: 900 GB/s both ways, 450 one way); the pipeline and the pair cross nodes
    assert (r.device.links.in_node_gbps, r.device.links.cross_node_gbps) == (450, 50)
    # each stage is busy for its traffic too (the same on every stage here), so the bubble idles for it as it does
    # for compute (`speed.pipeline_seconds`); the gradients once a step, after the pipeline
    bubble = r.parallel.pipeline_bubble
    assert sp["comm_seconds"] == pytest.approx((t["tp"] / 450 + t["pp"] / 50) / (1 - bubble) + t["dp"] / 50)


def test_interleaved_pipeline_by_hand():
    """virtual_pp_degree 2: 4 stages x 2 chunks of 10 layers, 16 micro-batches. fleet's interleaved 1F1B idles
    (P-1)/(V·m+P-1) of the step, runs 2(P-1-s) + (V-1)(P + m mod P) chunk forwards on stage s before its first
    backward (so holds one more at its peak), and each micro-batch crosses every stage boundary once per chunk.
    The plan ignored the chunks before: the 1F1B bubble 3/19, 4 x 20 layers in flight on the first stage, and
    one send a micro-batch each way."""
    run, cfg, dev = _tp8_pp4_stage1()
    run = dataclasses.replace(run, parallel=dataclasses.replace(run.parallel, virtual_pp_degree=2))
    stages = pipeline_stages(setup_for(run, cfg, dev))
    per_layer, tokens = 93992, 4096  # bytes per token per layer, as in the 1F1B test above
    # stage 0: 2·3 + 1·4 = 10 forwards, then one more: 11 chunks of 10 layers (Megatron: P·(1 + (P-1)/(P·V))
    # micro-batches of a stage's 20 layers = 4 · 11/8)
    assert stages[0]["activations"] == pytest.approx(11 * 10 * per_layer * tokens)
    assert stages[1]["activations"] == pytest.approx(9 * 10 * per_layer * tokens)
    # the last stage: 1·4 + 1 chunks, and of them one in its last chunk: the final norm (fused: 2·c·h + 4) once
    assert stages[3]["activations"] == pytest.approx((5 * 10 * per_layer + 2 * 2 * H + 4) * tokens)
    assert stages[3]["logits_loss"] == pytest.approx(pipeline_stages(setup_for(_tp8_pp4_stage1()[0], cfg, dev))[3][
        "logits_loss"])
    r = report(run, cfg, dev, groups=planned.rank_groups(run.parallel))
    assert r.parallel.pipeline_bubble == pytest.approx(3 / (2 * 16 + 3)) and r.parallel.vpp == 2
    assert r.memory_gib * GIB == pytest.approx(sum(stages[0].values()))
    act = 1 * 4096 * H * 2
    assert r.traffic_gb_per_step["pp"] * 1e9 == pytest.approx(16 * 2 * 2 * act / 8)  # 2 chunks, partial sends
    assert r.traffic_gb_per_step["tp"] * 1e9 == pytest.approx(16 * 20 * 4 * 2 * 7 / 8 * act + 16 * 2 * 2 * 7 / 8 * act)
    assert "x pp 4 x 2 virtual" in format_report(r)
    from pretrain_cli.planning.memory import in_flight

    # m not a multiple of P: fleet's first pass per chunk is P + m mod P micro-batches (18: 6)
    assert in_flight(4, 2, 18, 0) == (2 * 3 + 6 + 1, 0)
    # pp 3 x 2 chunks, 7 micro-batches (the CPU measurement, docs/PLAN.md): the last stage holds 5 chunks, two of
    # them in its last chunk at once; 1F1B is unchanged (min(P - s, m) stages, one micro-batch at the end)
    assert [in_flight(3, 2, 7, s) for s in range(3)] == [(9, 0), (7, 0), (5, 2)]
    assert [in_flight(4, 1, 16, s) for s in range(4)] == [(4, 1), (3, 1), (2, 1), (1, 1)]


@pytest.mark.parametrize("sequence_parallel,device", [(True, "H100"), (False, "cpu")])
def test_pipeline_sends_are_whole_where_fleet_sends_them_whole(sequence_parallel, device):
    """Under sequence parallelism each tp rank sends its own 1/t of the sequence whole (`pipeline_configs` turns the
    partial send off); on gloo (CPU) every tp rank sends the whole activation (`Collectives.pipeline_flags`); neither
    all-gathers what it receives."""
    from pretrain_cli.planning.plan import setup_for
    from pretrain_cli.planning.speed import partial_sends, stage_traffic
    from pretrain_cli.models.flops import param_counts

    run, cfg, dev = _tp8_pp4_stage1()
    run = dataclasses.replace(run, parallel=dataclasses.replace(run.parallel, sequence_parallel=sequence_parallel))
    if device == "cpu":
        dev = target_device("cpu")
    setup = setup_for(run, cfg, dev)
    act = 1 * 4096 * H * setup.compute_bytes
    t = stage_traffic(setup, run.parallel, param_counts(cfg))[1]  # (a middle stage's; every stage's here)
    assert not partial_sends(setup, run.parallel)
    assert t["pp"] == pytest.approx(16 * 2 * act / (8 if sequence_parallel else 1))
    assert t["tp"] == pytest.approx(16 * 20 * 4 * 2 * 7 / 8 * act)


def test_plan_explains_the_axis_split_tp_inside_a_node_pp_across():
    run, cfg, dev = _tp8_pp4_stage1()
    lay = layout.explain(run.parallel, planned.rank_groups(run.parallel))
    tp, pp, data = (lay["axes"][k] for k in ("tp", "pp", "data"))
    assert lay["nodes"] == 8 and (tp["degree"], pp["degree"], data["degree"]) == (8, 4, 2)
    assert tp["first_group"] == list(range(8)) and tp["inside_node"] and tp["groups"] == 8
    assert pp["first_group"] == [0, 16, 32, 48] and pp["nodes_per_group"] == 4 and pp["groups"] == 16
    assert data["first_group"] == [0, 8] and data["nodes_per_group"] == 2
    text = format_report(report(run, cfg, dev, groups=planned.rank_groups(run.parallel)))
    assert "tp 8: 8 tensor-parallel groups (all-reduces every layer) of ranks 1 apart (0, 1, 2, 3, 4, 5, 6, 7): " \
           "inside a node" in text
    assert "pp 4: 16 pipeline groups (one activation per micro-batch between stages) of ranks 16 apart " \
           "(0, 16, 32, 48): across 4 nodes" in text
    # the slowest stage's: the last, with the LM head (each stage's own in `stages`)
    assert "traffic per device per step (stage 3, the slowest): TP collectives 152 GB (in-node 450 GB/s), pipeline " \
           "p2p 0.268 GB (cross-node 50 GB/s), data-parallel gradients 4.41 GB (cross-node 50 GB/s)" in text


def test_every_rank_is_in_one_group_per_axis():
    par = ParallelConfig(world_size=24, dp_degree=1, sharding_degree=3, sharding_stage=1, tp_degree=2, pp_degree=4)
    for axis, size in (("tp", 2), ("pp", 4), ("data", 3)):
        gs = planned.rank_groups(par)[axis]
        assert sorted(r for g in gs for r in g) == list(range(24)) and {len(g) for g in gs} == {size}


def test_plan_md_worked_example_is_what_plan_prints():
    """docs/PLAN.md's tp 8 × pp 4 table (GiB per part, start-up) and its printed block are this report's."""
    import re

    run, cfg, dev = _tp8_pp4_stage1()
    r = report(run, cfg, dev, groups=planned.rank_groups(run.parallel))
    doc = (Path(__file__).resolve().parents[2] / "docs" / "PLAN.md").read_text(encoding="utf-8")
    section = doc[doc.index("### Worked example: Llama-3.1-70B as tp 8 × pp 4"):]
    rows = dict(re.findall(r"^\| \**([a-z_-]+)\** \| \**([0-9.]+)\** \|", section, re.M))
    want = {k: f"{v:.2f}" for k, v in r.memory_breakdown_gib.items()}
    want.update(total=f"{r.memory_gib:.2f}", **{"start-up": f"{r.startup_gib:.2f}"})
    assert rows == want
    block = section.split("```")[1].strip().splitlines()
    text = format_report(r).splitlines()
    assert block[0] in text and all(line in text for line in block)
    assert f"Bubble 3/19 = {r.parallel.pipeline_bubble:.1%}" in section


@pytest.mark.parametrize("degrees", [dict(pp_degree=4, sharding_degree=2, sharding_stage=1, tp_degree=8),
                                     dict(pp_degree=2, dp_degree=3, tp_degree=2),
                                     dict(dp_degree=2, sharding_degree=2, sharding_stage=1, cp_degree=2),
                                     dict(sharding_degree=4, sharding_stage=3)])
def test_rank_groups_are_the_topologys_groups(degrees):
    """The planner's cached grouping names the groups `distributed.layout.topology.Topology` gives `train`, on every axis."""
    from pretrain_cli.distributed.layout.topology import Topology

    world = 1
    for k, v in degrees.items():
        world *= v if k.endswith("_degree") else 1
    par = ParallelConfig(world_size=world, **degrees)
    topo, got = Topology.of(par), planned.rank_groups(par)
    for axis, name in (("tp", "mp"), ("pp", "pp"), ("cp", "cp")):
        assert got[axis] == topo.groups(name)
    assert got["data"] == sorted({topo.replicas("pp", "mp", rank=r) for r in range(world)})


def test_fit_keeps_tensor_parallelism_where_it_stays_on_nvlink():
    """configs/llama-3.1-70b_pretrain.json (tp 8 × pp 4 × ZeRO-1) on 64 × H100: with nodes of 8 the TP group is one
    node's NVLink, so `--fit` keeps tp 8 (without the pipeline, ZeRO-2 over the 8 data ranks, no recompute: a
    pipeline's last stage also runs the LM head, 12 % more than a stage of 10 layers, which set the step; it chose
    pp 8 with sequence parallelism while every stage was an average one); were every rank its own node, the same
    all-reduces would cross the 50 GB/s link, and the fit takes a smaller tp and predicts less."""
    from plan_helpers import fit

    from pretrain_cli.planning.hardware import Node

    cfg = str(Path(__file__).resolve().parents[2] / "configs" / "llama-3.1-70b_pretrain.json")
    nvlink = fit(cfg, [], device="H100", gpus=64)
    assert nvlink["change"] == {"pipeline_parallel_degree": 1, "sharding": "stage2", "gradient_accumulation_steps": 8,
                                "recompute": False,  # and an evaluation's 2 x 10 x 2 data ranks kept on 8: 1 x 5
                                "per_device_eval_batch_size": 1, "eval_iters": 5}
    apart = fit(cfg, [], device="H100", gpus=64, node=Node(1))
    assert apart["change"]["tensor_parallel_degree"] < 8
    assert apart["after"]["speed"]["tokens_per_sec"] < nvlink["after"]["speed"]["tokens_per_sec"]
