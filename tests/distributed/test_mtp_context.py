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
Every step's loss, logged MTP, LM, aux and z losses, expert shares and gradient norm as one process's; checkpoint-1's
and checkpoint-3's weights and AdamW state too; cp2's checkpoint-1 resumes on one process, and one process's on
cp2 x pp2, on the same curve to the same final weights. Before, `config.refusals` refused every layout here ('MTP
with cp').
"""
from __future__ import annotations

import pytest

from against_one_process import (assert_saved_state_matches, assert_steps_match, launch_layouts,
                                 resume_on_another_layout)
from launch_helpers import assert_close_losses, logged

# 3 steps, checkpoint-1 resumed for the last two: a wrong gradient, next-token shift or update shows in the next step's
# loss, a wrong resumed AdamW state in the last step's loss and the final weights
STEPS, SAVED = 3, 1
# clipped at every step (max_grad_norm 0.5), so a wrong gradient norm would change the update
V3 = dict(model_name_or_path="micro-deepseek-v3", router_aux_loss_coef=0.01, router_z_loss_coef=0.001,
          moe_router_bias_update_rate=0.01, max_steps=STEPS, save_steps=SAVED, max_grad_norm=0.5)
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


@pytest.fixture(scope="module")
def runs(corpus, shared, tmp_path_factory):
    """name -> ((one process's run, its output dir), (the launch, its output dir))."""
    return launch_layouts(LAYOUTS, tmp_path_factory.mktemp("mtp_context"), corpus, shared)


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_mtp_under_context_parallelism_matches_one_process(runs, name):
    (ref, rout), (run, out) = runs[name]
    assert "cp 2" in run.log(0)
    # the busiest expert's share per layer, the MTP module's too: every rank's tokens counted
    shares = assert_steps_match(run, ref, STEPS, LAYOUTS[name][1], LOGGED)
    assert all(v > 1.0 for v in logged(ref.log(0), "mtp_loss").values())  # a real cross-entropy, not a missing term
    assert len(shares[0].split(",")) == 2
    for checkpoint in (f"checkpoint-{SAVED}", f"checkpoint-{STEPS}"):  # the one resumed below, the last
        _, saved, _ = assert_saved_state_matches(out, rout, checkpoint)  # AdamW state, weights
        assert "model.layers.2.eh_proj.weight" in saved


@pytest.mark.parametrize("saved,under", [("cp2_docs", "one"), ("one", "cp2_pp2")])
def test_checkpoint_resumes_on_another_layout(runs, corpus, tmp_path, saved, under):
    """cp2's checkpoint on one process, and one process's on cp2 x pp2 (each stage reading its layers)."""
    run, ref = resume_on_another_layout(runs, LAYOUTS, saved, under, corpus, tmp_path, f"checkpoint-{SAVED}")
    assert_close_losses(run.losses(0), ref.losses(0), range(SAVED + 1, STEPS + 1))
    for term in ("mtp_loss", "lm_loss"):
        assert_close_losses(logged(run.log(0), term), logged(ref.log(0), term), range(SAVED + 1, STEPS + 1))
