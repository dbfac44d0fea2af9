"""Another MoE family's config.json keys, after W1's commits (review R9): read as transformers' class for the file's
family reads them, in both directions, and by every reader of the file.

1. A run from pretrained weights whose config.json carries such a key (DeepSeek's `moe_layer_freq: 2`, Qwen's
   `mlp_only_layers` in a DeepSeek file, `shared_expert_intermediate_size` in a Qwen3-MoE one) writes it back into
   every checkpoint-N/config.json (kept, as transformers keeps a key it does not read); the resume check and
   `export` read that file as a new model's and refused it, so the run could neither resume nor export its own
   checkpoints. A checkpoint's config.json describes weights: it is read as pretrained's is.
2. A Qwen2-/Qwen3-MoE file's DeepSeek keys (`first_k_dense_replace`, `n_shared_experts` ...) shaped the model here
   (fewer sparse layers, shared experts counted) while transformers' Qwen classes ignore them.
3. A pretrained DeepSeek file giving its balance weight under both names, at two values, took aux_loss_alpha's
   without a word."""
import json

import pytest

from pretrain_cli.cli import main
from pretrain_cli.config.presets import PRESET_DIR
from pretrain_cli.errors import UserError
from pretrain_cli.models.config import ModelConfig
from pretrain_cli.models.flops import experts
from pretrain_cli.training import resume_checks


def _preset(name: str, **changes) -> dict:
    return {**json.loads((PRESET_DIR / name / "config.json").read_text()), **changes}


KEPT = [("micro-deepseek-v3", "moe_layer_freq", 2), ("micro-deepseek-v3", "mlp_only_layers", [1]),
        ("micro-qwen3-moe", "shared_expert_intermediate_size", 64), ("micro-qwen3-moe", "mlp_only_layers", [7])]


@pytest.mark.parametrize("preset, key, value", KEPT)
def test_a_checkpoints_config_json_reads_back_as_the_weights_it_describes(tmp_path, preset, key, value):
    cfg = ModelConfig.from_dict(_preset(preset, **{key: value}), pretrained=True)  # continue_training's model
    ckpt = tmp_path / "checkpoint-1"
    ckpt.mkdir()
    (ckpt / "config.json").write_text(json.dumps(cfg.to_hf_dict()))  # what a checkpoint and the final export write
    assert json.loads((ckpt / "config.json").read_text())[key] == value  # kept, as transformers keeps it
    again = ModelConfig.from_file(str(ckpt), pretrained=True)
    assert again.sparse_layers == cfg.sparse_layers and again.to_hf_dict() == cfg.to_hf_dict()
    assert resume_checks.mismatch(ckpt, cfg, 64) is None  # the resume: was "... is not a key deepseek_v3 reads"
    resume_checks.check_compatible(ckpt, cfg, 64)


def test_a_pretrained_models_export_keeps_another_familys_key(tmp_path, capsys):
    from pretrain_cli import runtime

    paddle = runtime.import_paddle()
    from pretrain_cli.models import build_model
    from pretrain_cli.models.convert import save_hf

    paddle.seed(0)
    cfg = ModelConfig.from_dict(_preset("micro-deepseek-v3", moe_layer_freq=2), pretrained=True)
    save_hf(build_model(cfg), cfg, str(tmp_path / "final"))
    assert main(["export", str(tmp_path / "final"), str(tmp_path / "x")]) == 0, capsys.readouterr().err
    assert json.loads((tmp_path / "x" / "config.json").read_text())["moe_layer_freq"] == 2


@pytest.mark.parametrize("preset", ["micro-qwen3-moe", "micro-qwen2-moe"])
@pytest.mark.parametrize("key, value, named", [
    ("first_k_dense_replace", 1, "mlp_only_layers"),
    ("n_shared_experts", 2, "shared_expert"),
    ("topk_method", "noaux_tc", "num_experts_per_tok"),
    ("n_group", 4, "num_experts_per_tok"),
    ("topk_group", 2, "num_experts_per_tok"),
    ("routed_scaling_factor", 2.5, "norm_topk_prob"),
])
def test_deepseeks_moe_keys_in_a_qwen_config_are_refused_or_left_to_transformers(preset, key, value, named):
    d = _preset(preset, **{key: value})
    model_type = d["model_type"]
    with pytest.raises(UserError) as e:
        ModelConfig.from_dict(d, source="m/config.json")
    msg = str(e.value)
    assert msg.startswith(f"m/config.json: {key} is not a key {model_type} reads (") and named in msg, msg
    assert "\n" not in msg
    cfg = ModelConfig.from_dict(d, pretrained=True)  # as transformers' Qwen class builds it: the key unread
    plain = ModelConfig.from_dict(_preset(preset))
    assert cfg.sparse_layers == plain.sparse_layers == [0, 1] and experts(cfg) == experts(plain)
    assert (cfg.first_k_dense_replace, cfg.n_shared_experts, cfg.topk_method) == (0, 0, None)
    assert cfg.extra[key] == value and cfg.to_hf_dict()[key] == value  # kept as it is
    again = ModelConfig.from_file(_written(cfg), pretrained=True)
    assert again.to_hf_dict() == cfg.to_hf_dict()


