"""Tokenizer loading, the train-tokenizer subcommand, HF compatibility."""
from __future__ import annotations

import argparse
import json

import pytest

from data_helpers import make_texts, make_tokenizer, write_jsonl
from pretrain_cli.commands import train_tokenizer as cmd
from pretrain_cli.data import tokenizer as tk
from pretrain_cli.errors import UserError


def _train(argv):
    p = argparse.ArgumentParser()
    cmd.add_arguments(p)
    return cmd.main(p.parse_args(argv))


def test_train_tokenizer_subcommand(tmp_path, capsys):
    corpus = write_jsonl(tmp_path / "c" / "a.jsonl", make_texts(300))
    (tmp_path / "c" / "b.txt").write_text("first paragraph\nstill first\n\nsecond paragraph\n")
    out = tmp_path / "tok"
    assert _train(["--input_path", str(tmp_path / "c"), "--output_dir", str(out), "--vocab_size", "320"]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["special_tokens_map.json", "tokenizer.json", "tokenizer_config.json"]
    assert not list(tmp_path.glob(".tok.tmp*"))
    tok = tk.load_tokenizer(out)
    assert tok.vocab_size == 320
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id) == (0, 1, 2)
    text = json.loads(corpus.read_text().splitlines()[0])["text"]
    assert tok.decode(tok.encode(text)) == text
    assert tok.encode_batch([text, "ü ok"]) == [tok.encode(text), tok.encode("ü ok")]  # byte-level: no UNK
    assert len(tok.sha256) == 64 and tok.sha256 == tk.load_tokenizer(out).sha256
    assert "train-tokenizer" in capsys.readouterr().out


def test_saved_tokenizer_loads_in_transformers(tmp_path):
    import transformers
    d = make_tokenizer(tmp_path / "tok")
    ours = tk.load_tokenizer(d)
    hf = transformers.PreTrainedTokenizerFast.from_pretrained(str(d))
    text = "the quick brown fox jumps over the lazy dog."
    assert hf(text, add_special_tokens=False)["input_ids"] == ours.encode(text)
    assert (hf.eos_token, hf.bos_token, hf.pad_token) == ("[EOT]", "[BOT]", "[PAD]")
    assert len(hf) == ours.vocab_size


def test_vocab_merges_directory_and_config_roles(tmp_path):
    d = make_tokenizer(tmp_path / "tok")
    ours = tk.load_tokenizer(d)
    model = json.loads((d / "tokenizer.json").read_text())["model"]
    legacy = tmp_path / "legacy"
    legacy.mkdir()
    (legacy / "vocab.json").write_text(json.dumps(model["vocab"]))
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    (legacy / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n")
    (legacy / "tokenizer_config.json").write_text(json.dumps({"eos_token": {"content": "[BOT]"}}))
    tok = tk.load_tokenizer(legacy)
    text = "alpha beta gamma"
    assert tok.encode(text) == ours.encode(text)
    assert tok.eos_token_id == ours.bos_token_id  # the config file wins over the fallback names


def test_load_errors(tmp_path):
    with pytest.raises(UserError, match="tokenizer directory not found.*train-tokenizer"):
        tk.load_tokenizer(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="no tokenizer.json.*train-tokenizer"):
        tk.load_tokenizer(tmp_path / "empty")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "tokenizer.json").write_text("{not json")
    with pytest.raises(UserError, match="cannot be loaded"):
        tk.load_tokenizer(tmp_path / "bad")


def test_train_errors(tmp_path):
    write_jsonl(tmp_path / "a.jsonl", ["x"])
    with pytest.raises(UserError, match="--vocab_size: 100 is below"):
        _train(["--input_path", str(tmp_path / "a.jsonl"), "--output_dir", str(tmp_path / "t"), "--vocab_size", "100"])
    write_jsonl(tmp_path / "e.jsonl", ["", "  "])
    with pytest.raises(UserError, match="no non-empty documents"):
        _train(["--input_path", str(tmp_path / "e.jsonl"), "--output_dir", str(tmp_path / "t"), "--vocab_size", "300"])
