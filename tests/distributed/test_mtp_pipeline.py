"""DeepSeek-V3's multi-token prediction inside fleet's pipeline, through the real launcher: `micro-deepseek-v3` with
its MTP module (layer 2) at pp2, 4 micro-batches of 2 a step, equal to one process at the same global batch of 8 step
by step (<= 1e-5, the loss and the MTP loss logged apart), and its checkpoint-5 resumed on one process on the same
curve. The router terms are off (a pipeline refuses them: `config.refusals`).

What makes it run (`distributed.steps.pipeline_stages`): the input ids travel with the hidden states to the last
stage, which holds the MTP module and a copy of the embedding's table (fleet's shared layer, its gradient summed
with the first stage's); the loss adds the MTP term there. The checkpoint holds the one embedding (written by the
first stage) and the MTP module under `model.layers.2.*`, as one process's. One launch serves every test here.
"""
from __future__ import annotations

import re

import pytest

from launch_helpers import (STEPS, assert_close_losses, assert_close_tensors, launch_joined, read_checkpoint,
                            read_weights, reference, resume_from, write_config)

QUIET = dict(model_name_or_path="micro-deepseek-v3", router_aux_loss_coef=0, moe_router_bias_update_rate=0,
             save_steps=5)


def mtp_losses(log: str) -> dict[int, float]:
    """{step: the logged mtp_loss} of a rank's log (the step lines only)."""
    out = {}
    for line in log.splitlines():
        step, value = re.search(r"global_step: (\d+)", line), re.search(r"mtp_loss: ([0-9.eE+-]+)", line)
        if "interval_runtime" in line and step and value:
            out[int(step.group(1))] = float(value.group(1))
    return out


@pytest.fixture(scope="module")
def runs(corpus, shared, tmp_path_factory):
    """(the one-process reference, (the pp2 run, its output dir))."""
    root = tmp_path_factory.mktemp("mtp_pipeline")
    ref = reference(shared, corpus, per_device_train_batch_size=8, **QUIET)
    cfg = write_config(root / "pp2.json", corpus, root / "pp2", pipeline_parallel_degree=2,
                       gradient_accumulation_steps=4, per_device_train_batch_size=2, **QUIET)
    run = launch_joined(cfg, root / "pp2_log", 2)
    assert run.returncode == 0, run.explain()
    return ref, (run, root / "pp2")


def test_pp2_with_mtp_matches_one_process(runs):
    """Every step's loss and MTP loss (logged by rank 0, on the first stage; computed on the last) equal to one
    process's; the final weights too (the embedding trained by both stages' lookups, the MTP module)."""
    (ref, rout), (run, out) = runs
    assert "pipeline" in run.log(0)
    assert_close_losses(run.losses(0), ref.losses(0), range(1, STEPS + 1))
    got, want = mtp_losses(run.log(0)), mtp_losses(ref.log(0))
    assert_close_losses(got, want, range(1, STEPS + 1))
    assert all(v > 1.0 for v in want.values())  # a real cross-entropy, not a missing term read as 0
    weights, expected = read_weights(out), read_weights(rout)
    assert "model.layers.2.eh_proj.weight" in weights and "model.embed_tokens.weight" in weights
    assert_close_tensors(weights, expected, tol=3e-5)  # measured 9.4e-6 (the MTP projection: AdamW on tiny gradients)


def test_pp2_checkpoint_holds_one_embedding_and_resumes_on_one_process(runs, corpus, tmp_path):
    """checkpoint-5's pieces assemble to one process's names (the embedding once, from the first stage's file; the
    MTP module from the last's) and values; one process resumed from it continues the reference's curve."""
    import json

    (ref, rout), (run, out) = runs
    ckpt = out / "checkpoint-5"
    index = json.loads((ckpt / "checkpoint.index.json").read_text())["tensors"]
    assert [p["file"] for p in index["model.embed_tokens.weight"]["pieces"]] == ["model-00001-of-00002.safetensors"]
    assert {p["file"] for p in index["model.layers.2.eh_proj.weight"]["pieces"]} == {"model-00002-of-00002.safetensors"}
    assert_close_tensors(read_checkpoint(ckpt), read_checkpoint(rout / "checkpoint-5"))  # the AdamW moments
    assert_close_tensors(read_checkpoint(ckpt, "weights"), read_checkpoint(rout / "checkpoint-5", "weights"), tol=3e-5)
    resumed = resume_from(ckpt, corpus, tmp_path, 1, per_device_train_batch_size=8, **QUIET)
    assert_close_losses(resumed.losses(0), ref.losses(0), range(6, STEPS + 1))
    assert_close_losses(mtp_losses(resumed.log(0)), mtp_losses(ref.log(0)), range(6, STEPS + 1))
