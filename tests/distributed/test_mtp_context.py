"""DeepSeek-V3's multi-token prediction under context parallelism (long-context DeepSeek-V3 training), through the real
launcher against one process: `micro-deepseek-v3` with its MTP module (layer 2), the sequence-wise balance loss, the
router z-loss and the auxiliary-loss-free balancing bias on.

- cp2 (2 processes) with packed documents (`attention_mask_type: document`: the MTP module's attention masked by
  document over the ring, its RoPE positions restarting per document) and recompute.
- cp2 x ep2 (4 processes: 2 data ranks, the MTP module's experts split over the expert group like the decoder's).
- cp2 x pp2 (4 processes: the MTP module in the last stage's loss, the input ids passed along the stages).

What makes it run: the module's next tokens cross the chunks (the kernel table's `next_tokens`:
`distributed.steps.context_shift.NextTokens`, each rank's chunks of the whole sequence's shift), its attention is
the ring, its RoPE the whole sequence's, and each depth's mean loss is over the cp group's tokens (`sequence_sums`).
Every step's loss, logged MTP, LM, aux and z losses, expert shares and gradient norm as one process's; checkpoint-3's
weights and AdamW state too; cp2's checkpoint resumes on one process, and one process's on cp2 x pp2, on the same
curve. Before, `config.refusals` refused every layout here ('MTP with cp').
"""
from __future__ import annotations

import pytest

from launch_helpers import (assert_close_losses, assert_close_tensors, expert_shares, launch_joined, logged,
                            read_checkpoint, read_weights, reference, resume_from, write_config)

STEPS = 6
# clipped at most steps (max_grad_norm 0.5), so a wrong gradient norm would change the update
V3 = dict(model_name_or_path="micro-deepseek-v3", router_aux_loss_coef=0.01, router_z_loss_coef=0.001,
          moe_router_bias_update_rate=0.01, max_steps=STEPS, save_steps=3, max_grad_norm=0.5)
DOCS = dict(V3, attention_mask_type="document", recompute=True)
MICRO = dict(per_device_train_batch_size=2, gradient_accumulation_steps=4)  # the pipeline's micro-batches
# name -> (model keys, processes, layout keys, one process's keys: the same micro-batches)
LAYOUTS = {
    "cp2_docs": (DOCS, 2, dict(context_parallel_degree=2, per_device_train_batch_size=8),
                 dict(per_device_train_batch_size=8)),
    "cp2_ep2": (V3, 4, dict(context_parallel_degree=2, expert_parallel_degree=2, per_device_train_batch_size=4),
                dict(per_device_train_batch_size=8)),
    "cp2_pp2": (V3, 4, dict(MICRO, context_parallel_degree=2, pipeline_parallel_degree=2), MICRO),
}
LOGGED = ("mtp_loss", "lm_loss", "aux_loss", "z_loss")
WEIGHT_TOL = 5e-5  # AdamW on near-zero gradients, as test_moe_context.py and test_mtp_pipeline.py


@pytest.fixture(scope="module")
def runs(corpus, shared, tmp_path_factory):
    """name -> ((one process's run, its output dir), (the launch, its output dir))."""
    root = tmp_path_factory.mktemp("mtp_context")
    out = {}
    for name, (model, nproc, layout, one) in LAYOUTS.items():
        ref = reference(shared, corpus, **model, **one)
        run = launch_joined(write_config(root / f"{name}.json", corpus, root / name, **model, **layout),
                            root / f"{name}_log", nproc)
        assert run.returncode == 0, run.explain()
        out[name] = ref, (run, root / name)
    return out


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_mtp_under_context_parallelism_matches_one_process(runs, name):
    (ref, rout), (run, out) = runs[name]
    assert "cp 2" in run.log(0) and all("Traceback" not in run.log(n) for n in range(LAYOUTS[name][1]))
    assert_close_losses(run.losses(0), ref.losses(0), range(1, STEPS + 1))
    for term in LOGGED:
        assert_close_losses(logged(run.log(0), term), logged(ref.log(0), term), range(1, STEPS + 1))
    assert all(v > 1.0 for v in logged(ref.log(0), "mtp_loss").values())  # a real cross-entropy, not a missing term
    # the busiest expert's share per layer, the MTP module's too: every rank's tokens counted
    shares = expert_shares(ref.log(0))
    assert expert_shares(run.log(0)) == shares and len(shares) == STEPS and len(shares[0].split(",")) == 2
    got, want = logged(run.log(0), "grad_norm"), logged(ref.log(0), "grad_norm")  # logged to 4 digits
    assert sorted(got) == sorted(want) == list(range(1, STEPS + 1))
    assert all(abs(got[s] - want[s]) <= 1.01e-4 for s in want), (got, want)
    saved, expected = (read_checkpoint(d / "checkpoint-3") for d in (out, rout))  # AdamW state
    assert_close_tensors(saved, expected)
    saved, expected = (read_checkpoint(d / "checkpoint-3", "weights") for d in (out, rout))
    assert "model.layers.2.eh_proj.weight" in saved
    assert_close_tensors(saved, expected, WEIGHT_TOL)
    assert_close_tensors(read_weights(out), read_weights(rout), WEIGHT_TOL)


@pytest.mark.parametrize("saved,under", [("cp2_docs", "one"), ("one", "cp2_pp2")])
def test_checkpoint_resumes_on_another_layout(runs, corpus, tmp_path, saved, under):
    """cp2's checkpoint on one process, and one process's on cp2 x pp2 (each stage reading its layers)."""
    name = saved if under == "one" else under
    model, nproc, layout, one = LAYOUTS[name]
    (ref, rout), (_, out) = runs[name]
    nproc, over = (1, one) if under == "one" else (nproc, layout)
    run = resume_from((rout if saved == "one" else out) / "checkpoint-3", corpus, tmp_path, nproc, **model, **over)
    assert_close_losses(run.losses(0), ref.losses(0), range(4, STEPS + 1))
    for term in ("mtp_loss", "lm_loss"):
        assert_close_losses(logged(run.log(0), term), logged(ref.log(0), term), range(4, STEPS + 1))
