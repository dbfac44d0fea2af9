"""Expert parallelism with tensor parallelism on the attention (`ExpertTensor`, `distributed.steps.expert_parallel`):
ep2 x tp2 on 4 processes equals one process per step (dropless), and its checkpoint resumes on one process.

The model is `micro-qwen2-moe` (8 experts, top-2, a gated shared expert, two sparse layers): attention and the shared
expert are cut by the `tp` step, each rank holds 4 of the 8 routed experts of every sparse layer, each cut in two by
the same step (the expert group: the two data ranks at one tp position). The balance loss is on over the global
batch (`moe_aux_loss_scope: global`: each token counted on both tp ranks, the shares unchanged) and so is the
router z-loss; the reference is one process at the same global batch of 8 sequences. One launch in all.
"""
from __future__ import annotations

import pytest

from launch_helpers import (STEPS, assert_close_losses, assert_close_tensors, launch_joined, read_checkpoint,
                            read_weights, resume_from, single, write_config)

KEYS = dict(model_name_or_path="micro-qwen2-moe", save_steps=5, router_aux_loss_coef=0.05,
            moe_aux_loss_scope="global", router_z_loss_coef=0.001)


@pytest.fixture(scope="module")
def runs(corpus, tmp_path_factory):
    """{"one": (run, output dir), "ep2_tp2": (run, output dir)}."""
    root = tmp_path_factory.mktemp("ep_tp")
    one = single(write_config(root / "one.json", corpus, root / "one", per_device_train_batch_size=8, **KEYS),
                 root / "one_log")
    assert one.returncode == 0, one.explain()
    cfg = write_config(root / "ep2_tp2.json", corpus, root / "ep2_tp2", expert_parallel_degree=2,
                       tensor_parallel_degree=2, **KEYS)
    run = launch_joined(cfg, root / "ep2_tp2_log", 4)
    assert run.returncode == 0, run.explain()
    return {"one": (one, root / "one"), "ep2_tp2": (run, root / "ep2_tp2")}


def test_ep2_tp2_matches_one_process(runs):
    (ref, rout), (run, out) = runs["one"], runs["ep2_tp2"]
    assert "ep 2" in run.log(0) and "tp 2" in run.log(0) and "aux_loss: " in run.log(0)
    assert "head+loss=cpu" in run.log(0)  # the `tp` step leaves the head whole: the fused head + loss runs
    assert_close_losses(run.losses(0), ref.losses(0), range(1, STEPS + 1))
    # each rank wrote its experts' tp slices: checkpoint-5 holds every expert whole, equal to one process's (weights
    # and AdamW moments); the final export in HF's per-expert names, within the bound test_expert_parallel.py gives
    # the summation order's noise on rare tokens' embedding rows after 10 steps
    assert_close_tensors(read_checkpoint(out / "checkpoint-5"), read_checkpoint(rout / "checkpoint-5"))
    assert_close_tensors(read_checkpoint(out / "checkpoint-5", "weights"),
                         read_checkpoint(rout / "checkpoint-5", "weights"))
    final = read_weights(out)
    assert any(".mlp.experts.7." in n for n in final) and any(".mlp.experts.0." in n for n in final)
    assert_close_tensors(final, read_weights(rout), tol=1e-4)


def test_ep2_tp2_checkpoint_resumes_on_one_process(corpus, tmp_path, runs):
    run = resume_from(runs["ep2_tp2"][1] / "checkpoint-5", corpus, tmp_path, 1, per_device_train_batch_size=8,
                      **KEYS)
    assert_close_losses(run.losses(0), runs["one"][0].losses(0), range(6, STEPS + 1))
