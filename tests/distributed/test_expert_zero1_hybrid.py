"""Expert parallelism with fleet's ZeRO-1 and ZeRO-2 on fleet's hybrid groups (`ExpertHybrid`): PaddleNLP's DeepSeek-V3
layout (`llm/config/deepseek-v3/pretrain_argument.json`: pp 2 x `sharding: stage1` x 4 x ep 4 on 8 processes) at its
smallest, pp2 x ZeRO-1 over 2 data ranks x ep2 on 4 processes, and tp2 x ZeRO-1 x ep2 on 4 (no pipeline), each also
under `sharding: stage2`, and the three axes together, pp2 x tp2 x ZeRO-1 x ep2 on 8 processes; each equal to one
process step by step, and the checkpoints of the pipelines (and tp2 x ZeRO-2's) resumed on one process on the same
curve; pp2 x ZeRO-1 x ep2's also on its own layout, where the run goes on to the bit as if never stopped.

What makes it run: fleet's sharding optimizer is built over the rest of the model only (`ExpertHybrid.trained`; its
owners and broadcasts take every sharding rank to hold the same parameters, and it keys them by Paddle's names, which
the experts of other ranks share), each rank's experts join the AdamW's own list after it and are stepped after
fleet's step, and the gradient norm sums the experts' squares over their expert group (and under tp their tp group),
never over the sharding group (`ExpertHybrid.grad_norm`). ZeRO-2 is the same with the rest's unowned gradients
released after each update (`FleetHybrid.step` over the rest only). Before, the ZeRO-2 layouts and pp x tp x ep were
refused (`config.refusals`).

The model is `micro-deepseek-v3` (8 routed experts in 4 groups, a shared expert, a dense first layer, an MTP module
whose layer is sparse too) with its sequence-wise balance loss, z-loss and balancing bias on. Every layout runs 8
micro-batches of 1 sequence a step (2 data ranks x 4), so one process with 8 micro-batches of 1 is the reference of
all (the sequence-wise loss is a loss per micro-batch). 4 steps, a checkpoint at step 2: five 4-process launches (one the
same-layout resume), one 8-process launch and five one-process runs in all.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

from launch_helpers import (assert_close_losses, assert_close_tensors, launch_joined, logged, read_checkpoint,
                            read_weights, reference, resume_from, write_config)

STEPS = 4
KEYS = dict(model_name_or_path="micro-deepseek-v3", router_aux_loss_coef=0.01, router_z_loss_coef=0.001,
            moe_router_bias_update_rate=0.01, max_steps=STEPS, save_steps=2, per_device_train_batch_size=1,
            max_grad_norm=0.5)  # (the global norm is ~0.85: clipped at every step, so a wrong norm changes the update)
LAYOUTS = {f"{axis}2_zero{stage}_ep2": {axis_key: 2, "sharding": f"stage{stage}", "expert_parallel_degree": 2,
                                        "gradient_accumulation_steps": 4}
           for axis, axis_key in (("pp", "pipeline_parallel_degree"), ("tp", "tensor_parallel_degree"))
           for stage in (1, 2)}
LAYOUTS["pp2_tp2_zero1_ep2"] = dict(pipeline_parallel_degree=2, tensor_parallel_degree=2, sharding="stage1",
                                    expert_parallel_degree=2, gradient_accumulation_steps=4)  # (8 processes)
# as tests/distributed/test_mtp_pipeline.py: a few weights whose AdamW steps turn rounding-level gradient differences
# (another summation order on each stage and rank) into a visible fraction of the learning rate
TOL_WEIGHTS = 5e-5


@pytest.fixture(scope="module")
def runs(corpus, shared, tmp_path_factory):
    """{"one": the reference, layout: (run, output dir)}."""
    root = tmp_path_factory.mktemp("expert_zero1_hybrid")
    out = {"one": reference(shared, corpus, gradient_accumulation_steps=8, **KEYS)}
    for name, over in LAYOUTS.items():
        run = launch_joined(write_config(root / f"{name}.json", corpus, root / name, **KEYS, **over),
                            root / f"{name}_log", 8 if "tp2" in name and "pp2" in name else 4)
        assert run.returncode == 0, run.explain()
        out[name] = run, root / name
    return out


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_expert_parallel_with_zero1_or_zero2_on_hybrid_groups_matches_one_process(runs, layout):
    (ref, rout), (run, out) = runs["one"], runs[layout]
    line = next(x for x in run.log(0).splitlines() if "- layout: " in x).split(";")[0]  # in check's words
    assert f"sharding stage{layout[-5]} x2" in line and line.endswith(", ep 2"), run.log(0)[-2000:]
    assert_close_losses(run.losses(0), ref.losses(0), range(1, STEPS + 1))
    for name in ("mtp_loss", "aux_loss", "z_loss"):
        assert_close_losses(logged(run.log(0), name), logged(ref.log(0), name), range(1, STEPS + 1))
    got, want = logged(run.log(0), "grad_norm"), logged(ref.log(0), "grad_norm")  # logged to 4 digits: one unit
    assert sorted(got) == sorted(want) == list(range(1, STEPS + 1))  # of the last apart at most (a rounding edge)
    assert all(abs(got[s] - want[s]) <= 1.01e-4 for s in want), (got, want)
    # every expert (each written by its holder) and the rest (its AdamW state by its ZeRO-1 owner) as one process's
    got, want = (read_checkpoint(d / "checkpoint-2") for d in (out, rout))
    assert any(".layers.2.mlp.experts.7." in n for n in got) and any(".shared_experts." in n for n in got)
    assert_close_tensors(got, want)
    assert_close_tensors(read_checkpoint(out / "checkpoint-2", "weights"),
                         read_checkpoint(rout / "checkpoint-2", "weights"), tol=TOL_WEIGHTS)
    assert_close_tensors(read_weights(out), read_weights(rout), tol=TOL_WEIGHTS)


@pytest.mark.parametrize("layout", ["pp2_zero1_ep2", "pp2_zero2_ep2", "tp2_zero2_ep2", "pp2_tp2_zero1_ep2"])
def test_checkpoint_resumes_on_one_process(runs, corpus, tmp_path, layout):
    run = resume_from(runs[layout][1] / "checkpoint-2", corpus, tmp_path, 1, gradient_accumulation_steps=8, **KEYS)
    assert_close_losses(run.losses(0), runs["one"][0].losses(0), range(3, STEPS + 1))


def test_pp2_zero1_ep2_checkpoint_resumes_on_the_same_layout(runs, corpus, tmp_path):
    """checkpoint-2 of pp2 x ZeRO-1 x ep2 resumed on pp2 x ZeRO-1 x ep2 (4 processes): each rank reads back its stage's
    experts with their AdamW state and its ZeRO-1 slice of the rest's, and the run goes on as if never stopped: steps
    3-4 log the uninterrupted run's losses (and one process's), checkpoint-4 (weights and AdamW state) and the final
    export are the uninterrupted run's to the bit (measured: 0 apart)."""
    (ref, _), (whole, out) = runs["one"], runs["pp2_zero1_ep2"]
    run = resume_from(out / "checkpoint-2", corpus, tmp_path, 4, **KEYS, **LAYOUTS["pp2_zero1_ep2"])
    line = next(x for x in run.log(0).splitlines() if "- layout: " in x).split(";")[0]
    assert "sharding stage1 x2" in line and line.endswith(", ep 2"), run.log(0)[-2000:]
    assert sorted(run.losses(0)) == [3, 4]
    assert {s: run.losses(0)[s] for s in (3, 4)} == {s: whole.losses(0)[s] for s in (3, 4)}
    assert_close_losses(run.losses(0), ref.losses(0), range(3, STEPS + 1))
    resumed = tmp_path / "resumed"
    for got, want in ((read_checkpoint(resumed / "checkpoint-4", kind), read_checkpoint(out / "checkpoint-4", kind))
                      for kind in ("weights", "optimizer")):
        assert sorted(got) == sorted(want) and any(".layers.2.mlp.experts.7." in n for n in got)
        assert all(np.array_equal(got[n], want[n]) for n in want), [n for n in want if not np.array_equal(got[n],
                                                                                                           want[n])]
    got, want = read_weights(resumed), read_weights(out)
    assert sorted(got) == sorted(want) and all(np.array_equal(got[n], want[n]) for n in want)


def _held(out) -> list[dict]:
    """Each rank's bytes held between steps, from the run's `layout` record."""
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [r for r in records if r["kind"] == "layout"][0]["per_rank"]


@pytest.mark.parametrize("axis", ["pp", "tp"])
def test_zero2_releases_the_rests_unowned_gradients_and_the_record_counts_the_experts(runs, axis):
    """The layout record's gradients held between steps: under ZeRO-1 every trained parameter's, the experts' too,
    so all the rank's parameters but the balancing biases (no gradient; 32 bytes a sparse layer here): it counted
    the rest's only (`ExpertHybrid.local_bytes`). Under ZeRO-2 fewer on every rank: the rest's unowned released."""
    one, two = (_held(runs[f"{axis}2_zero{k}_ep2"][1]) for k in (1, 2))
    assert all(0 <= r["parameters"] - r["gradients"] < 1024 for r in one), one
    assert all(0 < b["gradients"] < a["gradients"] for a, b in zip(one, two)), (one, two)
