"""inspect-data: summary, JSON, decode, step view, errors (in-process, no Paddle)."""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import pytest

from data_helpers import make_texts, make_tokenizer, write_jsonl
from pretrain_cli.commands import inspect_data
from pretrain_cli.commands import preprocess
from pretrain_cli.errors import UserError


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    d = tmp_path_factory.mktemp("inspect")
    tok = make_tokenizer(d / "tok")
    texts = make_texts(80, seed=9)
    write_jsonl(d / "a.jsonl", texts)
    p = argparse.ArgumentParser()
    preprocess.add_arguments(p)
    preprocess.main(p.parse_args(["--input_path", str(d / "a.jsonl"), "--output_prefix", str(d / "c"),
                                  "--tokenizer", str(tok), "--append_eos"]))
    return d, tok, texts


def _run(*argv):
    p = argparse.ArgumentParser()
    inspect_data.add_arguments(p)
    return inspect_data.main(p.parse_args([str(a) for a in argv]))


def test_summary_text_and_json(corpus, capsys):
    d, tok, _ = corpus
    assert _run(d / "c", "--tokenizer", tok) == 0
    out = capsys.readouterr().out
    assert "OK (mmidx, uint16)" in out and "documents 80" in out and "documents ending in EOS: 100.0%" in out
    assert _run(str(d / "c") + ".bin", "--json") == 0
    info = json.loads(capsys.readouterr().out)
    assert info["documents"] == 80 and info["dtype"] == "uint16" and info["tokens"] > 80
    assert info["max_token_id"] < 300 and sum(info["length_histogram"].values()) == 80


def test_decode(corpus, capsys):
    d, tok, texts = corpus
    assert _run(d / "c", "--tokenizer", tok, "--decode", 3) == 0
    assert capsys.readouterr().out.rstrip("\n") == texts[3] + "[EOT]"
    with pytest.raises(UserError, match="document 80 out of range"):
        _run(d / "c", "--tokenizer", tok, "--decode", 80)


def test_decode_without_tokenizer_takes_the_one_the_sidecar_names(corpus, tmp_path, capsys):
    """`inspect-data data/c --decode 3` stopped with "needs --tokenizer DIR" though c.json names the tokenizer that
    made the file (and its sha256): that one, unchanged, decodes with a note; a changed or missing one does not."""
    d, tok, texts = corpus
    assert _run(d / "c", "--decode", 3) == 0
    printed = capsys.readouterr()
    assert printed.out.rstrip("\n") == texts[3] + "[EOT]"
    assert printed.err == f"note: --decode: with {tok}, the tokenizer {d / 'c'}.json names as the one that made it\n"
    sidecar = json.loads((d / "c.json").read_text())
    other = str(make_tokenizer(tmp_path / "other", make_texts(50, seed=1)))
    for name, path, why in (("other", other, "but its files changed since (their sha256 is not the one {p}.json "
                                             "records)"),
                            ("gone", str(tmp_path / "gone"), f"which is not a directory from here ({os.getcwd()})"),
                            ("none", None, None)):
        (tmp_path / f"c_{name}.json").write_text(json.dumps({**sidecar, "tokenizer": path}))
        for ext in (".bin", ".idx"):
            (tmp_path / f"c_{name}{ext}").write_bytes((d / f"c{ext}").read_bytes())
        with pytest.raises(UserError) as e:
            _run(tmp_path / f"c_{name}", "--decode", 3)
        p = tmp_path / f"c_{name}"  # the error says why the sidecar's tokenizer cannot be used, and how to go on
        assert str(e.value) == "--decode: needs --tokenizer DIR to turn ids back into text" + (
            f": {p}.json names {path} as the tokenizer that made it, {why.format(p=p)}" if why else "")


def test_step_view_matches_loader(corpus, capsys):
    d, tok, _ = corpus
    assert _run(d / "c", "--step", 2, "--max_seq_length", 16, "--split", "1", "--batch_size", 2, "--dp_size", 2,
                "--gradient_accumulation_steps", 2, "--tokenizer", tok) == 0
    out = capsys.readouterr().out
    assert "step 2: global samples [8, 16)" in out and "rank 1: samples [14, 16)" in out
    from pretrain_cli.data import build_datasets
    from pretrain_cli.data.loader import batch_hash, micro_batch

    ds = build_datasets(str(d / "c"), "1", 16, 42, need=("train",)).train
    assert f"hash {batch_hash(micro_batch(ds, 12, 2, 1, 2))}" in out


def test_out_of_vocab_and_bad_file(corpus, tmp_path):
    d, _, _ = corpus
    small = make_tokenizer(tmp_path / "small", make_texts(50, seed=1), vocab_size=270)
    with pytest.raises(UserError, match=r"max token id \d+ >= vocab size 270"):
        _run(d / "c", "--tokenizer", small)
    (tmp_path / "bad.idx").write_bytes(b"garbage!!" + bytes(40))
    (tmp_path / "bad.bin").write_bytes(b"")
    with pytest.raises(UserError, match="bad.idx: wrong magic"):
        _run(tmp_path / "bad")


