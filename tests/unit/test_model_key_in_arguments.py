"""A config.json key given as a training key (`--num_experts 16`, a file's `"hidden_size"`): one line saying where it
belongs, not `unknown key` with the nearest training key's spelling (`n_routed_experts`: `no_recompute_layers`)."""
import json

import pytest

from pretrain_cli.cli import main as cli_main

WHERE = ("is a key of the model's config.json, not of the argument file; write it in the config.json of a model "
         'directory and name that directory as model_name_or_path (docs/MOE.md, "Your own model size")')


@pytest.mark.parametrize("key,value", [("num_experts", "16"), ("n_routed_experts", "16"),
                                       ("num_experts_per_tok", "4"), ("norm_topk_prob", "true"),
                                       ("aux_loss_alpha", "0.01"), ("hidden_size", "128")])
def test_a_model_key_on_the_command_line_names_config_json(tmp_path, capsys, key, value):
    cfg = tmp_path / "moe.json"
    cfg.write_text(json.dumps({"model_name_or_path": "micro-qwen3-moe", "input_dir": "data", "do_train": True}))
    assert cli_main(["check", str(cfg), f"--{key}", value]) == 2
    assert capsys.readouterr().err.splitlines() == [f"error: command line: `{key}` {WHERE}"]


def test_in_the_file_too_and_training_keys_keep_their_suggestion(tmp_path, capsys):
    cfg = tmp_path / "moe.json"
    cfg.write_text(json.dumps({"model_name_or_path": "micro-qwen3-moe", "input_dir": "data", "do_train": True,
                               "num_experts": 16}))
    assert cli_main(["plan", str(cfg)]) == 2
    assert f"`num_experts` {WHERE}" in capsys.readouterr().err
    # the argument-file keys that share a config.json name stay argument keys
    cfg.write_text(json.dumps({"model_name_or_path": "micro-qwen3-moe", "input_dir": "data", "do_train": True,
                               "output_dir": str(tmp_path / "out"), "max_steps": 10,
                               "router_aux_loss_coef": 0.01, "vocab_size": 1024}))
    assert cli_main(["plan", str(cfg), "--device", "cpu"]) == 0
    assert "vocab 1024, 8 experts (2 per token)" in capsys.readouterr().out
    assert cli_main(["plan", str(cfg), "--max_seq", "64", "--max_stepz", "3"]) == 2
    err = capsys.readouterr().err
    assert "did you mean `max_seq_length`?" in err or "did you mean `max_steps`?" in err
