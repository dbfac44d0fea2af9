"""Pipeline parallelism (fleet's 1F1B engine) through the real launcher, against one process at the same global batch.

micro-qwen2 (2 decoder layers, tied embeddings, q/k/v biases) split into 2 stages: the embedding and layer 0 on
stage 0, layer 1, the final norm and the tied head on stage 1; with 8 decoder layers (`num_hidden_layers: 8`) into
4 stages x 2 virtual chunks on 4 processes (interleaved 1F1B), against one process with the same 8 layers. Global
batch 8 everywhere: per-device micro-batch x gradient_accumulation_steps x data ranks. pp2 x dp2 as ZeRO-2 over each
stage's 2 replicas (`sharding: stage2`: ZeRO-1's ownership, and only the owned gradients kept between steps).

One launch per code path (the suite's time, issue #54): 1F1B in 2 stages with documents, recompute and evaluation;
ZeRO-2 inside the stages; the interleaved schedule over 4 stages (middle stages that send both ways, the per-edge
gloo groups). Plain data parallelism and ZeRO-1 inside the stages are the same steps with tensor parallelism added in
test_tp_pipeline.py (tp2 x pp2 x dp2, tp2 x pp2 x stage1: curve, pieces, what each rank holds); plain 1F1B over 4
stages is pp2's schedule with pp4_vpp2's cut and groups; benchmarks/layout_matrix.py runs pp2 x dp2 and pp2 x
stage1/2 against one process. SIGTERM and a killed rank: test_dist.py's layouts include PP2.
"""
from __future__ import annotations

import json

import pytest
from launch_helpers import (DOC, STEPS, assert_close_losses, assert_close_tensors, launch, read_checkpoint,
                            read_weights, single, write_config)

PP = dict(pipeline_parallel_degree=2, gradient_accumulation_steps=2)
# interleaved 1F1B: 8 decoder layers in 4 stages x 2 chunks (stage s holds layers s and s + 4), 8 micro-batches of 1,
# evaluated through the interleaved schedule too
EIGHT = dict(num_hidden_layers=8, do_eval=True, eval_steps=5, eval_iters=2)
VPP = dict(EIGHT, pipeline_parallel_degree=4, virtual_pp_degree=2, gradient_accumulation_steps=8,
           per_device_train_batch_size=1)
PP2 = dict(PP, per_device_train_batch_size=4)
# (processes, keys, reference): "ref" is conftest's one process at batch 8; "doc" the same with document masking,
# recompute and evaluation (`DOC`). pp2 on 2 processes runs with them only (the causal mask in 2 stages: pp2_stage2)
LAYOUTS = {
    "pp2_stage2": (4, dict(PP, per_device_train_batch_size=2, sharding="stage2"), "ref"),  # ZeRO-2 in each stage
    # 4 stages: the middle ones send both ways (distributed/comms/gloo.py on CPU)
    "pp4_vpp2": (4, VPP, "ref8"),
    # packed documents, recompute and evaluation inside the stages
    "pp2_doc": (2, dict(PP2, **DOC), "doc"),
}


def _launch(cfg, log_dir, nproc: int):
    return launch(cfg, log_dir, nproc=nproc, timeout=480)  # 4 processes on a loaded 2-core machine


@pytest.fixture(scope="module")
def refs(ref, doc_ref, corpus, tmp_path_factory):
    """conftest's reference, the same with document masking (`doc_ref`), and one process with 8 decoder layers (saves
    step 5)."""
    root = tmp_path_factory.mktemp("pp_refs")
    eight = single(write_config(root / "ref8.json", corpus, root / "ref8", per_device_train_batch_size=8, save_steps=5,
                                **EIGHT), root / "log_ref8", timeout=600)
    assert eight.returncode == 0, eight.explain()
    return {"ref": ref, "doc": doc_ref, "ref8": (eight, root / "ref8")}


@pytest.fixture(scope="module")
def runs(corpus, tmp_path_factory):
    out = {}
    for name, (nproc, keys, _) in LAYOUTS.items():
        root = tmp_path_factory.mktemp(name)
        cfg = write_config(root / f"{name}.json", corpus, root / "out", save_steps=5, **keys)
        run = _launch(cfg, root / "log", nproc)
        assert run.returncode == 0, run.explain()
        out[name] = (run, root / "out")
    return out


