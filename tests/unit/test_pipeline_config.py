"""Pipeline keys in config (no processes): the degrees, the rank layout, the refusals, and the stage of each HF name."""
from __future__ import annotations

import dataclasses
import pytest
from run_helpers import model_config, resolve_run

from pretrain_cli.distributed.strategies.pipeline import stage_of
from pretrain_cli.distributed.layout.topology import Topology
from pretrain_cli.models.flops import param_counts
from pretrain_cli.planning.memory import Setup, pipeline_stages, stage_params
from pretrain_cli.errors import UserError
from pretrain_cli.models.stages import stage_bounds


def test_stage_bounds_split_layers_evenly_with_extras_in_the_middle():
    assert stage_bounds(2, 2) == [0, 1, 2]
    assert stage_bounds(8, 4) == [0, 2, 4, 6, 8]
    assert stage_bounds(10, 4) == [0, 2, 5, 8, 10]  # the two extra layers go to stages 1 and 2
    assert stage_bounds(5, 2) == [0, 3, 5]


def test_stage_of_maps_hf_names_by_global_layer_index():
    bounds = stage_bounds(10, 4)
    assert stage_of("model.embed_tokens.weight", bounds) == 0
    assert stage_of("model.layers.1.mlp.up_proj.weight", bounds) == 0
    assert stage_of("model.layers.2.self_attn.q_proj.weight", bounds) == 1
    assert stage_of("model.layers.7.input_layernorm.weight", bounds) == 2
    assert stage_of("model.layers.8.mlp.down_proj.weight", bounds) == 3
    assert stage_of("model.norm.weight", bounds) == stage_of("lm_head.weight", bounds) == 3
    chunks = stage_bounds(8, 8)  # 4 stages x 2 virtual: stage s holds layers s and s + 4 (fleet's interleaving)
    assert [stage_of(f"model.layers.{i}.mlp.up_proj.weight", chunks, 4) for i in range(8)] == [0, 1, 2, 3, 0, 1, 2, 3]
    assert stage_of("model.embed_tokens.weight", chunks, 4) == 0 and stage_of("lm_head.weight", chunks, 4) == 3


def test_pp_dp_layout_puts_stages_outermost():
    runs = [resolve_run("--pipeline_parallel_degree", "2", "--gradient_accumulation_steps", "2", world=4, rank=r)
            for r in range(4)]
    p = runs[0].parallel
    assert (p.engine, p.pp_degree, p.dp_degree, p.data_world_size) == ("pipeline", 2, 2, 2)
    assert [(Topology.of(r.parallel).stage, Topology.of(r.parallel).data_rank) for r in runs] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert runs[0].kernels.optimizer == "paddle" and "pp 2" in p.describe()
    zero1 = resolve_run("--pipeline_parallel_degree", "2", "--sharding", "stage1", world=4).parallel
    assert zero1.sharding_degree == 2 and zero1.sharding_stage == 1 and zero1.engine == "pipeline"
    zero2 = resolve_run("--pipeline_parallel_degree", "2", "--sharding", "stage2", world=4).parallel
    assert zero2.sharding_degree == 2 and zero2.sharding_stage == 2 and zero2.engine == "pipeline"


