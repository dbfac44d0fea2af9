"""DeepSeek-V3 whose only experts are its multi-token prediction module's (`micro-deepseek-v3` with
first_k_dense_replace 2: both decoder layers dense, the MTP layer 2 sparse), through the real launcher against one
process, with the sequence-wise balance loss, the router z-loss and DeepSeek-V3's default balancing bias on:

- ep2 (2 processes, 2 data ranks): the MTP layer's experts split over the expert group;
- pp2 (2 processes): the MTP module on the last stage, the router sums passed along two dense stages.

Every step's loss, logged MTP, LM, aux and z losses, expert share and gradient norm as one process's; the final
weights too, the MTP layer's routing bias (moved by the update) among them. Before, the run saw no experts
(`ModelConfig.sparse_layers` holds the decoder's only): no balance loss, no z-loss, the bias never updated
(tests/unit/test_mtp_expert_layers.py: the decisions one by one).
"""
from __future__ import annotations

import json

import numpy as np
import pytest

from against_one_process import WEIGHT_TOL, assert_steps_match, launch_layouts
from launch_helpers import assert_close_tensors, logged, read_weights

STEPS = 3  # each clipped (the norms are ~0.8): a wrong gradient, router sum or update shows in the next step's loss
KEYS = dict(router_aux_loss_coef=0.01, router_z_loss_coef=0.001, max_steps=STEPS, max_grad_norm=0.5)
MICRO = dict(per_device_train_batch_size=2, gradient_accumulation_steps=4)  # the pipeline's micro-batches
ONE = dict(per_device_train_batch_size=8)
# name -> (layout keys, one process's keys: the same global batch)
LAYOUTS = {"ep2": (dict(expert_parallel_degree=2, per_device_train_batch_size=4), ONE),
           "pp2": (dict(MICRO, pipeline_parallel_degree=2), MICRO)}
LOGGED = ("mtp_loss", "lm_loss", "aux_loss", "z_loss")
BIAS = "model.layers.2.mlp.gate.e_score_correction_bias"


@pytest.fixture(scope="module")
def runs(corpus, shared, tmp_path_factory):
    """name -> ((one process's run, its output dir), (the launch, its output dir))."""
    from pretrain_cli.config.presets import PRESET_DIR

    root = tmp_path_factory.mktemp("mtp_experts")
    (root / "model").mkdir()
    v3 = json.loads((PRESET_DIR / "micro-deepseek-v3" / "config.json").read_text())
    (root / "model" / "config.json").write_text(json.dumps(dict(v3, first_k_dense_replace=2)))
    model = dict(KEYS, model_name_or_path=str(root / "model"))
    return launch_layouts({name: (model, 2, layout, one) for name, (layout, one) in LAYOUTS.items()}, root, corpus,
                          shared)


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_mtp_only_experts_train_on_two_processes_as_on_one(runs, name):
    (ref, rout), (run, out) = runs[name]
    assert "no experts" not in run.log(0)
    shares = assert_steps_match(run, ref, STEPS, 2, LOGGED)  # the balance and z-losses are the MTP layer's
    assert all(v > 0.5 for v in logged(ref.log(0), "aux_loss").values())
    assert "," not in shares[0]  # one sparse layer: the MTP module's
    weights, expected = read_weights(out), read_weights(rout)
    assert np.abs(expected[BIAS]).max() > 0  # DeepSeek-V3's default rate moved it
    assert_close_tensors(weights, expected, WEIGHT_TOL)
