"""Token files preprocessed without --append_eos: `check` said OK and `train` started with no word (packed samples
then run one document into the next), and `inspect-data` without --tokenizer left out 'documents ending in EOS'
though the sidecar records the EOS id. Files without a sidecar (another tool's) are not judged."""
from __future__ import annotations

import json

from data_helpers import make_texts, make_tokenizer, run_preprocess, write_jsonl, write_tokens
from pretrain_cli import cli


def _corpus(tmp_path):
    """data/with (--append_eos), data/without (none) and data/other (a token file without a sidecar)."""
    tok = make_tokenizer(tmp_path / "tok")
    write_jsonl(tmp_path / "a.jsonl", make_texts(60, seed=5))
    for name, flag in (("with", ["--append_eos"]), ("without", [])):
        assert run_preprocess("--input_path", tmp_path / "a.jsonl", "--output_prefix", tmp_path / "data" / name,
                              "--tokenizer", tok, "--log_interval", "0", *flag) == 0
    write_tokens(tmp_path / "data" / "other", vocab_size=300)
    return tok


def _check(tmp_path, capsys, input_dir: str, **keys) -> list[str]:
    (tmp_path / "args.json").write_text(json.dumps({
        "model_name_or_path": "micro-llama", "tokenizer_name_or_path": str(tmp_path / "tok"), "input_dir": input_dir,
        "output_dir": str(tmp_path / "out"), "device": "cpu", "do_train": True, "max_steps": 2,
        "max_seq_length": 16, "split": "1", "per_device_train_batch_size": 2, **keys}))
    capsys.readouterr()
    assert cli.main(["check", str(tmp_path / "args.json")]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-1].startswith("check: OK"), out
    return [line for line in out if "--append_eos" in line]


def test_check_warns_of_the_training_files_preprocessed_without_eos(tmp_path, capsys):
    _corpus(tmp_path)
    without = tmp_path / "data" / "without"
    assert _check(tmp_path, capsys, str(tmp_path / "data")) == [
        f"  note: input_dir: WARNING: {without} was preprocessed without --append_eos (eos_appended false in its "
        f"sidecar): packed samples run one document into the next with no EOS between them, so the model never "
        f"learns where a document ends; re-run preprocess with --append_eos"]
    # a file with EOS, one without a sidecar: nothing; a padded sample ends in the tokenizer's EOS itself
    assert _check(tmp_path, capsys, str(tmp_path / "data" / "with")) == []
    assert _check(tmp_path, capsys, str(tmp_path / "data" / "other")) == []
    assert _check(tmp_path, capsys, str(without), sample_mode="padded") == []


def test_inspect_data_without_tokenizer_says_the_eos_share_by_the_sidecars_eos(tmp_path, capsys):
    _corpus(tmp_path)
    said = {}
    for name in ("with", "without", "other"):
        capsys.readouterr()
        assert cli.main(["inspect-data", str(tmp_path / "data" / name)]) == 0
        said[name] = [line for line in capsys.readouterr().out.splitlines() if "ending in EOS" in line]
    assert said == {"with": ["documents ending in EOS: 100.0%"],
                    "without": ["documents ending in EOS: 0.0% (preprocessed without --append_eos)"],
                    "other": []}, said
