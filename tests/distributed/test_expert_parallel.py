"""Expert parallelism through the real launcher: EP2 on 2 processes, EP2 x DP2 on 4 and EP2 x ZeRO-1 on 2 equal one
process per step (dropless), with the balance loss on over the global batch (`moe_aux_loss_scope: global`: each rank's expert shares
are the data ranks' counts summed, so the ranks' mean loss is the one-process loss, exactly); an EP2 checkpoint
(each rank wrote its own experts) resumes on one process, and one process's on EP4 x ZeRO-1 (4 processes), on the
same curve (the `ep` step's reader of each rank's experts; one process's checkpoint on plain EP2 is the same reader
without the ZeRO-1 slice, measured in docs/DISTRIBUTED.md and no longer launched: the suite's time, issue #54).

The models are the `micro-qwen3-moe` preset (8 experts, top-2, two sparse layers) and `micro-deepseek-v3` (8
experts in 4 groups, top-2 of 2 groups, a shared expert, a dense first layer, one MTP module whose layer is sparse
too, the balancing bias and the sequence-wise balance loss on); the reference is one process at the same global
batch of 8 sequences.
"""
from __future__ import annotations

import pytest

from launch_helpers import (STEPS, assert_close_losses, assert_close_tensors, expert_shares, launch_joined, logged,
                            read_checkpoint, read_weights, resume_from, single, write_config)

MOE = {"model_name_or_path": "micro-qwen3-moe", "save_steps": 5, "router_aux_loss_coef": 0.05,
       "moe_aux_loss_scope": "global"}
# layout -> (processes, keys): the global batch of 8 in each
LAYOUTS = {"one": (1, dict(per_device_train_batch_size=8)), "ep2": (2, dict(expert_parallel_degree=2)),
           "ep2_dp2": (4, dict(expert_parallel_degree=2, per_device_train_batch_size=2)),
           # EP x ZeRO-1: the rest of the model's optimizer state sharded by fleet, each rank's experts its own
           "ep2_zero1": (2, dict(expert_parallel_degree=2, sharding="stage1")),
           # four ranks, dp 2 x sharding 2, one expert group of 4 (only resumed into: `test_checkpoint_resumes...`)
           "ep4_d2_zero1": (4, dict(expert_parallel_degree=4, sharding="stage1", sharding_parallel_degree=2,
                                    per_device_train_batch_size=2))}
LAUNCHED = ("one", "ep2", "ep2_dp2", "ep2_zero1")
# DeepSeek's sequence-wise balance loss is a mean over sequences, so two ranks of 4 add up to one of 8: kept on, as
# are its balancing bias (0.001, the noaux_tc default: counts summed over the data ranks) and the MTP loss
DEEPSEEK = {"model_name_or_path": "micro-deepseek-v3", "save_steps": 5}


def _launched(root, corpus, keys: dict, names) -> dict:
    """{layout: (run, output dir)} of `keys` under `root`, one launch per layout of `names` (LAYOUTS)."""
    out = {}
    for name in names:
        nproc, over = LAYOUTS[name]
        cfg = write_config(root / f"{name}.json", corpus, root / name, **keys, **over)
        run = single(cfg, root / f"{name}_log") if nproc == 1 else launch_joined(cfg, root / f"{name}_log", nproc)
        assert run.returncode == 0, run.explain()
        out[name] = run, root / name
    return out


@pytest.fixture(scope="module")
def runs(corpus, tmp_path_factory):
    """{layout: (run, output dir)}, one launch each."""
    return _launched(tmp_path_factory.mktemp("ep"), corpus, MOE, LAUNCHED)