def _evals(run) -> list[str]:
    return [line.split("eval_loss: ")[1].split(",")[0] for line in run.log(0).splitlines() if "eval_loss: " in line]


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_pipeline_matches_one_process(runs, refs, name):
    nproc, keys, against = LAYOUTS[name]
    (run, out), (r, rout) = runs[name], refs[against]
    pp = keys["pipeline_parallel_degree"]
    assert_close_losses(run.losses(0), r.losses(0), range(1, STEPS + 1))
    assert_close_tensors(read_weights(out), read_weights(rout))
    logs = "".join(run.log(n) for n in range(nproc))
    assert "Traceback" not in logs
    virtual = " x2 virtual" if keys.get("virtual_pp_degree") else ""
    data = (f"dp 1, sharding stage{keys['sharding'][-1]} x{nproc // pp}" if keys.get("sharding")  # check's words
            else f"dp {nproc // pp}")
    assert f"layout: pipeline (fleet 1F1B): {data}, pp {pp}{virtual}" in run.log(0), run.log(0)[-3000:]
    if name == "pp2_stage2":  # each rank keeps the AdamW state of half its stage and, between steps, the gradients
        # of the parameters it owns (about half; ZeRO-1 keeps every gradient: test_tp_pipeline.py's tp2_pp2_stage1)
        per_rank = [r for r in map(json.loads, (out / "metrics.jsonl").open()) if r["kind"] == "layout"][0]["per_rank"]
        assert all(r["optimizer_state"] < 0.6 * 2 * r["parameters"] for r in per_rank), per_rank
        assert all(r["gradients"] / r["parameters"] < 0.6 for r in per_rank), per_rank
        assert "sharding stage2 x2, pp 2" in run.log(0)
    if name in ("pp2_doc", "pp4_vpp2"):  # evaluation runs forward-only through the stages and reads the same loss
        got, want = map(float, _evals(run)), map(float, _evals(r))  # the interleaved sum is rescaled: rounding
        assert len(_evals(run)) == 2 and all(abs(g - w) <= 1e-5 for g, w in zip(got, want, strict=True))
    if name == "pp2_doc":
        assert "attention_mask_type = \"document\"" in run.log(0)


def test_each_stage_writes_its_own_tensors_and_ties_stay_one_tensor(runs, ref):
    """Saved by every rank at once, nothing gathered: each stage's ranks write that stage's layers (the ZeRO owners
    share the bytes; replicas too: test_tp_pipeline.py's three-axis layouts), and the pieces assembled are the
    reference's tensors by HF name."""
    out, rout = runs["pp2_stage2"][1], ref[1]
    ckpt = out / "checkpoint-5"
    for kind in ("optimizer", "weights"):
        saved, want = read_checkpoint(ckpt, kind), read_checkpoint(rout / "checkpoint-5", kind)
        assert sorted(saved) == sorted(want)  # tied: the two stages' copies are one tensor, as in HF
        assert_close_tensors(saved, want)
    index = json.loads((ckpt / "checkpoint.index.json").read_text())
    for kind in ("model", "optimizer"):
        sizes = [f["bytes"] for n, f in index["files"].items() if n.startswith(kind)]
        assert len(sizes) == 4 and min(sizes) > 0, (kind, sizes)  # every rank wrote a share
    held = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    per_rank = [r for r in held if r["kind"] == "layout"][0]["per_rank"]
    whole = sum(v.size for v in read_weights(rout).values()) * 4
    assert len(per_rank) == 4 and all(r["parameters"] < 0.8 * whole for r in per_rank)  # each stage holds its part
    # each stage's tensors whole: the checkpoint is what transformers loads as it is (model.safetensors.index.json)
    import numpy as np
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(str(ckpt)).eval()
    weights = read_checkpoint(ckpt, "weights")
    for name, param in hf.named_parameters():
        np.testing.assert_array_equal(param.detach().numpy(), weights[name])


# saved under -> resumed under; the 8-layer model's checkpoints against its own reference ("ref8"), pp2_doc's resumed
# with documents (as one process's "doc"). A pipeline's checkpoint on one process (every writer), and the interleaved
# 4-stage cut re-cut into 2 stages (a pipeline reading another pipeline's files); one process's checkpoint under a
# pipeline: test_tp_pipeline.py's ref-to-tp2_pp2 (the same reader, a TP slice of each stage)
RESUMES = [("pp2_doc", "single"), ("pp2_stage2", "single"), ("pp4_vpp2", "single8"), ("pp4_vpp2", "pp2_8")]
UNDER = {"single": (1, dict(per_device_train_batch_size=8)),
         "single8": (1, dict(EIGHT, per_device_train_batch_size=8)), "pp2_8": (2, dict(EIGHT, **PP2))}


@pytest.mark.parametrize("saved,under", RESUMES, ids=[f"{a}-to-{b}" for a, b in RESUMES])
def test_resume_across_pipeline_layouts_continues_the_same_curve(runs, refs, corpus, tmp_path, saved, under):
    against = saved if saved in refs else LAYOUTS[saved][2]
    ref = refs[against]
    source = ref[1] if saved in refs else runs[saved][1]
    nproc, keys = UNDER[under]
    cfg = write_config(tmp_path / "c.json", corpus, tmp_path / "out", overwrite_output_dir=False,
                       resume_from_checkpoint=str(source / "checkpoint-5"), **keys, **(DOC if against == "doc" else {}))
    run = single(cfg, tmp_path / "log", timeout=600) if nproc == 1 else _launch(cfg, tmp_path / "log", nproc)
    assert run.returncode == 0, run.explain()
    assert "resumed from" in run.log(0) and "at step 5" in run.log(0)
    assert_close_losses(run.losses(0), ref[0].losses(0), range(6, STEPS + 1))
    assert_close_tensors(read_weights(tmp_path / "out"), read_weights(ref[1]))
