"""Tensor parallelism inside pipeline stages (distributed/steps/tensor_parallel.py) through the real launcher.

TP2 x PP2 on 4 processes: micro-qwen2 (2 decoder layers, 4 heads, 2 KV heads, tied embeddings) in 2 stages, each
stage's layers split over 2 tensor-parallel ranks, 4 micro-batches of 2 a step = conftest's one-process global
batch of 8. One launch with document masking, recompute and evaluation (`DOC`) must follow the one-process curve
step by step (conftest's `doc_ref`), save through the sharded format (each rank its TP slice of its stage) and
resume on one process and on semi-auto tp2 (the other TP implementation reading the `tp` step's pieces), and resume
from one process's checkpoint (each rank slicing whole tensors). (The causal mask under TP2 x PP2: the
three-axis layouts below.)

The three-axis layouts on 8 processes (one launch each, a module fixture): tp2 x pp2 x dp2 and tp2 x pp2 x
`sharding: stage1` (ZeRO-1 over 2 in each stage), 4 micro-batches of 1 per data rank (global batch 8). Both follow
the one-process curve step by step, their checkpoints assemble to the one-process tensors and resume (ZeRO-1's
and dp2's on one process) on the same curve: the reader that cuts pieces into tp2 x pp2's boxes is proven by one
process's checkpoint resumed there. They are also the suite's pipeline with plain data
parallelism and with ZeRO-1 inside the stages (test_pipeline.py launches ZeRO-2 there): the tp step adds a split
of each stage, the data side is the same code.
"""
from __future__ import annotations

import json

import pytest
from launch_helpers import (DOC, STEPS, assert_checkpoint_matches, assert_close_losses, assert_close_tensors, evals,
                            launch_joined, read_weights, single, write_config)

TP_PP = dict(pipeline_parallel_degree=2, tensor_parallel_degree=2, gradient_accumulation_steps=4,
             per_device_train_batch_size=2)


@pytest.fixture(scope="module")
def tp_pp(corpus, tmp_path_factory):
    """TP2 x PP2 with document masking, recompute and evaluation (`DOC`), saving checkpoint-5."""
    root = tmp_path_factory.mktemp("tp2_pp2")
    run = launch_joined(write_config(root / "c.json", corpus, root / "out", save_steps=5, **TP_PP, **DOC), root / "log",
                        4)
    assert run.returncode == 0, run.explain()
    return run, root / "out"


def test_tp2_pp2_matches_one_process_step_by_step(tp_pp, doc_ref):
    """The same curve, weights and evaluation (loss and token count) as one process, with packed documents,
    recompute and evaluation inside the tensor-parallel stages."""
    (run, out), (r, rout) = tp_pp, doc_ref
    assert_close_losses(run.losses(0), r.losses(0), range(1, STEPS + 1))  # <= 1e-5 every step
    assert_close_tensors(read_weights(out), read_weights(rout))
    got, want = evals(run), evals(r)
    assert len(got) == len(want) == 2 and [t for _, t in got] == [t for _, t in want]  # the same tokens counted once
    assert all(abs(float(a) - float(b)) <= 1e-5 for (a, _), (b, _) in zip(got, want)), (got, want)
    assert "layout: pipeline (fleet 1F1B): dp 1, tp 2, pp 2" in run.log(0) and "recompute full" in run.log(0)
    # the last stage's head is whole on each tp rank: the fused head + loss runs there, as on one process
    assert "head+loss=cpu" in run.log(0)  # (rank 0 logs the kernels; every rank builds the same table)
    assert all("Traceback" not in run.log(n) for n in range(4))


