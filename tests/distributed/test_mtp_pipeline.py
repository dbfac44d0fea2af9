"""DeepSeek-V3's multi-token prediction and router terms inside fleet's pipeline, through the real launcher:
`micro-deepseek-v3` with its MTP module (layer 2) at pp2, 4 micro-batches of 2 a step, with the sequence-wise balance
loss, the router z-loss and the auxiliary-loss-free balancing bias on, equal to one process with the same
micro-batches step by step (<= 1e-5: the loss, and the MTP, aux and z losses logged apart; the per-layer expert
load), and its checkpoint-5 (the biases in it) resumed on one process on the same curve.

What makes it run (`distributed.steps.pipeline_stages`): the input ids travel with the hidden states to the last
stage, which holds the MTP module and a copy of the embedding's table (fleet's shared layer, its gradient summed
with the first stage's); the loss adds the MTP term there. The router losses' sums travel last in the stream
(`RouterStream`: the first stage's layer 0 is dense, so they reach the second stage as zeros), the last stage adds
its sparse layer's and the MTP module's and forms the losses; each stage updates its own layers' biases. The
checkpoint holds the one embedding (written by the first stage) and the MTP module under `model.layers.2.*`, as one
process's. One launch serves every test here.
"""
from __future__ import annotations

import pytest

from launch_helpers import (STEPS, assert_close_losses, assert_close_tensors, expert_shares, launch_joined, logged,
                            read_checkpoint, read_weights, reference, resume_from, write_config)

ROUTER = dict(model_name_or_path="micro-deepseek-v3", router_aux_loss_coef=0.01, router_z_loss_coef=0.001,
              moe_router_bias_update_rate=0.01, save_steps=5)
LOGGED = ("mtp_loss", "aux_loss", "z_loss", "lm_loss")  # lm_loss: the LM part of the loss, what eval_loss measures
MICRO = dict(gradient_accumulation_steps=4, per_device_train_batch_size=2)  # the pipeline's micro-batches
# The weights after 5 steps, where AdamW divides each gradient by its own running RMS: a few elements whose
# gradients differ by rounding (one process at 2 threads, each stage at 1: MKL sums in another order) move by a
# visible fraction of the learning rate. Measured 9.4e-6 on AMD Zen 1 (the MTP projection); on Zen 4 (MKL's AVX-512
# path) 3.01e-5 at one element of 8,192 in layer 0's down projection (median 1.9e-9; its moments agree to 3e-4
# relative), the same before and after the MLP op of docs/PERFORMANCE.md §3.12.
TOL_WEIGHTS = 5e-5


@pytest.fixture(scope="module")
def runs(corpus, shared, tmp_path_factory):
    """(the one-process reference, (the pp2 run, its output dir))."""
    root = tmp_path_factory.mktemp("mtp_pipeline")
    ref = reference(shared, corpus, **MICRO, **ROUTER)
    cfg = write_config(root / "pp2.json", corpus, root / "pp2", pipeline_parallel_degree=2, **MICRO, **ROUTER)
    run = launch_joined(cfg, root / "pp2_log", 2)
    assert run.returncode == 0, run.explain()
    return ref, (run, root / "pp2")


def test_pp2_with_mtp_and_router_terms_matches_one_process(runs):
    """Every step's loss, MTP, aux and z loss (logged by rank 0, on the first stage; computed on the last) and
    per-layer expert load equal to one process's; the final weights too (the embedding trained by both stages'
    lookups, the MTP module, the biases each stage moved)."""
    (ref, rout), (run, out) = runs
    assert "pipeline" in run.log(0)
    assert_close_losses(run.losses(0), ref.losses(0), range(1, STEPS + 1))
    for name in LOGGED:
        got, want = logged(run.log(0), name), logged(ref.log(0), name)
        assert_close_losses(got, want, range(1, STEPS + 1))
        assert all(v > 0 for v in want.values()), name  # a real term, not a missing one read as 0
    assert all(v > 1.0 for v in logged(ref.log(0), "mtp_loss").values())  # the MTP loss: a real cross-entropy
    shares = expert_shares(ref.log(0))  # layer 1's on the first stage, the MTP module's on the second
    assert expert_shares(run.log(0)) == shares and len(shares) == STEPS and len(shares[0].split(",")) == 2
    weights, expected = read_weights(out), read_weights(rout)
    assert "model.layers.2.eh_proj.weight" in weights and "model.embed_tokens.weight" in weights
    assert any(k.endswith("e_score_correction_bias") for k in weights)
    assert_close_tensors(weights, expected, tol=TOL_WEIGHTS)


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
    assert_close_tensors(read_checkpoint(ckpt, "weights"), read_checkpoint(rout / "checkpoint-5", "weights"),
                         tol=TOL_WEIGHTS)
    resumed = resume_from(ckpt, corpus, tmp_path, 1, **MICRO, **ROUTER)
    assert_close_losses(resumed.losses(0), ref.losses(0), range(6, STEPS + 1))
    for name in LOGGED:
        assert_close_losses(logged(resumed.log(0), name), logged(ref.log(0), name), range(6, STEPS + 1))