def test_pipeline_refusals_and_notes_are_one_line_each():
    with pytest.raises(UserError) as e:
        resolve_run("--pipeline_parallel_degree", "2", "--virtual_pp_degree", "2", "--sharding", "stage3",
                    "--pipeline_parallel_config", "enable_timer bogus_flag", world=2)
    text = str(e.value)
    assert "virtual_pp_degree: 2 needs more than 2 pipeline stages" in text
    assert "sharding: stage3 with pipeline_parallel_degree 2 is not supported" in text
    assert "unknown flag 'bogus_flag'" in text
    with pytest.raises(UserError, match="4 stages for 2 decoder layers"):  # micro-qwen2
        resolve_run("--pipeline_parallel_degree", "4", world=4)
    with pytest.raises(UserError, match="does not divide the world size 3"):
        resolve_run("--pipeline_parallel_degree", "2", world=3)
    r = resolve_run("--pipeline_parallel_degree", "2", "--pipeline_parallel_config",
                    "enable_delay_scale_loss disable_p2p_cache_shape", world=2)
    notes = "\n".join(r.notes)
    assert "enable_delay_scale_loss has no effect here" in notes and "disable_p2p_cache_shape" not in notes
    assert "1 micro-batch(es) per step for 2 stages" in notes  # the bubble is named
    four = resolve_run("--pipeline_parallel_degree", "4", "--gradient_accumulation_steps", "16", world=4,
                       model="tiny-llama")
    assert four.parallel.pp_degree == 4 and not any("stages on cpu" in n for n in four.notes)  # PP4 runs on CPU
    vpp3 = ("--pipeline_parallel_degree", "4", "--virtual_pp_degree", "3")  # llama-171m: 12 decoder layers
    vpp = resolve_run(*vpp3, "--gradient_accumulation_steps", "8", world=4, model="llama-171m").parallel
    assert (vpp.pp_degree, vpp.virtual_pp_degree) == (4, 3) and "x3 virtual" in vpp.describe()  # interleaved 1F1B
    with pytest.raises(UserError, match="needs gradient_accumulation_steps >= 2 x stages \\(8\\), got 4"):
        resolve_run(*vpp3, "--gradient_accumulation_steps", "4", world=4, model="llama-171m")
    with pytest.raises(UserError, match="12 decoder layers do not split into 4 stages x 2 equal chunks"):
        resolve_run(*vpp3[:-1], "2", "--gradient_accumulation_steps", "8", world=4, model="llama-171m")
    one = resolve_run("--pipeline_parallel_degree", "2", world=1)
    assert one.parallel.pp_degree == 1 and any("pipeline_parallel_degree=2 has no effect" in n for n in one.notes)


def test_plan_models_each_stage_and_the_bubble(tmp_path):
    """The fullest stage is planned: stage params sum to the model plus the tied head's copy; the first stage keeps
    P micro-batches of activations in flight, the last one and the loss; the ETA pays the bubble (P-1)/(m+P-1)."""
    import json

    from plan_helpers import plan

    args = {"model_name_or_path": "Qwen/Qwen2.5-0.5B", "per_device_train_batch_size": 1, "max_seq_length": 1024,
            "gradient_accumulation_steps": 8, "bf16": True, "max_steps": 100, "do_train": True,
            "input_dir": str(tmp_path / "d"), "output_dir": str(tmp_path / "o")}
    (tmp_path / "a.json").write_text(json.dumps(args))
    (tmp_path / "b.json").write_text(json.dumps(dict(args, pipeline_parallel_degree=4)))
    one = plan(str(tmp_path / "a.json"), gpus=4, device="A100-80GB")
    pp = plan(str(tmp_path / "b.json"), gpus=4, device="A100-80GB")
    assert pp["parallel"]["pp"] == 4 and pp["parallel"]["pipeline_bubble"] == pytest.approx(3 / 11)
    # same tokens per step on 4 devices (dp 4 vs pp 4 with 4x the accumulation per data rank): the bubble costs time,
    # and the last stage, which also runs the LM head, sets the step (`speed.pipeline_seconds` of the stages' FLOPs)
    from pretrain_cli.planning.speed import pipeline_seconds, stage_flops_per_token

    per = stage_flops_per_token(Setup(model=model_config("qwen2.5-0.5b"), micro_batch=1, seq_len=1024, pp=4), False)
    slowest = pipeline_seconds(per, 8) / (sum(per) / 4 / (1 - 3 / 11))
    assert slowest > 1.3  # 6 layers of 0.5 B's 24 and its 136 M-parameter head on the last stage
    compute = {k: r["eta_hours"] - r["eta_traffic_hours"] for k, r in (("one", one), ("pp", pp))}  # (+ traffic)
    assert compute["pp"] == pytest.approx(compute["one"] * 4 / 4 / (1 - 3 / 11) * pp["tokens_per_step"]
                                          / one["tokens_per_step"] * slowest)
    assert pp["memory_breakdown_gib"]["weights"] < 0.5 * one["memory_breakdown_gib"]["weights"]
    cfg = model_config("qwen2.5-0.5b")  # tied, 24 layers
    setup = Setup(model=cfg, micro_batch=1, seq_len=1024, pp=4, micro_batches=8)
    total = sum(stage_params(setup, st) for st in range(4))
    assert total == pytest.approx(param_counts(cfg)["total"] + cfg.vocab_size * cfg.hidden_size)
    stages = pipeline_stages(setup)
    assert [round(st["activations"] / stages[3]["activations"], 2) for st in stages[:3]][0] > 2  # 4 in flight vs 1
    assert stages[0]["logits_loss"] == 0 < stages[3]["logits_loss"]
    few = pipeline_stages(dataclasses.replace(setup, micro_batches=2))  # never more in flight than there are micro-batches
    assert few[0]["activations"] < stages[0]["activations"] and few[3]["activations"] == stages[3]["activations"]
    # ZeRO-2 in the stages on GPU: 1/S of the AdamW state like stage1; the gradients stay whole during the schedule
    zero = [pipeline_stages(dataclasses.replace(setup, device="gpu", sharding_stage=k, sharding_degree=2))[0]
            for k in (1, 2)]
    assert zero[1]["gradients"] == zero[0]["gradients"] == stages[0]["gradients"] > 0
    assert zero[1]["optimizer_state"] == zero[0]["optimizer_state"] == stages[0]["optimizer_state"] / 2