@pytest.mark.parametrize("layout", ["ep2", "ep2_dp2", "ep2_zero1"])
def test_expert_parallel_layouts_match_one_process(runs, layout):
    (r, rout), (e, eout) = runs["one"], runs[layout]
    assert "ep 2" in e.log(0) and "aux_loss: " in e.log(0)
    if layout == "ep2_zero1":  # fleet's ZeRO-1 over the rest: each rank wrote only its slice of their AdamW state
        assert "sharding stage1" in e.log(0)
    assert_close_losses(e.losses(0), r.losses(0), range(1, STEPS + 1))
    # the logged balance loss is the ranks' mean (`Strategy.share_logged`), one process's, not rank 0's own
    # (2.001334 against 2.000636 at step 1 before); and so is the run's train_loss
    ours, ref = logged(e.log(0), "aux_loss"), logged(r.log(0), "aux_loss")
    assert ours.keys() == ref.keys() and all(abs(ours[k] - ref[k]) < 1e-5 for k in ref), (ours, ref)
    # the busiest expert's share per layer is every data rank's tokens' (`Strategy.whole_model_rows`), one
    # process's: rank 0's own counts were logged before ([0.1602, 0.1719] against [0.1582, 0.1895] at step 1)
    assert expert_shares(e.log(0)) == expert_shares(r.log(0)) and len(expert_shares(r.log(0))) == STEPS
    import json

    train_loss = [json.loads((d / "train_results.json").read_text())["train_loss"] for d in (eout, rout)]
    assert abs(train_loss[0] - train_loss[1]) < 1e-5, train_loss
    # each rank wrote its own experts: the checkpoint and the final (HF per-expert) export hold every expert, equal
    # to one process's; after 10 AdamW steps the summation order's noise in gradients near 0 (rare tokens' embedding
    # rows) reaches 1.6e-5, hence the final weights' looser bound
    assert_close_tensors(read_checkpoint(eout / "checkpoint-5"), read_checkpoint(rout / "checkpoint-5"))
    final = read_weights(eout)
    assert any(".mlp.experts.7." in n for n in final) and any(".mlp.experts.0." in n for n in final)
    assert_close_tensors(final, read_weights(rout), tol=1e-4)


@pytest.mark.parametrize("saved, under", [("ep2", "one"), ("ep2_zero1", "one"), ("one", "ep4_d2_zero1")])
def test_checkpoint_resumes_across_expert_parallel_degrees(corpus, tmp_path, runs, saved, under):
    """EP2 -> 1, EP2 x ZeRO-1 -> 1, and 1 -> EP4 x dp 2 x ZeRO-1 over sharding 2 (each rank reads its experts, their
    AdamW state and its ZeRO-1 slice of the rest's from one process's checkpoint)."""
    nproc, over = LAYOUTS[under]
    run = resume_from(runs[saved][1] / "checkpoint-5", corpus, tmp_path, nproc, **MOE, **over)
    assert_close_losses(run.losses(0), runs["one"][0].losses(0), range(6, STEPS + 1))


@pytest.fixture(scope="module")
def deepseek_runs(corpus, tmp_path_factory):
    """{"one", "ep2_zero1"} on micro-deepseek-v3."""
    return _launched(tmp_path_factory.mktemp("deepseek_ep2"), corpus, DEEPSEEK, ("one", "ep2_zero1"))


def test_deepseek_ep2_matches_one_process_and_resumes_there(corpus, tmp_path, deepseek_runs):
    """DeepSeek's MoE on the same `ep` step, with ZeRO-1 over the rest (the layout `plan --fit` proposes for
    DeepSeek-V2-Lite): shared experts, router and MTP module's dense part replicated and sharded by fleet, routed
    experts split; every step's loss (with the MTP and balance terms) equal to one process's, the checkpoint (bias,
    MTP module, every expert) too, and its checkpoint-5 resumed on one process continues the same curve."""
    (r, rout), (e, eout) = deepseek_runs["one"], deepseek_runs["ep2_zero1"]
    assert "ep 2" in e.log(0) and "sharding stage1" in e.log(0) and "mtp_loss" in e.log(0)
    assert_close_losses(e.losses(0), r.losses(0), range(1, STEPS + 1))
    got, want = ({**read_checkpoint(out / "checkpoint-5", "weights"), **read_checkpoint(out / "checkpoint-5")}
                 for out in (eout, rout))
    assert any(n.endswith("mlp.gate.e_score_correction_bias") for n in got)
    assert any(".layers.2.mlp.experts.7." in n for n in got) and any(".shared_experts." in n for n in got)
    # the balancing bias equal (sign updates), the moments within 1e-5 (measured 2.6e-7); in the weights AdamW turns the
    # summation order's noise in near-zero gradients (rare tokens' embedding rows) into 1.6e-5 by step 5 under EP, 2.2e-5
    # under EP x ZeRO-1 (fleet divides each gradient by the sharding ranks before it sums them)
    assert_close_tensors(got, want, tol=3e-5)
    run = resume_from(eout / "checkpoint-5", corpus, tmp_path, 1, **DEEPSEEK, **LAYOUTS["one"][1])
    assert_close_losses(run.losses(0), r.losses(0), range(6, STEPS + 1))
