"""Expert parallelism through the real launcher: EP2 on 2 processes and EP2 x DP2 on 4 equal one process per step
(dropless), with the balance loss on over the global batch (`moe_aux_loss_scope: global`: each rank's expert shares
are the data ranks' counts summed, so the ranks' mean loss is the one-process loss, exactly); an EP2 checkpoint
(each rank wrote its own experts) resumes on one process, and one process's on EP2, on the same curve.

The model is the `micro-qwen3-moe` preset (8 experts, top-2, two sparse layers); the reference is one process at the
same global batch of 8 sequences.
"""
from __future__ import annotations

import pytest

from launch_helpers import (STEPS, assert_close_losses, assert_close_tensors, launch_joined, read_checkpoint,
                            read_weights, resume_from, single, write_config)

MOE = {"model_name_or_path": "micro-qwen3-moe", "save_steps": 5, "router_aux_loss_coef": 0.05,
       "moe_aux_loss_scope": "global"}
# layout -> (processes, keys): the global batch of 8 in each
LAYOUTS = {"one": (1, dict(per_device_train_batch_size=8)), "ep2": (2, dict(expert_parallel_degree=2)),
           "ep2_dp2": (4, dict(expert_parallel_degree=2, per_device_train_batch_size=2))}


@pytest.fixture(scope="module")
def runs(corpus, tmp_path_factory):
    """{layout: (run, output dir)}, one launch each."""
    root = tmp_path_factory.mktemp("ep")
    out = {}
    for name, (nproc, over) in LAYOUTS.items():
        cfg = write_config(root / f"{name}.json", corpus, root / name, **MOE, **over)
        run = single(cfg, root / f"{name}_log") if nproc == 1 else launch_joined(cfg, root / f"{name}_log", nproc)
        assert run.returncode == 0, run.explain()
        out[name] = run, root / name
    return out


@pytest.mark.parametrize("layout", ["ep2", "ep2_dp2"])
def test_expert_parallel_layouts_match_one_process(runs, layout):
    (r, rout), (e, eout) = runs["one"], runs[layout]
    assert "ep 2" in e.log(0) and "aux_loss: " in e.log(0)
    assert_close_losses(e.losses(0), r.losses(0), range(1, STEPS + 1))
    # each rank wrote its own experts: the checkpoint and the final (HF per-expert) export hold every expert, equal
    # to one process's; after 10 AdamW steps the summation order's noise in gradients near 0 (rare tokens' embedding
    # rows) reaches 1.6e-5, hence the final weights' looser bound
    assert_close_tensors(read_checkpoint(eout / "checkpoint-5"), read_checkpoint(rout / "checkpoint-5"))
    final = read_weights(eout)
    assert any(".mlp.experts.7." in n for n in final) and any(".mlp.experts.0." in n for n in final)
    assert_close_tensors(final, read_weights(rout), tol=1e-4)


@pytest.mark.parametrize("saved, under", [("ep2", "one"), ("one", "ep2")])
def test_checkpoint_resumes_across_expert_parallel_degrees(corpus, tmp_path, runs, saved, under):
    nproc, over = LAYOUTS[under]
    run = resume_from(runs[saved][1] / "checkpoint-5", corpus, tmp_path, nproc, **MOE, **over)
    assert_close_losses(run.losses(0), runs["one"][0].losses(0), range(6, STEPS + 1))