def test_no_paddle_import():
    import subprocess

    code = ("import sys, pretrain_cli.data.inspect, pretrain_cli.data.tokenizer, pretrain_cli.data.preprocess, "
            "pretrain_cli.data.loader, pretrain_cli.data; print('paddle' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "False"


def test_step_view_counts_data_ranks_in_train_s_words(corpus, capsys):
    """The step line names the batch as `train`'s `batch:` line does ("2 data ranks"): it said "dp 2", which a user of
    sharding or expert parallelism reads as the dp degree (PaddleNLP's DeepSeek-V3 file: dp 1, 4 data ranks).
    --data_ranks is the option's name, --dp_size its older one; --json says "data_ranks" too."""
    d, _, _ = corpus
    argv = (d / "c", "--step", 2, "--max_seq_length", 16, "--split", "1", "--batch_size", 2,
            "--gradient_accumulation_steps", 2)
    assert _run(*argv, "--data_ranks", 2) == 0
    text = capsys.readouterr().out
    assert "step 2: global samples [8, 16) (micro_bs 2 x 2 data ranks x acc 2)" in text and " dp " not in text
    assert _run(*argv, "--dp_size", 2) == 0 and capsys.readouterr().out == text  # the older name: the same run
    assert _run(*argv, "--data_ranks", 1) == 0
    assert "(micro_bs 2 x 1 data rank x acc 2)" in capsys.readouterr().out
    assert _run(*argv, "--data_ranks", 2, "--json") == 0
    info = json.loads(capsys.readouterr().out)
    assert info["data_ranks"] == 2 and "dp_size" not in info


def test_step_view_json_is_one_object_with_the_texts_hashes(corpus, capsys):
    d, tok, _ = corpus
    argv = (d / "c", "--step", 2, "--max_seq_length", 16, "--split", "1", "--batch_size", 2, "--dp_size", 2,
            "--gradient_accumulation_steps", 2, "--tokenizer", tok)
    assert _run(*argv) == 0
    text = capsys.readouterr().out
    assert _run(*argv, "--json") == 0
    info = json.loads(capsys.readouterr().out)  # the whole of stdout
    assert info["step"] == 2 and info["samples"] == [8, 16] and len(info["micro_steps"]) == 2
    hashes = [h for m in info["micro_steps"] for h in [m["hash"]] + [r["hash"] for r in m["ranks"]]]
    assert len(hashes) == 6 and all(f"hash {h}" in text for h in hashes)
    rank = info["micro_steps"][1]["ranks"][1]
    assert rank["samples"] == [14, 16] and repr(rank["first_sample"]) in text


def test_step_view_of_a_config_without_output_dir(corpus, tmp_path, capsys):
    """A base config that leaves output_dir to the command line: only training needs one."""
    d, tok, _ = corpus
    cfg = {"model_name_or_path": "micro-qwen2", "tokenizer_name_or_path": str(tok), "input_dir": str(d / "c"),
           "split": "1", "max_seq_length": 16, "per_device_train_batch_size": 2, "device": "cpu", "do_train": True,
           "max_steps": 10}
    (tmp_path / "base.json").write_text(json.dumps(cfg))
    placeholders = lambda: sorted(Path(tempfile.gettempdir()).glob("pretrain-cli-inspect-*"))  # noqa: E731
    before = placeholders()
    assert _run("--config", tmp_path / "base.json", "--step", 2) == 0
    text = capsys.readouterr().out
    assert "step 2: global samples [2, 4)" in text and "trainer state" not in text
    assert _run("--config", tmp_path / "base.json", "--step", 2, "--json") == 0
    assert json.loads(capsys.readouterr().out)["trainer_state"] is None
    assert placeholders() == before  # the placeholder output_dir is removed again
    del cfg["do_train"]  # a base file that leaves the do_* keys to the command line too: the step is training's
    (tmp_path / "base.json").write_text(json.dumps(cfg))
    assert _run("--config", tmp_path / "base.json", "--step", 2) == 0
    assert "step 2: global samples [2, 4)" in capsys.readouterr().out


def test_tokenizer_check_is_the_one_train_and_check_do(corpus, tmp_path, capsys):
    """A tokenizer retrained on other text to the same vocabulary size: every id is in range, only the sidecar's
    fingerprint tells; `inspect-data --tokenizer` refuses it for one prefix and for a directory, as `check` does."""
    d, tok, _ = corpus
    same_size = make_tokenizer(tmp_path / "same_size", make_texts(50, seed=7), vocab_size=300)
    (tmp_path / "dir").mkdir()
    for ext in (".bin", ".idx", ".json"):
        (tmp_path / "dir" / f"c{ext}").write_bytes((d / f"c{ext}").read_bytes())
    for target in (d / "c", tmp_path / "dir"):
        assert _run(target, "--tokenizer", tok) == 0
        with pytest.raises(UserError) as e:
            _run(target, "--tokenizer", same_size)
        msg = str(e.value)
        assert msg.startswith(f"{target if target.name == 'c' else target / 'c'}.json: made by another tokenizer than "
                              f"{same_size} (fingerprint ") and "\n" not in msg
        assert msg.endswith(f"re-run preprocess with {same_size}, or pass the --tokenizer that made it"), msg
        assert "the run's" not in msg  # inspect-data has no run: the value is --tokenizer's, named by its path
    larger = make_tokenizer(tmp_path / "larger", make_texts(50, seed=7), vocab_size=320)
    with pytest.raises(UserError) as e:
        _run(d / "c", "--tokenizer", larger)
    assert f"(vocab_size 300; {larger} has 320)" in str(e.value)


def _int32_tokens(prefix, ids):
    import struct

    import numpy as np

    ids = np.asarray(ids, "<i4")
    with open(f"{prefix}.bin", "wb") as f:
        f.write(ids.tobytes())
    with open(f"{prefix}.idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, 4, 1, 2) + struct.pack("<i", ids.size)
                + struct.pack("<qqq", 0, 0, 1))


def test_negative_ids_are_refused_where_ids_beyond_the_vocabulary_are(tmp_path, corpus):
    """`train` died at step 1 in the embedding; `check`, `inspect-data` and a directory said OK."""
    from pretrain_cli.data import build_datasets

    _, tok, _ = corpus
    (tmp_path / "d").mkdir()
    _int32_tokens(tmp_path / "d" / "neg", [5, -10, 39, 7] * 10)
    want = f"{tmp_path / 'd' / 'neg'}.bin: token id -10 < 0 (int32); these are not a tokenizer's ids"
    for argv in ([tmp_path / "d" / "neg"], [tmp_path / "d" / "neg", "--tokenizer", tok], [tmp_path / "d"]):
        with pytest.raises(UserError) as e:
            _run(*argv)
        assert str(e.value).startswith(want), str(e.value)
    with pytest.raises(UserError, match="token id -10 < 0"):
        build_datasets(str(tmp_path / "d" / "neg"), "1", 8, 1, need=("train",), vocab_size=64)
    _int32_tokens(tmp_path / "ok", [5, 10, 39, 7] * 10)
    assert build_datasets(str(tmp_path / "ok"), "1", 8, 1, need=("train",), vocab_size=64).train is not None
    assert _run(tmp_path / "ok") == 0


def test_eval_on_a_token_file_refuses_negative_ids_too(tmp_path, capsys):
    from pretrain_cli.cli import main as cli_main

    _int32_tokens(tmp_path / "neg", [5, -10, 39, 7] * 10)
    assert cli_main(["eval", "--model", "micro-qwen2", "--data", str(tmp_path / "neg"), "--max_seq_length", "8"]) == 2
    assert f"{tmp_path / 'neg'}.bin: token id -10 < 0 (int32)" in capsys.readouterr().err


def test_tokenizer_check_is_said_and_a_file_without_sidecar_noted(corpus, tmp_path, capsys):
    """`inspect-data DIR --tokenizer tok` printed what it printed without --tokenizer, the note telling the user to
    pass --tokenizer included, though the ids were checked; one file without a sidecar had no note at all."""
    import shutil

    d, tok, _ = corpus
    (tmp_path / "d").mkdir()
    for ext in (".bin", ".idx", ".json"):
        shutil.copy(str(d / "c") + ext, tmp_path / "d" / f"a{ext}")
    for ext in (".bin", ".idx"):
        shutil.copy(str(d / "c") + ext, tmp_path / "d" / f"old{ext}")
    note = "(Megatron, PaddleNLP or an older pretrain-cli made it): its tokenizer is unknown; "
    assert _run(tmp_path / "d", "--tokenizer", tok) == 0
    assert capsys.readouterr().out.splitlines()[-2:] == [
        f"ids checked against {tok}: all below its vocab 300; 1 sidecar agrees with it",
        f"note: 1 file has no .json sidecar {note}only its ids' range was checked against {tok}"]
    assert _run(tmp_path / "d") == 0
    assert capsys.readouterr().out.splitlines()[-1] == (f"note: 1 file has no .json sidecar {note}--tokenizer DIR "
                                                        "checks its ids against one")
    assert _run(tmp_path / "d" / "old", "--tokenizer", tok) == 0
    assert capsys.readouterr().out.splitlines()[-2:] == [
        f"ids checked against {tok}: all below its vocab 300",
        f"note: the file has no .json sidecar {note}only its ids' range was checked against {tok}"]
    assert _run(tmp_path / "d" / "old") == 0
    assert capsys.readouterr().out.splitlines()[-1] == (f"note: the file has no .json sidecar {note}--tokenizer DIR "
                                                        "checks its ids against one")
    assert _run(tmp_path / "d" / "a", "--tokenizer", tok) == 0
    assert capsys.readouterr().out.splitlines()[-1] == f"ids checked against {tok}: all below its vocab 300; its " \
                                                       "sidecar agrees with it"
