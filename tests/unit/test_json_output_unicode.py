"""JSON printed for people and pipes (`--json` of eval, generate, inspect-data, check and plan, `plan -o`'s JSON
file, check's arguments) spells non-ASCII text as itself: `"東京"` was printed `"\\u6771\\u4eac"`, an emoji as a
surrogate pair. The JSON still parses to the same values."""
import json

import pytest

from data_helpers import make_tokenizer, write_tokens
from pretrain_cli import runtime
from pretrain_cli.cli import main as cli_main

paddle = runtime.import_paddle()

NAME = "東京🚀"  # a CJK word and a character past U+FFFF (a surrogate pair when escaped)


def _printed(capsys) -> str:
    out = capsys.readouterr().out
    assert "\\u" not in out, out
    return out


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A tiny model with a tokenizer, in a directory whose name is not ASCII."""
    from pretrain_cli.data.tokenizer import load_tokenizer
    from pretrain_cli.models import build_model, convert
    from pretrain_cli.models.config import ModelConfig

    d = tmp_path_factory.mktemp("m") / NAME
    d.mkdir()
    make_tokenizer(d)
    cfg = ModelConfig(model_type="llama", vocab_size=load_tokenizer(str(d)).vocab_size, hidden_size=16,
                      intermediate_size=24, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                      max_position_embeddings=32)
    paddle.seed(0)
    convert.save_hf(build_model(cfg), cfg, str(d))
    return str(d)


def test_generate_json(model_dir, capsys):
    assert cli_main(["generate", "--model", model_dir, "--prompt", f"the {NAME}", "--max_new_tokens", "2",
                     "--json"]) == 0
    out = _printed(capsys)
    assert f'"prompt": "the {NAME}"' in out and json.loads(out)["model"] == model_dir


def test_eval_json(model_dir, tmp_path, capsys):
    prefix = write_tokens(tmp_path / NAME, n_docs=4, doc_len=40, vocab_size=32)
    assert cli_main(["eval", "--model", model_dir, "--data", prefix, "--max_seq_length", "8", "--json"]) == 0
    out = _printed(capsys)
    assert NAME in out and json.loads(out)["model"] == model_dir


def test_inspect_data_json(tmp_path, capsys):
    prefix = write_tokens(tmp_path / NAME, n_docs=4, doc_len=40)
    assert cli_main(["inspect-data", prefix, "--json"]) == 0
    out = _printed(capsys)
    assert NAME in out and json.loads(out)


def _run_file(tmp_path) -> str:
    path = tmp_path / f"{NAME}.json"
    path.write_text(json.dumps({"model_name_or_path": "micro-llama", "input_dir": write_tokens(tmp_path / "data"),
                                "output_dir": str(tmp_path / NAME), "device": "cpu", "do_train": True,
                                "max_steps": 5, "max_seq_length": 16, "tokenizer_name_or_path": None}))
    return str(path)


def test_check_json_and_its_argument_lines(tmp_path, capsys):
    path = _run_file(tmp_path)
    assert cli_main(["check", path, "--json"]) == 0
    out = _printed(capsys)
    assert NAME in out and json.loads(out)
    assert cli_main(["check", path]) == 0
    assert f'  output_dir = "{tmp_path / NAME}"' in _printed(capsys).splitlines()


def test_plan_json_and_its_fitted_file(tmp_path, capsys):
    path = _run_file(tmp_path)
    assert cli_main(["plan", path, "--device", "cpu", "--json"]) == 0
    assert json.loads(_printed(capsys))["config"] == path
    assert cli_main(["plan", path, "--device", "cpu", "--fit", "--json"]) == 0
    assert json.loads(_printed(capsys))["config"] == path
    fitted = tmp_path / "fitted.json"
    assert cli_main(["plan", path, "--device", "cpu", "--fit", "-o", str(fitted)]) == 0
    text = fitted.read_text(encoding="utf-8")
    assert f'"output_dir": "{tmp_path / NAME}-fitted"' in text and json.loads(text)