def test_fit_tries_pipeline_degrees_and_charges_the_bubble(tmp_path):
    from pretrain_cli.planning import fit, fit_candidates

    cur = {"per_device_train_batch_size": 1, "gradient_accumulation_steps": 16, "recompute": False,
           "recompute_granularity": "full", "use_flash_attention": True, "sharding": "", "tensor_parallel_degree": 1,
           "pipeline_parallel_degree": 1}
    pp = [c for c in fit_candidates.candidates(cur, 64, 8) if c.get("pipeline_parallel_degree", 1) > 1]
    assert {c["pipeline_parallel_degree"] for c in pp} == {2, 4, 8}
    # TP x PP and ZeRO-2/3 with a pipeline are proposed: which of them run is config.resolve's rule, applied when
    # each candidate is re-resolved (never re-derived by the search)
    pairs = {(c.get("tensor_parallel_degree", 1), c["pipeline_parallel_degree"]) for c in pp}
    assert {(1, 2), (2, 2), (2, 4), (4, 2)} <= pairs and all(tp * p <= 8 for tp, p in pairs)
    assert any(c.get("sharding") == "stage3" for c in pp)
    from pretrain_cli.orchestration.planned import parse as parsed
    from pretrain_cli.orchestration import planned

    import json

    args = {"model_name_or_path": "Qwen/Qwen2.5-0.5B", "per_device_train_batch_size": 1, "max_seq_length": 1024,
            "gradient_accumulation_steps": 8, "bf16": True, "max_steps": 100, "do_train": True,
            "input_dir": str(tmp_path / "d"), "output_dir": str(tmp_path / "o")}
    (tmp_path / "a.json").write_text(json.dumps(args))
    flat = planned.plan(*parsed(str(tmp_path / "a.json"), []), "A100-80GB", 1, suggest_changes=False)
    sends = {"tp": 0.0, "pp": 8 * 2 * 1024 * 896 * 2 / 1e9, "zero3": 0.0}
    quarter = {**flat.stages[0], "tflops_per_step": flat.stages[0]["tflops_per_step"] / 4, "traffic_gb_per_step": sends}
    report = dataclasses.replace(flat, parallel=dataclasses.replace(flat.parallel, pp=4, pipeline_bubble=3 / 11),
                                 traffic_gb_per_step=sends, stages=(quarter,) * 4)  # 4 equal stages
    sp, one = fit.speed(report), fit.speed(flat)
    assert sp["compute_seconds"] == pytest.approx(one["compute_seconds"] / 4 / (1 - 3 / 11))
    assert sp["comm_seconds"] > 0 == one["comm_seconds"]


