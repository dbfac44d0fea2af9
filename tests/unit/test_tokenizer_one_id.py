"""One id for a tokenizer wherever a user reads it: train-tokenizer's summary, inspect-data's lines and check's error
for token files of another tokenizer all name its fingerprint (`data.tokenizer.Tokenizer.fingerprint`, what the
check compares). train-tokenizer and inspect-data said `sha256 d1be88...` (tokenizer.json's bytes) while check's
error said `tokenizer_fingerprint c6929e...` of the same tokenizer: two ids, nothing to match them."""
import json
import re

from data_helpers import make_texts, run_preprocess, write_jsonl
from pretrain_cli import cli


def _made(capsys, out, corpus) -> str:
    """train-tokenizer's id of the tokenizer it made (its summary line)."""
    capsys.readouterr()
    assert cli.main(["train-tokenizer", "--input_path", str(corpus), "--output_dir", str(out), "--vocab_size", "300"]) == 0
    line = capsys.readouterr().out
    return re.search(r"fingerprint ([0-9a-f]{12})\)", line).group(1)


def test_train_tokenizer_inspect_data_and_check_name_one_id(tmp_path, capsys):
    write_jsonl(tmp_path / "a.jsonl", make_texts(60, seed=1))
    write_jsonl(tmp_path / "b.jsonl", make_texts(60, seed=7))
    made = _made(capsys, tmp_path / "tok", tmp_path / "a.jsonl")
    other = _made(capsys, tmp_path / "other", tmp_path / "b.jsonl")
    assert made != other
    run_preprocess("--input_path", tmp_path / "a.jsonl", "--output_prefix", tmp_path / "d" / "c",
                   "--tokenizer", tmp_path / "tok", "--append_eos")
    capsys.readouterr()
    assert cli.main(["inspect-data", str(tmp_path / "d")]) == 0
    listed = capsys.readouterr().out
    assert f", fingerprint {made})" in listed and "sha256" not in listed, listed
    # check with the other tokenizer: its error names both by the ids train-tokenizer printed
    (tmp_path / "args.json").write_text(json.dumps({
        "model_name_or_path": "micro-llama", "vocab_size": 300, "tokenizer_name_or_path": str(tmp_path / "other"),
        "input_dir": str(tmp_path / "d"), "output_dir": str(tmp_path / "out"), "device": "cpu", "do_train": True,
        "max_steps": 1, "max_seq_length": 16, "split": "1", "per_device_train_batch_size": 1}))
    assert cli.main(["check", str(tmp_path / "args.json")]) == 2
    err = capsys.readouterr().err
    assert f"(fingerprint {made}; {tmp_path / 'other'} has {other})" in err, err


def test_files_of_one_tokenizer_and_its_resaved_copy_agree(tmp_path, capsys):
    """inspect-data DIR and merge-data compare the files' tokenizers by fingerprint: a copy of a tokenizer re-saved
    with another indent (another tokenizer.json sha256) is the same tokenizer. Files of another tokenizer of the same
    size differ by fingerprint, and a sidecar from before the fingerprint is compared by its sha256, each named as
    inspect-data's rows name it."""
    write_jsonl(tmp_path / "a.jsonl", make_texts(60, seed=1))
    write_jsonl(tmp_path / "b.jsonl", make_texts(60, seed=2))
    made = _made(capsys, tmp_path / "tok", tmp_path / "a.jsonl")
    (tmp_path / "tok2").mkdir()
    for f in (tmp_path / "tok").iterdir():
        (tmp_path / "tok2" / f.name).write_bytes(f.read_bytes())
    j = json.loads((tmp_path / "tok" / "tokenizer.json").read_text())
    (tmp_path / "tok2" / "tokenizer.json").write_text(json.dumps(j, indent=1))
    for name, tok in (("a", "tok"), ("b", "tok2")):
        run_preprocess("--input_path", tmp_path / f"{name}.jsonl", "--output_prefix", tmp_path / "d" / name,
                       "--tokenizer", tmp_path / tok, "--append_eos")
    metas = [json.loads((tmp_path / "d" / f"{n}.json").read_text()) for n in "ab"]
    assert metas[0]["tokenizer_sha256"] != metas[1]["tokenizer_sha256"]  # the copy's bytes differ
    capsys.readouterr()
    assert cli.main(["inspect-data", str(tmp_path / "d")]) == 0
    out = capsys.readouterr().out
    assert out.count(f", fingerprint {made})") >= 2, out
    assert cli.main(["merge-data", str(tmp_path / "m"), str(tmp_path / "d")]) == 0
    assert json.loads((tmp_path / "m.json").read_text())["tokenizer_fingerprint"] == metas[0]["tokenizer_fingerprint"]
    # another tokenizer of the same size: its fingerprint differs, said so
    other = _made(capsys, tmp_path / "other", tmp_path / "b.jsonl")
    run_preprocess("--input_path", tmp_path / "b.jsonl", "--output_prefix", tmp_path / "d" / "c",
                   "--tokenizer", tmp_path / "other", "--append_eos")
    capsys.readouterr()
    assert cli.main(["inspect-data", str(tmp_path / "d")]) == 2
    err = capsys.readouterr().err
    assert f"c.json: tokenizer fingerprint {other} differs from {made} in " in err, err
    # sidecars from before the fingerprint: their tokenizer.json sha256 is what they can compare
    (tmp_path / "d" / "c.json").unlink()
    for n, meta in zip("ab", metas):
        meta.pop("tokenizer_fingerprint")
        (tmp_path / "d" / f"{n}.json").write_text(json.dumps(meta))
    assert cli.main(["inspect-data", str(tmp_path / "d")]) == 2
    out, err = capsys.readouterr()
    assert f"tokenizer.json sha256 {metas[0]['tokenizer_sha256'][:12]}" in out and "tokenizer tokenizer" not in out
    assert f"b.json: tokenizer.json sha256 {metas[1]['tokenizer_sha256'][:12]} differs from" in err, err
