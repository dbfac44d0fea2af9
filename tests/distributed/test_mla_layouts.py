"""DeepSeek-V2/V3's multi-head latent attention under the layouts that split a model, through the real launcher, each
equal to one process step by step (<= 1e-5 per step's loss):

- tensor parallelism (tp2): the `tp` layout step's split of MLA by heads (q_b_proj / kv_b_proj by output columns,
  o_proj by input rows; the latent down-projections, their norms and the shared RoPE key whole:
  `distributed.steps.tensor_parallel.split_latent`), on `micro-deepseek-v3` with everything on: its MTP module
  (split alike), the sequence-wise balance loss, the balancing bias; tp2's checkpoint-5 (each rank's slices)
  resumes on one process on the same curve;
- tp2 x ZeRO-3 on the semi-auto engine (two data ranks, 4 processes), on the same model with everything on;
- fleet's pipeline: tp2 x pp2 (the same as DeepSeek-V2: one `q_proj`, softmax routing), with the router terms off
  and no MTP module (the router terms and MTP under a pipeline are test_mtp_pipeline.py's). pp2 alone on micro-deepseek-v3 is no launch of
  its own (the suite's time, issue #54): the pipeline cuts decoder layers whatever their attention, and V3's
  low-rank query is split by tp2 above; docs/DISTRIBUTED.md keeps its measurement.

The references are one process at the same global batch of 8 sequences; one launch per layout (module fixtures).
"""
from __future__ import annotations

import json

import pytest

from launch_helpers import (STEPS, assert_close_losses, assert_close_tensors, launch_joined, read_checkpoint,
                            read_weights, reference, resume_from, single, write_config)

FULL = dict(model_name_or_path="micro-deepseek-v3", save_steps=5)
# layout -> (processes, keys): tp2 on the `tp` step; tp2 x ZeRO-3 over two data ranks on the semi-auto engine (the
# layout `plan --fit` recommends for DeepSeek-V3 on 32 nodes, docs/PLAN.md)
SPLIT = {"tp2": (2, dict(tensor_parallel_degree=2, per_device_train_batch_size=8)),
         "tp2_zero3": (4, dict(tensor_parallel_degree=2, sharding="stage3"))}
# layout -> (model, processes, keys): tp2 x pp2 on DeepSeek-V2-Lite's q_proj
PIPELINE = {"tp2_pp2": ("v2", 4, dict(pipeline_parallel_degree=2, tensor_parallel_degree=2))}


@pytest.fixture(scope="module")
def quiet(tmp_path_factory) -> dict:
    """{"v3": micro-deepseek-v3 without its MTP module, "v2": the same as DeepSeek-V2-Lite has it (one `q_proj`, softmax
    greedy routing)}: the keys of each with the router terms off (this pipeline launch checks MLA's split; the router
    terms under a pipeline are test_mtp_pipeline.py's)."""
    from pretrain_cli.config.presets import PRESET_DIR

    v3 = json.loads((PRESET_DIR / "micro-deepseek-v3" / "config.json").read_text())
    v3["num_nextn_predict_layers"] = 0
    v2 = {k: v for k, v in v3.items() if k not in ("num_nextn_predict_layers", "n_group", "topk_group")}
    v2.update(architectures=["DeepseekV2ForCausalLM"], model_type="deepseek_v2", q_lora_rank=None,
              topk_method="greedy", scoring_func="softmax", norm_topk_prob=False, routed_scaling_factor=1.0)
    out = {}
    for name, cfg in (("v3", v3), ("v2", v2)):
        model = tmp_path_factory.mktemp(f"micro_deepseek_{name}")
        (model / "config.json").write_text(json.dumps(cfg))
        out[name] = dict(model_name_or_path=str(model), router_aux_loss_coef=0, moe_router_bias_update_rate=0)
    return out


@pytest.fixture(scope="module")
def split(corpus, shared, tmp_path_factory):
    """{"one": the reference, "tp2", "tp2_zero3"}: each (run, output dir), micro-deepseek-v3 with everything on."""
    root = tmp_path_factory.mktemp("mla_split")
    out = {"one": reference(shared, corpus, per_device_train_batch_size=8, **FULL)}
    for name, (nproc, over) in SPLIT.items():
        cfg = write_config(root / f"{name}.json", corpus, root / name, **over, **FULL)
        run = launch_joined(cfg, root / f"{name}_log", nproc)
        assert run.returncode == 0, run.explain()
        out[name] = run, root / name
    return out