def test_each_rank_writes_the_tp_slice_of_its_stage(tp_pp, doc_ref):
    """Every rank wrote a share (its stage's TP slices are its alone), and the pieces assemble to the one-process
    checkpoint's tensors, weights and AdamW state alike."""
    out, rout = tp_pp[1], doc_ref[1]
    ckpt = out / "checkpoint-5"
    assert_checkpoint_matches(ckpt, rout / "checkpoint-5")
    index = json.loads((ckpt / "checkpoint.index.json").read_text())
    q = index["tensors"]["model.layers.0.self_attn.q_proj.weight"]  # HF [out, in]: split on out (rows)
    assert sorted(tuple(p["offsets"]) for p in q["pieces"]) == [(0, 0), (q["shape"][0] // 2, 0)]
    for kind in ("model", "optimizer"):
        sizes = [f["bytes"] for n, f in index["files"].items() if n.startswith(kind)]
        assert len(sizes) == 4 and min(sizes) > 0, (kind, sizes)


# saved under -> resumed under: (processes, keys)
UNDER = {"single": (1, dict(per_device_train_batch_size=8)),
         "tp2": (2, dict(tensor_parallel_degree=2, per_device_train_batch_size=8)), "tp2_pp2": (4, TP_PP)}
def test_tp2_pp2_checkpoint_exports_to_transformers(tp_pp, doc_ref, tmp_path):
    """`pretrain-cli export --dtype bfloat16` of the TP2 x PP2 checkpoint-5 (per-rank pieces, which transformers
    cannot load) gives a directory transformers loads, with the one-process run's logits at step 5 (bf16
    weights: within bf16's rounding of them)."""
    import torch
    import transformers
    from safetensors import safe_open

    from pretrain_cli.cli import main

    assert main(["export", str(tp_pp[1] / "checkpoint-5"), str(tmp_path / "hf"), "--dtype", "bfloat16"]) == 0
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["torch_dtype"] == "bfloat16"
    with safe_open(str(tmp_path / "hf" / "model.safetensors"), "pt") as f:
        assert {f.get_slice(k).get_dtype() for k in f.keys()} == {"BF16"}
    got, want = (transformers.AutoModelForCausalLM.from_pretrained(str(d), dtype=torch.float32).eval()
                 for d in (tmp_path / "hf", doc_ref[1] / "checkpoint-5"))
    ids = torch.tensor([[3, 17, 200, 45, 9, 300, 12, 88, 5, 400, 33, 7]])
    with torch.no_grad():
        a, b = got(ids).logits, want(ids).logits
    err = (a - b).abs().max().item()
    assert 0 < err <= 2e-2 * max(1.0, b.abs().max().item()), err  # bf16 rounding, nothing more
    assert (a.argmax(-1) == b.argmax(-1)).float().mean() >= 0.9


# (a pipeline reading another pipeline's checkpoint: test_pipeline.py's pp4_vpp2-to-pp2_8)
RESUMES = [("tp2_pp2", "single"), ("tp2_pp2", "tp2"), ("ref", "tp2_pp2")]


@pytest.mark.parametrize("saved,under", RESUMES, ids=[f"{a}-to-{b}" for a, b in RESUMES])
def test_resume_across_layouts_continues_the_same_curve(tp_pp, doc_ref, corpus, tmp_path, saved, under):
    """With `DOC`, as the runs that saved the checkpoints (`tp_pp` and conftest's `doc_ref`)."""
    ref = doc_ref
    source = (ref if saved == "ref" else tp_pp)[1]
    nproc, keys = UNDER[under]
    cfg = write_config(tmp_path / "c.json", corpus, tmp_path / "out", overwrite_output_dir=False,
                       resume_from_checkpoint=str(source / "checkpoint-5"), **keys, **DOC)
    run = single(cfg, tmp_path / "log") if nproc == 1 else launch_joined(cfg, tmp_path / "log", nproc)
    assert run.returncode == 0, run.explain()
    assert "resumed from" in run.log(0) and "at step 5" in run.log(0)
    assert_close_losses(run.losses(0), ref[0].losses(0), range(6, STEPS + 1))
    # semi-auto tp2's row-parallel sums run in another order (test_layouts.py's WEIGHT_TOL)
    assert_close_tensors(read_weights(tmp_path / "out"), read_weights(ref[1]), 2e-5 if under == "tp2" else 1e-5)


# 8 processes: the tp2 x pp2 stages twice over, as data-parallel replicas or as ZeRO-1 owners of half each stage's state
THREE_D = {"tp2_pp2_dp2": dict(TP_PP, per_device_train_batch_size=1),
           "tp2_pp2_stage1": dict(TP_PP, per_device_train_batch_size=1, sharding="stage1")}


@pytest.fixture(scope="module", params=sorted(THREE_D))
def three_d(request, corpus, tmp_path_factory):
    name = request.param
    root = tmp_path_factory.mktemp(name)
    cfg = write_config(root / "c.json", corpus, root / "out", save_steps=5, **THREE_D[name])
    run = launch_joined(cfg, root / "log", 8, timeout=600)
    assert run.returncode == 0, run.explain()
    return name, run, root / "out"


def test_three_axis_layouts_match_one_process_and_write_their_shares(three_d, ref):
    """The same curve and final weights as one process; the checkpoint's pieces (each rank its TP slice of its
    stage; under ZeRO-1 each owner its half of the stage's AdamW state) assemble to one process's tensors."""
    name, run, out = three_d
    r, rout = ref
    assert_close_losses(run.losses(0), r.losses(0), range(1, STEPS + 1))
    assert_close_tensors(read_weights(out), read_weights(rout))
    data = "dp 1, sharding stage1 x2" if name.endswith("stage1") else "dp 2"  # check's words
    assert f"layout: pipeline (fleet 1F1B): {data}, tp 2, pp 2" in run.log(0)
    assert all("Traceback" not in run.log(n) for n in range(8))
    ckpt = out / "checkpoint-5"
    assert_checkpoint_matches(ckpt, rout / "checkpoint-5")
    index = json.loads((ckpt / "checkpoint.index.json").read_text())
    sizes = [f["bytes"] for n, f in index["files"].items() if n.startswith("model")]
    assert len(sizes) == 8 and min(sizes) > 0, sizes  # replicas split the writing: every rank wrote weights
    per_rank = [json.loads(line) for line in (out / "metrics.jsonl").open() if '"layout"' in line][0]["per_rank"]
    state = [x["optimizer_state"] for x in per_rank]
    if name.endswith("stage1"):  # each of a stage's two owners keeps about half of its replica's AdamW state, and
        # every gradient of its slice between steps (ZeRO-2 keeps the owned ones only: test_pipeline.py's pp2_stage2)
        assert max(state) < 0.75 * 2 * max(x["parameters"] for x in per_rank), per_rank
        assert all(x["gradients"] == x["parameters"] for x in per_rank), per_rank
    else:
        assert min(state) >= 2 * min(x["parameters"] for x in per_rank), per_rank


def test_three_axis_checkpoints_resume_on_other_layouts(three_d, ref, corpus, tmp_path):
    """Each 8-process checkpoint resumes on one process on the same curve."""
    _, _, out = three_d
    cfg = write_config(tmp_path / "c.json", corpus, tmp_path / "out", overwrite_output_dir=False,
                       resume_from_checkpoint=str(out / "checkpoint-5"), **UNDER["single"][1])
    run = single(cfg, tmp_path / "log")
    assert run.returncode == 0, run.explain()
    assert "resumed from" in run.log(0) and "at step 5" in run.log(0)
    assert_close_losses(run.losses(0), ref[0].losses(0), range(6, STEPS + 1))
    assert_close_tensors(read_weights(tmp_path / "out"), read_weights(ref[1]))