def test_layout_refusals_is_the_one_pipeline_rule():
    """The planner asks the same function resolve does: tensor parallelism inside the stages passes, the rest is
    one line per refusal naming the key."""
    from pretrain_cli.config.pipeline import layout_refusals

    assert layout_refusals(64, 4, 1, 80) == []  # tp 8 x pp 4 (tp is not a pipeline refusal)
    assert layout_refusals(8, 1, 2, 2) == []  # no pipeline, nothing to refuse here
    lines = layout_refusals(8, 2, 2, 4)  # (ZeRO-3 with a pipeline: config.refusals' table, through resolve)
    assert [line.split(":")[0] for line in lines] == ["virtual_pp_degree"]
    assert all("\n" not in line for line in lines)
    assert layout_refusals(6, 4) == ["pipeline_parallel_degree: 4 does not divide the world size 6; use a divisor of it"]
    assert "use at most 2" in layout_refusals(4, 4, layers=2)[0]


def test_layout_messages_name_the_world_and_one_process_notes_what_many_note():
    """tp x pp that does not fit is named against the whole world; on one process sequence_parallel and
    virtual_pp_degree get the notes a launch gives them, and a pp 8 file names the launch it needs."""
    with pytest.raises(UserError, match=r"tensor_parallel_degree: 2 x pipeline_parallel_degree 2 = 4 does not divide "
                                        r"the world size 2;"):
        resolve_run("--tensor_parallel_degree", "2", "--pipeline_parallel_degree", "2", world=2)
    for flags, note in ((("--sequence_parallel", "true"), "sequence_parallel: only meaningful with tensor parallelism"),
                        (("--virtual_pp_degree", "2"), "virtual_pp_degree: only meaningful with pipeline_parallel")):
        for world in (1, 2):
            assert any(note in n for n in resolve_run(*flags, world=world).notes), (flags, world)
    eight = resolve_run("--pipeline_parallel_degree", "8", "--virtual_pp_degree", "2", world=1, model="llama-171m")
    assert ("parallel: one process, so pipeline_parallel_degree=8, virtual_pp_degree=2 has no effect; the file's "
            "layout needs 8 processes: `check --world_size 8`") in "\n".join(eight.notes)


def test_the_stages_mask_documents_with_doc_start_alone_as_the_model_does():
    """`reset_position_ids: false` sends doc_start without position_ids: the stages once received (ids, doc_start)
    and `Block` passed doc_start in the layer's position_ids slot (RoPE at document starts, no document mask).
    Embed -> Block per layer -> Final on `inputs_of`'s tuple equals the model's own forward with doc_start only."""
    import numpy as np

    from pretrain_cli import runtime
    from pretrain_cli.distributed.strategies.pipeline import inputs_of
    from pretrain_cli.distributed.steps.pipeline_stages import Block, Embed, Final
    from pretrain_cli.models import build_model
    from pretrain_cli.ops import kernels

    paddle = runtime.import_paddle()
    paddle.seed(0)
    dec = build_model(model_config("micro-qwen2"), kernels.select(None, "cpu")).model
    ids = paddle.to_tensor(np.random.default_rng(0).integers(0, 256, (2, 12)).astype("int64"))
    doc_start = paddle.to_tensor(np.array([[0] * 5 + [5] * 7, [0] * 12], dtype="int64"))  # [2, 12]
    x = Embed(dec.embed_tokens)(inputs_of(ids, {"doc_start": doc_start}))
    for layer in dec.layers:
        x = Block(layer, dec.rotary_emb)(x)
    got, want = Final(dec.norm)(x).numpy(), dec(ids, None, None, doc_start).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert np.abs(dec(ids).numpy()[0, 5:] - want[0, 5:]).max() > 1e-3  # (the mask matters for the second document)