def _written(cfg) -> str:
    import tempfile

    path = tempfile.mkdtemp(prefix="moe-keys-")
    with open(f"{path}/config.json", "w") as f:
        json.dump(cfg.to_hf_dict(), f)
    return path


@pytest.mark.parametrize("key, inert", [("first_k_dense_replace", 0), ("n_shared_experts", 0),
                                        ("topk_method", "greedy"), ("n_group", 1), ("topk_group", 1),
                                        ("routed_scaling_factor", 1.0)])
def test_a_deepseek_key_at_a_value_that_changes_nothing_is_accepted_in_a_qwen_file(key, inert):
    assert ModelConfig.from_dict(_preset("micro-qwen3-moe", **{key: inert})).sparse_layers == [0, 1]


def test_checks_experts_line_of_a_pretrained_qwen_with_deepseeks_keys_is_transformers_model(tmp_path, capsys):
    """The reviewer's case: check said '8 routed + 2 shared ... in 1 of 2 layers' of a model whose export
    transformers reads as 8 routed experts in both layers, no shared one."""
    from safetensors.numpy import save_file

    d = _preset("micro-qwen3-moe", n_shared_experts=2, first_k_dense_replace=1)
    model = tmp_path / "q3ds"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(d))
    cfg = ModelConfig.from_dict(d, pretrained=True)
    from pretrain_cli import runtime

    runtime.import_paddle()
    from pretrain_cli.models import build_model
    from pretrain_cli.models.convert import hf_params

    save_file({n: (p.numpy().T if tr else p.numpy()).copy() for n, p, tr in hf_params(build_model(cfg))},
              str(model / "model.safetensors"))
    from data_helpers import write_tokens

    data = write_tokens(tmp_path / "data", vocab_size=d["vocab_size"])
    rc = main(["check", "--model_name_or_path", str(model), "--continue_training", "true", "--output_dir",
               str(tmp_path / "o"), "--input_dir", data, "--do_train", "true", "--max_steps", "1",
               "--max_seq_length", "32"])
    out = capsys.readouterr()
    line = next(x for x in (out.out + out.err).splitlines() if "experts:" in x)
    assert "8 routed + 0 shared, 32 wide each, in 2 of 2 layers," in line, (rc, line)


def test_a_pretrained_deepseek_file_with_both_balance_weights_says_which_it_takes(tmp_path):
    from pretrain_cli.config.moe import resolve_moe
    from pretrain_cli.config.parser import parse_config
    from pretrain_cli.errors import Problems
    from pretrain_cli.run_layout import ParallelConfig

    def notes_of(cfg, *extra):
        args = parse_config(None, ["--model_name_or_path", "x", "--output_dir", str(tmp_path), *extra])
        notes = []
        moe = resolve_moe(args, cfg, ParallelConfig(), notes, Problems())
        return moe.aux_loss_coef, [n for n in notes if "aux_loss_alpha" in n]

    both = ModelConfig.from_dict(_preset("micro-deepseek-v2", router_aux_loss_coef=0.01), pretrained=True)
    coef, said = notes_of(both)
    assert coef == 0.001 and len(said) == 1, said
    assert "aux_loss_alpha (0.001) and router_aux_loss_coef (0.01)" in said[0] and "takes 0.001" in said[0], said
    assert "router_aux_loss_coef in the argument file" in said[0], said
    assert notes_of(both, "--router_aux_loss_coef", "0.02") == (0.02, [])  # the file's weight: nothing to say
    same = ModelConfig.from_dict(_preset("micro-deepseek-v2", router_aux_loss_coef=0.001), pretrained=True)
    assert notes_of(same) == (0.001, [])
