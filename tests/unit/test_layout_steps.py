"""The layout as steps (distributed/steps/order.py), the one TP plan (models/tp_plan.py), the refusal table
(config/refusals.py) and the collectives backend's choice (distributed/comms/collectives.py): what a team adding an axis
reads and extends."""
from __future__ import annotations

import pytest

from pretrain_cli.config.refusals import REFUSED, Degrees, refusals
from pretrain_cli.distributed.comms.collectives import for_device
from pretrain_cli.distributed.steps.order import ORDER, STEPS, Step, register, steps_for
from pretrain_cli.models.tp_plan import split_dim
from pretrain_cli.run_layout import ParallelConfig


def describe(parallel: ParallelConfig) -> str:
    """The steps a layout runs, in order, as one string."""
    return " -> ".join(s.name for s in steps_for(parallel))


def _p(**degrees) -> ParallelConfig:
    world = 1
    for key in ("dp_degree", "sharding_degree", "tp_degree", "pp_degree", "cp_degree"):
        world *= degrees.get(key, 1)
    return ParallelConfig(world_size=world, **degrees)


@pytest.mark.parametrize("degrees,steps", [
    (dict(dp_degree=2), "recompute"),
    (dict(tp_degree=2), "recompute -> data"),  # semi-auto's placements: its build side localises the kernels
    (dict(tp_degree=2, sequence_parallel=True), "tp -> recompute"),
    (dict(tp_degree=2, cp_degree=2), "tp -> cp -> recompute"),
    (dict(cp_degree=2, pp_degree=2), "cp -> recompute -> pp"),
    (dict(tp_degree=2, cp_degree=2, pp_degree=2), "tp -> cp -> recompute -> pp"),
    (dict(tp_degree=2, manual_tp=True), "tp -> recompute"),  # multi-head latent attention: the step's split alone
    # expert parallelism with tp (config/parallel.py sets manual_tp): the tp split, then the experts over ep groups
    (dict(dp_degree=2, tp_degree=2, ep_degree=2, manual_tp=True), "tp -> ep -> recompute"),
])
def test_each_layout_is_its_axes_steps_in_the_one_order(degrees, steps):
    assert describe(_p(**degrees)) == steps
    names = [s.name for s in steps_for(_p(**degrees))]
    assert names == sorted(names, key=ORDER.index)


def test_a_step_registered_for_an_axis_takes_its_slot():
    """The "ep" slot: after the attention-side steps, before recompute; a name outside the order is refused."""
    with pytest.raises(ValueError, match="no place"):
        register(Step("moe", lambda p: True))
    ep = STEPS["ep"]
    register(Step("ep", lambda p: p.dp_degree > 1, apply=lambda model, placement: model))
    try:
        assert describe(_p(tp_degree=2, cp_degree=2, dp_degree=2)) == "tp -> cp -> ep -> recompute"
        assert "ep" not in describe(_p(tp_degree=2, cp_degree=2))
    finally:
        STEPS["ep"] = ep


