"""Expert, context and pipeline parallelism together (ep x cp x pp) on a Mixture-of-Experts model, through the real
launcher against one process: cp2 x ep2 x pp2 with fleet's ZeRO-1 over the rest, 8 processes (2 stages x 2 cp ranks
x 2 data ranks, each stage's expert groups the data ranks at its cp position, fleet's sharding group sharding x cp).

`micro-qwen3-moe` (both decoder layers sparse, so each stage holds and dispatches experts of its own) with the balance
loss per micro-batch (0.05), the z-loss (0.001) and the balancing bias (0.01) on, clipping at 0.5; 2 data ranks x 2
micro-batches of 2 sequences of 32 tokens, so one process in 4 micro-batches of 2 is the reference. Every step's
loss, logged aux/z/LM losses, busiest-expert shares and gradient norm as one process's; checkpoint-3's AdamW state,
weights and balancing biases too (each expert written once, by its holders, and assembled by the index). Before,
`config.refusals` refused the product ("ep x cp x pp": not verified, its smallest layout takes 8 processes). Nothing
else changed: the experts' gradients are summed over their holders at every cp position and divided by data ranks x C
(`expert_strategy._averaged_over`), and each stage's fleet data and sharding groups span its cp ranks. The layout
without ZeRO and with ZeRO-2, on `micro-qwen2-moe`, `micro-deepseek-v2` (MLA, documents) and `micro-deepseek-v3` (its
MTP module) was checked by hand (docs/DISTRIBUTED.md, "Mixture-of-Experts under context parallelism").
"""
from __future__ import annotations

from against_one_process import assert_saved_state_matches, assert_steps_match
from launch_helpers import launch_joined, reference, write_config

STEPS = 3
KEYS = dict(model_name_or_path="micro-qwen3-moe", router_aux_loss_coef=0.05, router_z_loss_coef=0.001,
            moe_router_bias_update_rate=0.01, max_steps=STEPS, save_steps=3, max_grad_norm=0.5,
            per_device_train_batch_size=2)
LAYOUT = dict(context_parallel_degree=2, expert_parallel_degree=2, pipeline_parallel_degree=2, sharding="stage1",
              gradient_accumulation_steps=2)


def test_cp2_ep2_pp2_zero1_matches_one_process(corpus, shared, tmp_path):
    ref, rout = reference(shared, corpus, gradient_accumulation_steps=4, **KEYS)
    out = tmp_path / "out"
    run = launch_joined(write_config(tmp_path / "c.json", corpus, out, **KEYS, **LAYOUT), tmp_path / "log", 8)
    assert run.returncode == 0, run.explain()
    line = next(x for x in run.log(0).splitlines() if "- layout: " in x).split(";")[0]
    assert "sharding stage1 x2, cp 2, pp 2" in line and line.endswith(", ep 2"), line
    assert_steps_match(run, ref, STEPS, 8, ("aux_loss", "z_loss", "lm_loss"))
    saved, weights, expected = assert_saved_state_matches(out, rout, f"checkpoint-{STEPS}")  # AdamW state, weights
    assert any(".layers.0.mlp.experts." in n for n in saved) and any(".layers.1.mlp.experts." in n for n in saved)
    bias = [n for n in weights if n.endswith("e_score_correction_bias")]  # one a stage, moved by the same sign updates
    assert len(bias) == 2 and all(float(abs(weights[n] - expected[n]).max()) == 0.0 for n in bias)
    assert all(float(abs(weights[n]).max()) > 0 for n in bias)
