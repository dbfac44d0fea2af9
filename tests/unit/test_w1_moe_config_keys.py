"""A MoE config.json key is honoured as transformers reads it, or refused in one line. What a new user met: a
Qwen3-MoE config.json with `shared_expert_intermediate_size` made check say `+ 1 shared, 64 wide` of a model that
built none (transformers' Qwen3-MoE has no shared expert); a DeepSeek config.json with `decoder_sparse_step` or
`mlp_only_layers` (Qwen's keys, which transformers' DeepSeek classes do not read) built other sparse layers than the
exported model's transformers class does, and its `router_aux_loss_coef` (PaddleFormers' name of the balance weight)
was ignored; `router_aux_loss_coef` in config.json was not checked as the argument
file's is (`"abc"` a traceback, -1 and NaN taken as the balance loss's weight), nor `norm_topk_prob` ("false" was
true); `mlp_only_layers` naming a layer the model does not have was silently ignored."""
import json

import pytest

from pretrain_cli.config.presets import PRESET_DIR
from pretrain_cli.errors import UserError
from pretrain_cli.models.config import ModelConfig


def _preset(name: str, **changes) -> dict:
    return {**json.loads((PRESET_DIR / name / "config.json").read_text()), **changes}


def _refused(d: dict, pretrained: bool = False) -> str:
    with pytest.raises(UserError) as e:
        ModelConfig.from_dict(d, source="m/config.json", pretrained=pretrained)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("m/config.json: "), msg
    return msg


@pytest.mark.parametrize("value", ["abc", [1], -1, float("nan"), float("inf"), True])
def test_config_json_router_aux_loss_coef_is_checked_as_the_argument_files(value):
    msg = _refused(_preset("micro-qwen3-moe", router_aux_loss_coef=value))
    assert "router_aux_loss_coef must be a finite number >= 0" in msg, msg


def test_a_deepseek_aux_loss_alpha_that_is_no_number_is_one_line():
    msg = _refused(_preset("micro-deepseek-v3", aux_loss_alpha="abc"))
    assert "aux_loss_alpha must be a finite number >= 0" in msg, msg


def test_norm_topk_prob_is_true_or_false():
    msg = _refused(_preset("micro-qwen3-moe", norm_topk_prob="false"))
    assert "norm_topk_prob must be true or false, got \"false\"" in msg, msg
    assert ModelConfig.from_dict(_preset("micro-qwen3-moe", norm_topk_prob=None)).norm_topk_prob is False  # default


def test_a_qwen3_moe_shared_expert_is_refused_for_a_new_model_and_not_built_for_weights():
    msg = _refused(_preset("micro-qwen3-moe", shared_expert_intermediate_size=64))
    assert "qwen3_moe has no shared expert" in msg and "qwen2_moe" in msg, msg
    # weights trained elsewhere: transformers ignores the key, and so does the model built here (kept in extra)
    cfg = ModelConfig.from_dict(_preset("micro-qwen3-moe", shared_expert_intermediate_size=64), pretrained=True)
    assert cfg.shared_expert_intermediate_size == 0 and cfg.extra["shared_expert_intermediate_size"] == 64
    inert = ModelConfig.from_dict(_preset("micro-qwen3-moe", shared_expert_intermediate_size=0))
    assert inert.shared_expert_intermediate_size == 0
    assert ModelConfig.from_dict(_preset("micro-qwen2-moe")).shared_expert_intermediate_size == 64  # its own key


@pytest.mark.parametrize("key, value, named", [
    ("decoder_sparse_step", 2, "first_k_dense_replace"),
    ("mlp_only_layers", [1], "first_k_dense_replace"),
    ("shared_expert_intermediate_size", 64, "n_shared_experts"),
    ("moe_layer_freq", 2, "first_k_dense_replace"),  # DeepSeek's remote code's key: every 2nd layer there
])
def test_qwens_moe_keys_in_a_deepseek_config_are_refused_or_left_to_transformers(key, value, named):
    d = _preset("micro-deepseek-v3", num_hidden_layers=3, first_k_dense_replace=1, **{key: value})
    msg = _refused(d)
    assert f"{key} is not a key deepseek_v3 reads" in msg and named in msg, msg
    cfg = ModelConfig.from_dict(d, pretrained=True)  # as transformers' DeepseekV3 builds it: every layer from 1 on
    assert cfg.sparse_layers == [1, 2] and cfg.extra[key] == value and cfg.shared_expert_intermediate_size == 0
    assert cfg.to_hf_dict()[key] == value  # kept as it is, as transformers keeps a key it does not read
    inert = {"decoder_sparse_step": 1, "mlp_only_layers": [], "shared_expert_intermediate_size": 0,
             "moe_layer_freq": 1}[key]
    assert ModelConfig.from_dict({**d, key: inert}).sparse_layers == [1, 2]
    from types import SimpleNamespace

    from pretrain_cli.config.moe import aux_coefficient

    unset = SimpleNamespace(model=SimpleNamespace(router_aux_loss_coef=None))  # the balance weight the run uses
    assert aux_coefficient(unset, cfg) == 1e-4  # (a Qwen key neither sets nor moves DeepSeek's weight)


def test_a_deepseek_router_aux_loss_coef_is_paddleformers_balance_weight():
    """PaddleFormers' DeepSeek-V3 config.json names the sequence-wise loss's weight router_aux_loss_coef (its
    DeepseekV2FastConfig reads it; the hub's files say aux_loss_alpha): it was ignored, the paper's 1e-4 used."""
    from types import SimpleNamespace

    from pretrain_cli.config.moe import aux_coefficient

    unset = SimpleNamespace(model=SimpleNamespace(router_aux_loss_coef=None))  # the argument file leaves it out
    cfg = ModelConfig.from_dict(_preset("micro-deepseek-v3", router_aux_loss_coef=0.5))
    assert aux_coefficient(unset, cfg) == 0.5 and cfg.to_hf_dict()["router_aux_loss_coef"] == 0.5
    hub = ModelConfig.from_dict(_preset("micro-deepseek-v3", aux_loss_alpha=0.002))
    assert aux_coefficient(unset, hub) == 0.002
    assert aux_coefficient(unset, ModelConfig.from_dict(_preset("micro-deepseek-v3"))) == 1e-4  # the paper's
    msg = _refused(_preset("micro-deepseek-v3", router_aux_loss_coef=0.5, aux_loss_alpha=0.002))
    assert "aux_loss_alpha (0.002) and router_aux_loss_coef (0.5)" in msg, msg
    msg = _refused(_preset("micro-deepseek-v3", router_aux_loss_coef="abc"))
    assert "router_aux_loss_coef must be a finite number >= 0" in msg, msg


def test_mlp_only_layers_names_layers_the_model_has():
    msg = _refused(_preset("micro-qwen3-moe", mlp_only_layers=[0, 7]))
    assert "mlp_only_layers names layer 7" in msg and "num_hidden_layers 2" in msg, msg
    assert ModelConfig.from_dict(_preset("micro-qwen3-moe", mlp_only_layers=[7]), pretrained=True).sparse_layers \
        == [0, 1]  # transformers ignores it too
