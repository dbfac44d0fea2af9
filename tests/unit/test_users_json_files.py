"""Every JSON file a user hands in is read by `json_mistakes` (its words, its nesting guard): a .jsonl data line nested
past Python's recursion limit is one bad line (skipped and counted with --skip_bad_lines), and a tokenizer's
tokenizer_config.json and a model's model.safetensors.index.json name the mistake at its line:column or the nesting
in one line, where they ended in a RecursionError traceback or in Python's raw message."""
from __future__ import annotations

import json

import pytest

from data_helpers import make_tokenizer
from pretrain_cli.data.documents import DocumentReader
from pretrain_cli.data.tokenizer import load_tokenizer
from pretrain_cli.errors import UserError
from pretrain_cli.json_mistakes import NESTED
from pretrain_cli.models import model_files

DEEP = "[" * 100000


def _corpus(tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_text(json.dumps({"text": "one"}) + "\n" + DEEP + "\n" + json.dumps({"text": "two"}) + "\n")
    return path


def test_a_deeply_nested_data_line_is_a_bad_line(tmp_path):
    path = _corpus(tmp_path)
    notes = []
    reader = DocumentReader([str(path)], skip_bad_lines=True, note=notes.append)
    assert list(reader) == ["one", "two"] and reader.bad_lines == 1
    assert notes == [f"warning: skipped {path}:2: {NESTED}"], notes
    with pytest.raises(UserError, match=rf"^{path}:2: {NESTED}; .* or pass --skip_bad_lines$"):
        list(DocumentReader([str(path)]))


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    return make_tokenizer(tmp_path_factory.mktemp("tok") / "tok")


@pytest.mark.parametrize("text,said", [
    (DEEP, f"tokenizer_config.json: {NESTED}; tokenizer_config.json is one JSON object; fix or delete it"),
    ('{"eos_token": "</s>",}', "tokenizer_config.json:1:21: invalid JSON: a trailing comma before }; remove it; "
                               "fix or delete it"),
])
def test_a_tokenizer_config_names_its_mistake(tmp_path, tok_dir, text, said):
    import shutil

    d = shutil.copytree(tok_dir, tmp_path / "tok")
    (d / "tokenizer_config.json").write_text(text)
    with pytest.raises(UserError) as e:
        load_tokenizer(str(d))
    assert str(e.value) == f"{d}/{said}"


@pytest.mark.parametrize("text,said", [
    (DEEP, f" {NESTED}; a shard index is one JSON object; re-create it or point to another checkpoint"),
    ('{"weight_map": {"a": "x.safetensors"}', "1:38: invalid JSON: the JSON ends before its closing } or ]; close "
                                              "it; re-create it or point to another checkpoint"),
])
def test_a_shard_index_names_its_mistake(tmp_path, text, said):
    (tmp_path / "model.safetensors.index.json").write_text(text)
    with pytest.raises(UserError) as e:
        model_files.find_weights(str(tmp_path))
    assert str(e.value) == f"{tmp_path}/model.safetensors.index.json:{said}"
