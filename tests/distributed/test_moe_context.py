"""Mixture-of-Experts models under context parallelism (long-context MoE training), through the real launcher against
one process: each cp rank routes its own chunks of every sequence, and the router losses' sums over a sequence's or a
micro-batch's tokens are taken over the cp group (`distributed.steps.context_sums.SequenceSums`), so the loss, the
gradient norm and the weights equal one process's.

- cp2, `micro-qwen3-moe` (2 processes): transformers' load-balancing loss over the micro-batch (0.05).
- cp2, `micro-deepseek-v2` (2 processes): multi-head latent attention under the ring attention, DeepSeek's
  sequence-wise balance loss (per sequence: its counts and mean scores summed over the cp ranks).
- cp2 x ep2 x ZeRO-2, `micro-qwen2-moe` (4 processes: 2 data ranks, one expert group at each cp position; the
  balance loss over the global batch): the experts' gradients summed over their holders at every cp position.
- cp2 x pp2, `micro-qwen3-moe` (4 processes; the balance loss per micro-batch: 4 of 2, one process the same 4).

Every layout with the z-loss and the auxiliary-loss-free balancing bias on too (its counts summed over every rank,
or a stage's data and cp ranks). Every step's loss, logged aux/z/LM losses, expert shares and gradient norm as one
process's, checkpoint-1's and checkpoint-3's weights, AdamW state and biases too; cp2's checkpoint-1 resumes on one
process, and one process's on cp2 x ep2 x ZeRO-2, on the same curve to the same final weights. Before,
`config.refusals` refused every MoE model with context parallelism; with both cp sums removed, cp2's loss is 5.2e-2 off
one process's at step 1.
"""
from __future__ import annotations

import pytest

from against_one_process import (assert_saved_state_matches, assert_steps_match, launch_layouts,
                                 resume_on_another_layout)
from launch_helpers import assert_close_losses

# 3 steps, checkpoint-1 resumed for the last two: a wrong gradient, router sum or update shows in the next step's
# loss, a wrong resumed AdamW state in the last step's loss and the final weights
STEPS, SAVED = 3, 1
# the balance loss, the z-loss and the balancing bias (its counts summed over every rank, or a stage's data and cp
# ranks) on; clipped at every step, so a wrong gradient norm would change the update
ROUTER = dict(router_aux_loss_coef=0.05, router_z_loss_coef=0.001, moe_router_bias_update_rate=0.01,
              max_steps=STEPS, save_steps=SAVED, max_grad_norm=0.5)
QWEN3 = dict(ROUTER, model_name_or_path="micro-qwen3-moe")
DEEPSEEK = dict(ROUTER, model_name_or_path="micro-deepseek-v2", router_aux_loss_coef=0.01)
QWEN2_GLOBAL = dict(ROUTER, model_name_or_path="micro-qwen2-moe", moe_aux_loss_scope="global")
# name -> (model keys, processes, layout keys, one process's keys: the same micro-batches)
LAYOUTS = {
    "cp2_qwen3": (QWEN3, 2, dict(context_parallel_degree=2, per_device_train_batch_size=8),
                  dict(per_device_train_batch_size=8)),
    "cp2_deepseek": (DEEPSEEK, 2, dict(context_parallel_degree=2, per_device_train_batch_size=8),
                     dict(per_device_train_batch_size=8)),
    "cp2_ep2_zero2_qwen2": (QWEN2_GLOBAL, 4, dict(context_parallel_degree=2, expert_parallel_degree=2,
                                                  sharding="stage2", per_device_train_batch_size=4),
                            dict(per_device_train_batch_size=8)),
    "cp2_pp2_qwen3": (QWEN3, 4, dict(context_parallel_degree=2, pipeline_parallel_degree=2,
                                     per_device_train_batch_size=2, gradient_accumulation_steps=4),
                      dict(per_device_train_batch_size=2, gradient_accumulation_steps=4)),
}


@pytest.fixture(scope="module")
def runs(corpus, shared, tmp_path_factory):
    """name -> ((one process's run, its output dir), (the launch, its output dir))."""
    return launch_layouts(LAYOUTS, tmp_path_factory.mktemp("moe_context"), corpus, shared)


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_moe_under_context_parallelism_matches_one_process(runs, name):
    (ref, rout), (run, out) = runs[name]
    assert "cp 2" in run.log(0)
    # the busiest expert's share per layer: every rank's tokens counted (the bias moves the choices from step 2 on)
    assert_steps_match(run, ref, STEPS, LAYOUTS[name][1], ("aux_loss", "z_loss", "lm_loss"))
    for checkpoint in (f"checkpoint-{SAVED}", f"checkpoint-{STEPS}"):  # the one resumed below, the last
        _, saved, expected = assert_saved_state_matches(out, rout, checkpoint)  # AdamW state, weights
        bias = [n for n in saved if n.endswith("e_score_correction_bias")]  # moved by the same sign updates
        assert bias and all(float(abs(saved[n] - expected[n]).max()) == 0.0 for n in bias)
        assert all(float(abs(saved[n]).max()) > 0 for n in bias)


@pytest.mark.parametrize("saved,under", [("cp2_qwen3", "one"), ("one", "cp2_ep2_zero2_qwen2")])
def test_checkpoint_resumes_on_another_layout(runs, corpus, tmp_path, saved, under):
    """cp2's checkpoint on one process, and one process's on cp2 x ep2 x ZeRO-2 (each rank reading its experts)."""
    run, ref = resume_on_another_layout(runs, LAYOUTS, saved, under, corpus, tmp_path, f"checkpoint-{SAVED}")
    assert_close_losses(run.losses(0), ref.losses(0), range(SAVED + 1, STEPS + 1))
