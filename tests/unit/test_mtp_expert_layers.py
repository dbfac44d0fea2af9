"""DeepSeek-V3 whose only experts are its multi-token prediction module's: `first_k_dense_replace ==
num_hidden_layers` makes every decoder layer dense, and the MTP layer (`num_hidden_layers`) sparse, by the decoder
layers' rule, as PaddleNLP's DeepseekV2MTPLayer (a decoder layer of that index) builds it and as the published
checkpoints' layer 61 is. The model builds that layer's experts, so every decision that asks whether the model has
experts (`ModelConfig.expert_layers`) says yes: before, they read the decoder's `sparse_layers` (empty), the run
noted 'the model has no experts; no effect' for router_aux_loss_coef, trained the MTP layer's experts without their
balance loss or bias update while logging their expert share, and let tp and ep layouts through unchecked.
(tests/distributed/test_mtp_experts.py: the same model at ep2 against one process.)"""
import re

import numpy as np
import pytest

from pretrain_cli import runtime

paddle = runtime.import_paddle()

from moe_helpers import moe_cfg  # noqa: E402
from pretrain_cli.config.parser import parse_config  # noqa: E402
from pretrain_cli.config.resolve import resolve  # noqa: E402
from pretrain_cli.errors import UserError  # noqa: E402
from pretrain_cli.models import build_model  # noqa: E402
from pretrain_cli.ops import kernels  # noqa: E402
from pretrain_cli.run_config import Target  # noqa: E402

BASE = ["--output_dir", "o", "--input_dir", "d", "--do_train", "--max_steps", "5", "--device", "cpu"]


def _mtp_only(**kw):
    """micro-deepseek-v3 (2 decoder layers, one MTP module) with every decoder layer dense."""
    return moe_cfg("micro-deepseek-v3", first_k_dense_replace=2, **kw)


def _resolve(cfg, *keys, world=1):
    return resolve(parse_config(None, [*BASE, *keys]), cfg, Target("cpu", world, 0, 0, None))


def test_the_mtp_layer_is_the_models_expert_layer():
    cfg = _mtp_only()
    assert cfg.sparse_layers == [] and cfg.expert_layers == [2]
    assert moe_cfg("micro-deepseek-v3").expert_layers == [1, 2]  # the preset: decoder layer 1, the MTP layer
    assert moe_cfg("micro-deepseek-v3", first_k_dense_replace=3).expert_layers == []  # past the MTP layer: dense
    model = build_model(cfg, kernels.select(None, "cpu"))
    assert [layer.dense for layer in model.model.layers] == [True, True]
    assert hasattr(model.model.layers.mtp[0].mlp, "gate") and model.sparse


def test_its_router_keys_resolve_as_a_moe_models():
    """No 'no experts' note; the balance loss's weight and DeepSeek-V3's default bias rate decided as for the preset
    (before: the coefficient left unresolved and the rate 0, so neither trained the MTP layer's router)."""
    run = _resolve(_mtp_only(), "--router_aux_loss_coef", "0.01")
    assert not [n for n in run.notes if "no experts" in n], run.notes
    assert run.moe.aux_loss_coef == 0.01 and run.moe.bias_update_rate == 0.001
    assert _resolve(_mtp_only()).moe.aux_loss_coef == 1e-4  # the V3 paper's alpha, as the preset's
    dense = _resolve(moe_cfg("micro-deepseek-v3", first_k_dense_replace=3), "--router_aux_loss_coef", "0.01")
    assert "router_aux_loss_coef: the model (deepseek_v3) has no experts; no effect" in dense.notes


def test_its_training_loss_carries_the_mtp_layers_balance_loss():
    """loss = LM + lambda x MTP + alpha x the MTP layer's sequence-wise balance loss, logged as aux_loss, and its
    expert load is there for the bias update."""
    cfg = _mtp_only()
    run = _resolve(cfg, "--router_aux_loss_coef", "0.01")
    paddle.seed(0)
    model = build_model(cfg, kernels.select(None, "cpu"), run.moe)
    model.train()
    ids = paddle.to_tensor(np.random.default_rng(0).integers(3, cfg.vocab_size, (2, 17)))
    total, count = model(ids[:, :-1], labels=ids[:, 1:])
    logged = {name: float(s) / n for name, (s, n) in model.router_losses.items()}
    # z_loss logged at its weight 0 too (tests/unit/test_w1_moe_z_loss_logged.py), and not in the loss optimised
    assert set(logged) == {"lm_loss", "mtp_loss", "aux_loss", "z_loss"}
    want = logged["lm_loss"] + 0.3 * logged["mtp_loss"] + 0.01 * logged["aux_loss"]
    assert abs(float(total / count) - want) < 1e-5
    total.backward()
    gate = model.model.layers.mtp[0].mlp.gate
    assert gate.weight.grad is not None and float(gate.weight.grad.abs().sum()) > 0
    from pretrain_cli.models.moe_loss import update_expert_bias

    before = gate.e_score_correction_bias.numpy().copy()
    update_expert_bias(model, run.moe.bias_update_rate)
    assert np.abs(gate.e_score_correction_bias.numpy() - before).max() == pytest.approx(0.001)


@pytest.mark.parametrize("cfg_keys, keys, message", [
    # the experts' SwiGLU width is cut over tp as the decoder's would be
    (dict(moe_intermediate_size=33), ["--tensor_parallel_degree", "2"],
     "tensor_parallel_degree: 2 does not divide the model's moe_intermediate_size (33)"),
    # config.refusals' MoE rows (before: ep silently 1 here, the layout ZeRO-3 without a word)
    ({}, ["--expert_parallel_degree", "2", "--sharding", "stage3"],
     "expert_parallel_degree: 2 with sharding: stage3 is not supported"),
    # with num_experts but no layer holding them there is nothing to split
    (dict(first_k_dense_replace=3), ["--expert_parallel_degree", "2"],
     "expert_parallel_degree: 2 needs a Mixture-of-Experts model (num_experts in config.json); deepseek_v3 has no "
     "experts in any layer"),
])
def test_its_layouts_are_checked_as_a_moe_models(cfg_keys, keys, message):
    cfg = moe_cfg("micro-deepseek-v3", **{"first_k_dense_replace": 2, **cfg_keys})
    with pytest.raises(UserError) as e:
        _resolve(cfg, *keys, "--per_device_train_batch_size", "2", world=2)
    assert [line for line in str(e.value).splitlines() if message in line], str(e.value)


def test_expert_parallelism_splits_the_mtp_layers_experts():
    run = _resolve(_mtp_only(), "--expert_parallel_degree", "2", "--per_device_train_batch_size", "2", world=2)
    assert run.parallel.ep_degree == 2 and not re.search("no experts", " ".join(run.notes))