def test_the_ep_step_is_there_without_importing_expert_parallel():
    """It was registered by importing `distributed.steps.expert_parallel`: a layout built before that import had no ep
    step. Now `distributed.steps.order` declares it (a fresh interpreter, no Paddle: about half a second)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    import pretrain_cli

    src = str(Path(pretrain_cli.__file__).parents[1])  # this tree's sources, not an installed copy
    code = ("import sys; from pretrain_cli.distributed.steps.order import steps_for; "
            "from pretrain_cli.run_layout import ParallelConfig; "
            "print(*[s.name for s in steps_for(ParallelConfig(world_size=2, dp_degree=2, ep_degree=2))], "
            "'pretrain_cli.distributed.steps.expert_parallel' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": src}).stdout
    assert out.split() == ["ep", "recompute", "False"]


@pytest.mark.parametrize("name,vocab,dim", [
    ("model.layers.3.self_attn.q_proj.weight", False, 1), ("model.layers.3.self_attn.k_proj.bias", False, 0),
    ("model.layers.0.mlp.up_proj.weight", False, 1), ("model.layers.0.mlp.down_proj.weight", False, 0),
    ("model.layers.0.self_attn.o_proj.bias", False, None), ("model.layers.0.input_layernorm.weight", False, None),
    ("model.layers.0.self_attn.q_norm.weight", False, None), ("model.embed_tokens.weight", False, None),
    ("model.embed_tokens.weight", True, 0), ("lm_head.weight", True, 1), ("model.norm.weight", True, None),
    # multi-head latent attention: the per-head up-projections by heads, the latents and the shared RoPE key whole
    ("model.layers.1.self_attn.q_b_proj.weight", False, 1), ("model.layers.1.self_attn.kv_b_proj.weight", False, 1),
    ("model.layers.1.self_attn.q_a_proj.weight", False, None), ("model.layers.1.self_attn.o_proj.weight", False, 0),
    ("model.layers.1.self_attn.kv_a_proj_with_mqa.weight", False, None),
    ("model.layers.1.self_attn.kv_a_layernorm.weight", False, None),
])
def test_one_tp_plan_gives_each_parameter_its_split_dim(name, vocab, dim):
    assert split_dim(name, vocab) == dim


def test_every_refusal_row_refuses_its_product_alone_in_one_line():
    products = {"sep": Degrees(sep=2), "cp with ZeRO-3": Degrees(cp=2, stage=3, sharding=2, data=2),
                "sp with ZeRO-3": Degrees(tp=2, sp=True, stage=3, sharding=2, data=2),
                "pp with ZeRO-3": Degrees(pp=2, stage=3, sharding=2, data=2),
                "semi-auto sharding below the data ranks": Degrees(stage=2, sharding=2, data=4),
                "ep with ZeRO-2/3": Degrees(ep=2, stage=2, sharding=2, data=2, moe="qwen3_moe"),
                "MoE with sequence parallelism or tp x cp": Degrees(cp=2, tp=2, moe="qwen3_moe"),
                "MLA with sequence parallelism or tp x cp": Degrees(tp=2, sp=True, mla="deepseek_v3")}
    assert sorted(products) == sorted(r.name for r in REFUSED)
    for name, degrees in products.items():
        lines = refusals(degrees)
        key = lines[0].split(":")[0] if lines else ""
        assert len(lines) == 1 and "\n" not in lines[0] and key.endswith(("_degree", "sharding", "sequence_parallel")), \
            (name, lines)
        assert "supported" in lines[0] and "; " in lines[0], lines  # the engine limit, then what to do
    for runs in (Degrees(cp=2, tp=2, pp=2), Degrees(cp=2, stage=2, sharding=1, data=1),
                 Degrees(tp=2, sp=True, stage=2, sharding=2, data=2), Degrees(pp=2, stage=2, sharding=2, data=2),
                 Degrees(tp=2, stage=3, sharding=2, data=2, moe="qwen2_moe"),
                 Degrees(tp=2, pp=2, moe="qwen3_moe"), Degrees(tp=2, pp=2, moe="deepseek_v3", mla="deepseek_v3"),
                 Degrees(tp=2, stage=2, sharding=2, data=2, mla="deepseek_v3"),
                 Degrees(tp=2, stage=1, sharding=2, data=4, mla="deepseek_v3"),
                 Degrees(stage=3, sharding=2, data=2, mla="deepseek_v3"),
                 Degrees(tp=2, stage=3, sharding=2, data=2, moe="deepseek_v3", mla="deepseek_v3"),
                 Degrees(pp=2, moe="deepseek_v3", mla="deepseek_v3"),
                 Degrees(ep=2, stage=1, sharding=2, data=2, moe="qwen3_moe"),
                 Degrees(ep=2, pp=2, data=2, moe="qwen3_moe"), Degrees(ep=2, tp=2, data=2, moe="qwen2_moe"),
                 # ZeRO-1 with the experts kept out of fleet's sharding optimizer on its hybrid groups (`ExpertHybrid`):
                 # PaddleNLP's DeepSeek-V3 layout; with tp too, over fewer ranks than the data ranks (not semi-auto)
                 Degrees(ep=4, pp=2, stage=1, sharding=4, data=4, moe="deepseek_v3", mla="deepseek_v3"),
                 Degrees(ep=2, pp=2, stage=1, sharding=2, data=4, moe="qwen3_moe"),
                 Degrees(ep=2, tp=2, stage=1, sharding=2, data=4, moe="qwen2_moe"),
                 # and ZeRO-2 there: fleet's ZeRO-1 releasing the rest's unowned gradients (test_expert_zero1_hybrid)
                 Degrees(ep=2, pp=2, stage=2, sharding=2, data=2, moe="deepseek_v3", mla="deepseek_v3"),
                 Degrees(ep=2, tp=2, stage=2, sharding=2, data=2, moe="deepseek_v3", mla="deepseek_v3"),
                 Degrees(ep=2, tp=2, stage=2, sharding=2, data=4, moe="qwen2_moe"),  # fleet's ZeRO-2 below the data ranks
                 # multi-head latent attention's tp (the `tp` step, fleet's groups) with fleet's ZeRO-2 below the data
                 # ranks, without EP: DeepSeek's MoE and a dense MLA model (docs/DISTRIBUTED.md, by hand)
                 Degrees(tp=2, stage=2, sharding=2, data=4, moe="deepseek_v3", mla="deepseek_v3"),
                 Degrees(tp=2, stage=2, sharding=2, data=4, mla="deepseek_v2"),
                 # all three: ExpertPipeline with the tp step in its stages (test_expert_zero1_hybrid, 8 processes)
                 Degrees(ep=2, tp=2, pp=2, data=2, moe="qwen3_moe"),
                 Degrees(ep=2, tp=2, pp=2, stage=1, sharding=2, data=2, moe="deepseek_v3", mla="deepseek_v3"),
                 Degrees(ep=2, tp=2, pp=2, stage=2, sharding=2, data=2, moe="deepseek_v3", mla="deepseek_v3"),
                 # a MoE model under context parallelism, with dp, ZeRO-1/2, pp or ep (test_moe_context), MLA too
                 Degrees(cp=2, moe="qwen3_moe"), Degrees(cp=2, data=2, moe="qwen2_moe"),
                 Degrees(cp=2, stage=1, sharding=1, data=1, moe="qwen3_moe"),
                 Degrees(cp=2, ep=2, stage=2, sharding=2, data=2, moe="qwen2_moe"),
                 Degrees(cp=2, ep=2, data=2, moe="qwen3_moe"), Degrees(cp=2, pp=2, moe="qwen3_moe"),
                 Degrees(cp=2, moe="deepseek_v2", mla="deepseek_v2"), Degrees(cp=2, mla="deepseek_v2"),
                 Degrees(cp=2, pp=2, stage=2, sharding=2, data=2, moe="deepseek_v2", mla="deepseek_v2"),
                 # all three, ep x cp x pp, also with ZeRO-1/2 (test_moe_context_pipeline, 8 processes): it was refused
                 Degrees(ep=2, cp=2, pp=2, data=2, moe="qwen3_moe"),
                 Degrees(ep=2, cp=2, pp=2, stage=1, sharding=2, data=2, moe="qwen3_moe"),
                 Degrees(ep=2, cp=2, pp=2, stage=2, sharding=2, data=2, moe="deepseek_v2", mla="deepseek_v2")):
        assert refusals(runs) == [], runs


@pytest.mark.parametrize("model", ["micro-qwen2", "micro-qwen2-moe", "micro-deepseek-v3"])
def test_sharding_below_the_data_ranks_is_refused_exactly_where_the_semi_auto_engine_runs(model):
    """"semi-auto sharding below the data ranks" names the semi-auto engine, so it refuses the layouts that engine runs
    and no other: each one-stage layout of 8 processes with ZeRO over 2 of its data ranks is refused by it exactly when
    the same layout over every data rank resolves to the semi-auto engine. It refused multi-head latent attention's tp
    with stage2 too (fleet's groups: it runs, equal to one process), and said "stage1 and no tensor parallelism only"
    where MLA's and expert parallelism's tp run under stage1/2."""
    from pretrain_cli.errors import UserError
    from run_helpers import resolve_run

    moe = model != "micro-qwen2"
    for tp, stage, ep in ((tp, stage, ep) for tp in (1, 2) for stage in (1, 2, 3) for ep in ((1, 2) if moe else (1,))):
        keys = ["--tensor_parallel_degree", str(tp), "--sharding", f"stage{stage}", "--expert_parallel_degree", str(ep)]
        try:
            engine = resolve_run(*keys, world=8, model=model).parallel.engine
        except UserError:  # refused over every data rank too (ep with ZeRO-3, ...): another row's
            continue
        try:
            resolve_run(*keys, "--sharding_parallel_degree", "2", world=8, model=model)
            line = ""
        except UserError as e:
            line = str(e)
        semi_auto = "sharding_parallel_degree: 2 of the " in line and "semi-auto engine" in line
        assert semi_auto == (engine == "semi_auto"), (tp, stage, ep, engine, line)
        assert line == "" or semi_auto, line  # nothing else refuses the smaller group
        if semi_auto:
            asked = " and ".join(k for k, on in ((f"sharding: stage{stage}", True),
                                                 (f"tensor_parallel_degree: {tp}", tp > 1)) if on)
            assert f"not supported with {asked} (" in line and f"use -1 (shard over all {8 // tp})" in line, line


def test_distributed_md_lists_each_refusal_row_by_its_name():
    """docs/DISTRIBUTED.md's "What stays refused" table names the rows of `REFUSED`: it still named "cp with
    ZeRO-2/3" and "sp with ZeRO-2/3" (and told users to drop stage2) after ZeRO-2 ran with context and sequence
    parallelism."""
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "DISTRIBUTED.md").read_text()
    table = text.split("### What stays refused", 1)[1].split("\n\n", 3)[2]  # after the heading and its paragraph
    rows = [line.split("|")[1].strip() for line in table.splitlines()[2:]]  # (below the header and its rule)
    assert sorted(rows) == sorted(r.name for r in REFUSED)


def test_the_collectives_backend_is_chosen_from_the_device_once():
    cpu, gpu = for_device("cpu"), for_device("gpu")
    assert (cpu.gloo, cpu.ring_edges, cpu.name) == (True, True, "gloo")
    assert (gpu.gloo, gpu.ring_edges, gpu.gradient_hook, gpu.name) == (False, False, None, "nccl")
    assert cpu.gradient_hook is not None and cpu == for_device("cpu")  # hashable: a cache key for ring groups
