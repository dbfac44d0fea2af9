"""`orchestration.prepare`'s `changes`: what a command decides itself (`eval`: one split, no training) is applied
over the file and the user's overrides as typed keys, checked as they are, never rebuilt as `--key value` text."""
import json

import pytest

from data_helpers import write_tokens
from pretrain_cli.errors import UserError
from pretrain_cli.orchestration.prepare import prepare
from pretrain_cli.run_config import Target


def _config(tmp_path) -> str:
    path = tmp_path / "args.json"
    path.write_text(json.dumps({"model_name_or_path": "micro-llama", "input_dir": write_tokens(tmp_path / "data"),
                                "output_dir": str(tmp_path / "out"), "do_train": True, "do_eval": True,
                                "max_seq_length": 16, "max_steps": 2, "split": "1,1,1",
                                "tokenizer_name_or_path": None}))
    return str(path)


def test_a_commands_changes_win_over_the_file_and_the_users_overrides(tmp_path):
    cfg = _config(tmp_path)
    spec = prepare(cfg, ["--do_train", "true", "--attention_mask_type", "causal", "--eval_iters", "3"], Target(),
                   {"do_train": False, "do_eval": False, "do_predict": True, "attention_mask_type": "document"})
    loop = spec.run.loop
    assert (loop.do_train, loop.do_eval, loop.do_predict) == (False, False, True)
    assert spec.run.data.attention_mask_type == "document" and loop.eval_iters == 3  # the user's key still applies
    assert spec.args.explicit["do_predict"] == "command line" and spec.splits.get("test") is not None
    assert prepare(cfg, [], Target()).run.loop.do_train  # without changes: the file as written


def test_a_change_is_type_checked_like_a_key(tmp_path):
    with pytest.raises(UserError, match="do_eval"):
        prepare(_config(tmp_path), [], Target(), {"do_eval": "sometimes"})