@pytest.fixture(scope="module")
def pipeline(corpus, tmp_path_factory, quiet):
    """{model: the one-process reference, layout: (run, output dir)}, 4 micro-batches of 2 a step."""
    root = tmp_path_factory.mktemp("mla_pipeline")
    out = {}
    for model, keys in ((m, quiet[m]) for m in {model for model, _, _ in PIPELINE.values()}):
        run = single(write_config(root / f"{model}.json", corpus, root / model, per_device_train_batch_size=8, **keys),
                     root / f"{model}_log")
        assert run.returncode == 0, run.explain()
        out[model] = run, root / model
    for name, (model, nproc, over) in PIPELINE.items():
        cfg = write_config(root / f"{name}.json", corpus, root / name, gradient_accumulation_steps=4,
                           per_device_train_batch_size=2, **quiet[model], **over)
        run = launch_joined(cfg, root / f"{name}_log", nproc)
        assert run.returncode == 0, run.explain()
        out[name] = run, root / name
    return out


def test_tp2_matches_one_process_and_its_checkpoint_resumes_there(corpus, tmp_path, split):
    """Every step's loss (with the MTP and balance terms) equal to one process's; each rank wrote its slices of
    q_b/kv_b/o and of every expert, which assemble to one process's checkpoint-5 (the bias and the MTP module too);
    one process resumed from it continues the same curve."""
    (ref, rout), (run, out) = split["one"], split["tp2"]
    assert "tensor parallel" in run.log(0) and "mtp_loss" in run.log(0)
    assert "head+loss=cpu" in run.log(0)  # the `tp` step's whole head: the fused head + loss (the MTP depth's too)
    assert_close_losses(run.losses(0), ref.losses(0), range(1, STEPS + 1))
    weights, want = (read_checkpoint(d / "checkpoint-5", "weights") for d in (out, rout))
    assert "model.layers.2.self_attn.kv_b_proj.weight" in weights  # the MTP module's, whole again
    assert any(n.endswith("mlp.gate.e_score_correction_bias") for n in weights)
    # the moments within 1e-5 (measured 5.7e-7); AdamW turns the summation order's noise in near-zero gradients
    # (rare tokens' embedding rows, the MTP projection) into 3.4e-5 of the weights by step 5
    assert_close_tensors(read_checkpoint(out / "checkpoint-5"), read_checkpoint(rout / "checkpoint-5"))
    assert_close_tensors(weights, want, tol=1e-4)
    assert_close_tensors(read_weights(out), read_weights(rout), tol=1e-4)
    resumed = resume_from(out / "checkpoint-5", corpus, tmp_path, 1, per_device_train_batch_size=8, **FULL)
    assert_close_losses(resumed.losses(0), ref.losses(0), range(6, STEPS + 1))


@pytest.mark.parametrize("layout", sorted(PIPELINE))
def test_pipeline_layouts_match_one_process(pipeline, layout):
    (ref, rout), (run, out) = pipeline[PIPELINE[layout][0]], pipeline[layout]
    assert "pipeline" in run.log(0) and "head+loss=cpu" in run.log(0)  # the last stage's whole head, fused
    assert_close_losses(run.losses(0), ref.losses(0), range(1, STEPS + 1))
    assert_close_tensors(read_weights(out), read_weights(rout), tol=1e-4)


def test_tp2_zero3_matches_one_process(split):
    """tp2 x ZeRO-3 on the semi-auto engine (4 processes: the TP plan's placements, parameters sharded over two data
    ranks): MLA's RoPE part and DeepSeek's sequence-wise balance loss on distributed tensors (`local_kernels`'
    contiguous outputs, the loss reshaped 0-D)."""
    (ref, rout), (run, out) = split["one"], split["tp2_zero3"]
    assert "semi-auto" in run.log(0) and "mtp_loss" in run.log(0)
    assert "head+loss=off" in run.log(0)  # vocab_size 512 split over tp 2: the vocabulary-split head keeps the logits
    assert_close_losses(run.losses(0), ref.losses(0), range(1, STEPS + 1))
    assert_close_tensors(read_weights(out), read_weights(rout), tol=1e-4)
