"""Expert parallelism through the real launcher: EP2 on 2 processes and EP2 x DP2 on 4 equal one process per step
(dropless), and an EP2 checkpoint (each rank wrote its own experts) resumes on one process on the same curve.

The models are the `micro-qwen3-moe` preset (8 experts, top-2, two sparse layers) and `micro-deepseek-v3` (8
experts in 4 groups, top-2 of 2 groups, a shared expert, a dense first layer, one MTP module whose layer is sparse
too, the balancing bias and the sequence-wise balance loss on); the reference is one process at the same global
batch of 8 sequences.
"""
from __future__ import annotations

import pytest

from launch_helpers import (STEPS, assert_close_losses, assert_close_tensors, launch, launch_joined, read_checkpoint,
                            read_weights, single, write_config)

# HF's load-balancing loss is computed per micro-batch (a product of two means over its tokens), so two ranks of 4
# sequences do not add up to one of 8 with it on, with or without expert parallelism: compared without it
MOE = {"model_name_or_path": "micro-qwen3-moe", "save_steps": 5, "router_aux_loss_coef": 0}
# DeepSeek's sequence-wise balance loss is a mean over sequences, so two ranks of 4 add up to one of 8: kept on, as
# are its balancing bias (0.001, the noaux_tc default: counts summed over the data ranks) and the MTP loss
DEEPSEEK = {"model_name_or_path": "micro-deepseek-v3", "save_steps": 5}


def _ran(root, corpus, keys: dict, ep: int = 1):
    """(run, output dir) under `root` at the global batch of 8: one process (the reference), or EP`ep` on `ep`
    processes of 4 sequences each."""
    root.mkdir(parents=True, exist_ok=True)
    if ep == 1:
        run = single(write_config(root / "c.json", corpus, root / "out", per_device_train_batch_size=8, **keys),
                     root / "log")
    else:
        run = launch(write_config(root / "c.json", corpus, root / "out", expert_parallel_degree=ep, **keys),
                     root / "log", nproc=ep)
    assert run.returncode == 0, run.explain()
    return run, root / "out"


@pytest.fixture(scope="module")
def moe_ref(corpus, tmp_path_factory):
    return _ran(tmp_path_factory.mktemp("moe_ref"), corpus, MOE)


@pytest.fixture(scope="module")
def ep2(corpus, tmp_path_factory):
    return _ran(tmp_path_factory.mktemp("ep2"), corpus, MOE, ep=2)


def test_ep2_matches_one_process(moe_ref, ep2):
    (r, rout), (e, eout) = moe_ref, ep2
    assert "ep 2" in e.log(0)
    assert_close_losses(e.losses(0), r.losses(0), range(1, STEPS + 1))
    # each rank wrote its own experts: the checkpoint and the final (HF per-expert) export hold every expert, equal
    # to one process's; after 10 AdamW steps the summation order's noise in gradients near 0 (rare tokens' embedding
    # rows) reaches 1.6e-5, hence the final weights' looser bound
    assert_close_tensors(read_checkpoint(eout / "checkpoint-5"), read_checkpoint(rout / "checkpoint-5"))
    final = read_weights(eout)
    assert any(".mlp.experts.7." in n for n in final) and any(".mlp.experts.0." in n for n in final)
    assert_close_tensors(final, read_weights(rout), tol=1e-4)


def _resumes_on_one_process(corpus, tmp_path, checkpoint, reference, keys: dict) -> None:
    """`checkpoint` resumed by one process at the global batch of 8 continues `reference`'s curve from step 6."""
    cfg = write_config(tmp_path / "c.json", corpus, tmp_path / "out", per_device_train_batch_size=8,
                       resume_from_checkpoint=str(checkpoint), overwrite_output_dir=False, **keys)
    run = single(cfg, tmp_path / "log")
    assert run.returncode == 0, run.explain()
    assert "resumed from" in run.log(0)
    assert_close_losses(run.losses(0), reference.losses(0), range(6, STEPS + 1))


def test_ep2_checkpoint_resumes_on_one_process(corpus, tmp_path, moe_ref, ep2):
    _resumes_on_one_process(corpus, tmp_path, ep2[1] / "checkpoint-5", moe_ref[0], MOE)


def test_ep2_by_dp2_matches_one_process(corpus, tmp_path, moe_ref):
    r, _ = moe_ref
    cfg = write_config(tmp_path / "e.json", corpus, tmp_path / "out", expert_parallel_degree=2,
                       per_device_train_batch_size=2, **MOE)
    run = launch_joined(cfg, tmp_path / "log", nproc=4)
    assert run.returncode == 0, run.explain()
    assert_close_losses(run.losses(0), r.losses(0), range(1, STEPS + 1))


@pytest.fixture(scope="module")
def deepseek_runs(corpus, tmp_path_factory):
    """(one process, EP2) on micro-deepseek-v3."""
    root = tmp_path_factory.mktemp("deepseek_ep2")
    return _ran(root / "ref", corpus, DEEPSEEK), _ran(root / "ep2", corpus, DEEPSEEK, ep=2)


def test_deepseek_ep2_matches_one_process_and_resumes_there(corpus, tmp_path, deepseek_runs):
    """DeepSeek's MoE on the same `ep` step: shared experts replicated, routed experts split; every step's loss
    (with the MTP and balance terms) equal to one process's, the checkpoint (bias, MTP module, every expert) too,
    and EP2's checkpoint-5 resumed on one process continues the same curve."""
    (r, rout), (e, eout) = deepseek_runs
    assert "ep 2" in e.log(0) and "mtp_loss" in e.log(0)
    assert_close_losses(e.losses(0), r.losses(0), range(1, STEPS + 1))
    got, want = ({**read_checkpoint(out / "checkpoint-5", "weights"), **read_checkpoint(out / "checkpoint-5")}
                 for out in (eout, rout))
    assert any(n.endswith("mlp.gate.e_score_correction_bias") for n in got)
    assert any(".layers.2.mlp.experts.7." in n for n in got) and any(".shared_experts." in n for n in got)
    # the balancing bias equal (sign updates), the moments within 1e-5 (measured 2.6e-7); in the weights AdamW turns the
    # summation order's noise in near-zero gradients (rare tokens' embedding rows) into 1.6e-5 by step 5
    assert_close_tensors(got, want, tol=2e-5)
    _resumes_on_one_process(corpus, tmp_path, eout / "checkpoint-5", r, DEEPSEEK)
