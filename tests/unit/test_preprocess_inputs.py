"""preprocess and train-tokenizer inputs: text that is not Unicode, other jobs' token files in the input tree, one file
reached twice, and output names checked before any work."""
from __future__ import annotations

import argparse
import json
import os

import pytest

from data_helpers import make_texts, make_tokenizer, run_preprocess, write_jsonl
from pretrain_cli import cli
from pretrain_cli.commands import train_tokenizer
from pretrain_cli.data.indexed import open_token_file
from pretrain_cli.errors import UserError

# line 2: a JSON escape of a lone surrogate; line 3: the same surrogate as raw (CESU-8) bytes, which json.loads lets
# through; line 4: a valid surrogate pair (one emoji), which is fine
SURROGATES = (b'{"text": "hello"}\n{"text": "bad \\ud800 surrogate"}\n{"text": "raw \xed\xa0\x80 bytes"}\n'
              b'{"text": "pair \\ud83d\\ude00 ok"}\n')


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    return make_tokenizer(tmp_path_factory.mktemp("tok") / "tok")


def _train_tokenizer(*argv):
    p = argparse.ArgumentParser()
    train_tokenizer.add_arguments(p)
    return train_tokenizer.main(p.parse_args([str(a) for a in argv]))


@pytest.mark.parametrize("workers", [1, 2])
def test_a_lone_surrogate_is_a_bad_line_not_a_crash(tmp_path, tok_dir, capsys, workers):
    (tmp_path / "s.jsonl").write_bytes(SURROGATES)
    argv = ["--input_path", tmp_path / "s.jsonl", "--output_prefix", tmp_path / "o", "--tokenizer", tok_dir,
            "--workers", workers]
    with pytest.raises(UserError) as e:
        run_preprocess(*argv)
    assert str(e.value) == (f"{tmp_path / 's.jsonl'}:2: not valid Unicode (a lone surrogate U+D800 at character 4 of "
                            "the text); fix it or pass --skip_bad_lines")
    assert not list(tmp_path.glob("o*"))
    assert run_preprocess(*argv, "--skip_bad_lines") == 0
    assert open_token_file(tmp_path / "o").num_documents == 2  # "hello" and the pair
    assert json.loads((tmp_path / "o.json").read_text())["skipped_bad_lines"] == 2
    err = capsys.readouterr().err
    assert "s.jsonl:2: not valid Unicode" in err and "s.jsonl:3: not valid Unicode" in err


def test_train_tokenizer_refuses_or_skips_a_lone_surrogate(tmp_path, capsys):
    write_jsonl(tmp_path / "c" / "a.jsonl", make_texts(50))
    (tmp_path / "c" / "s.jsonl").write_bytes(SURROGATES)
    argv = ["--input_path", tmp_path / "c", "--output_dir", tmp_path / "tok", "--vocab_size", 300]
    assert cli.main(["train-tokenizer", *map(str, argv)]) == 2
    assert "s.jsonl:2: not valid Unicode (a lone surrogate" in capsys.readouterr().err
    assert not (tmp_path / "tok").exists()
    assert _train_tokenizer(*argv, "--skip_bad_lines") == 0
    assert "skipped 2 bad lines" in capsys.readouterr().err


def test_other_jobs_token_files_in_the_input_tree_are_skipped(tmp_path, tok_dir, capsys):
    """A second preprocess over a directory holding the first one's output read `out.json` as a corpus."""
    texts = make_texts(30, seed=2)
    write_jsonl(tmp_path / "tree" / "a.jsonl", texts)
    argv = ["--input_path", tmp_path / "tree", "--tokenizer", tok_dir]
    run_preprocess(*argv, "--output_prefix", tmp_path / "tree" / "out")
    (tmp_path / "tree" / "moved.json").write_text((tmp_path / "tree" / "out.json").read_text())  # a sidecar alone
    capsys.readouterr()
    assert run_preprocess(*argv, "--output_prefix", tmp_path / "tree" / "out2") == 0
    err = capsys.readouterr().err
    assert f"note: skipped {tmp_path / 'tree' / 'out.json'}" in err and "moved.json" in err
    assert open_token_file(tmp_path / "tree" / "out2").num_documents == 30
    # a real .json corpus in the same tree is still read
    write_jsonl(tmp_path / "tree" / "b.json", ["one more document"])
    run_preprocess(*argv, "--output_prefix", tmp_path / "tree" / "out3")
    assert open_token_file(tmp_path / "tree" / "out3").num_documents == 31


def test_a_file_reached_twice_through_a_symlink_is_read_once(tmp_path, tok_dir):
    write_jsonl(tmp_path / "comp" / "a.jsonl", make_texts(20, seed=4))
    os.symlink(tmp_path / "comp" / "a.jsonl", tmp_path / "alink.jsonl")
    run_preprocess("--input_path", tmp_path / "comp" / "a.jsonl", tmp_path / "alink.jsonl", tmp_path / "comp",
                   "--output_prefix", tmp_path / "o", "--tokenizer", tok_dir)
    assert open_token_file(tmp_path / "o").num_documents == 20


@pytest.mark.parametrize("taken", ["x.bin", "x.idx", "x.bin.tmp", "x.progress.json"])
def test_an_output_name_that_is_a_directory_is_refused_before_any_work(tmp_path, tok_dir, monkeypatch, taken):
    write_jsonl(tmp_path / "a.jsonl", make_texts(10))
    (tmp_path / "od" / taken).mkdir(parents=True)
    import pretrain_cli.data.encode_pool as pool

    monkeypatch.setattr(pool, "load_tokenizer", lambda d: pytest.fail("tokenizer loaded before the check"))
    with pytest.raises(UserError) as e:
        run_preprocess("--input_path", tmp_path / "a.jsonl", "--output_prefix", tmp_path / "od" / "x",
                       "--tokenizer", tok_dir)
    assert str(e.value) == (f"--output_prefix {tmp_path / 'od' / 'x'}: {tmp_path / 'od' / taken} is a directory, "
                            "where an output file goes; move it or choose another prefix")
    assert sorted(os.listdir(tmp_path / "od")) == [taken]
    # a task's own names are checked too
    (tmp_path / "od" / "y-00001-of-00002.idx").mkdir()
    with pytest.raises(UserError, match="y-00001-of-00002.idx is a directory"):
        run_preprocess("--input_path", tmp_path / "a.jsonl", "--output_prefix", tmp_path / "od" / "y",
                       "--tokenizer", tok_dir, "--num_tasks", 2, "--task_index", 1)


def test_replacing_existing_token_files_is_said(tmp_path, tok_dir, capsys):
    """A second preprocess into the same prefix replaced the files without a word (a 4k-vocab file gone under a
    2k tokenizer's): it says so, naming another tokenizer when the sidecar's fingerprint differs."""
    write_jsonl(tmp_path / "a.jsonl", make_texts(20, seed=5))
    write_jsonl(tmp_path / "b.jsonl", make_texts(20, seed=6))
    other = make_tokenizer(tmp_path / "tok2", texts=make_texts(200, seed=9), vocab_size=320)
    assert run_preprocess("--input_path", tmp_path / "a.jsonl", "--output_prefix", tmp_path / "o",
                          "--tokenizer", tok_dir) == 0
    assert "replacing" not in capsys.readouterr().err  # nothing there before
    assert run_preprocess("--input_path", tmp_path / "b.jsonl", "--output_prefix", tmp_path / "o",
                          "--tokenizer", tok_dir) == 0
    assert f"replacing {tmp_path / 'o'}.bin/.idx, made from other inputs or settings" in capsys.readouterr().err
    assert run_preprocess("--input_path", tmp_path / "b.jsonl", "--output_prefix", tmp_path / "o",
                          "--tokenizer", other) == 0
    assert f"replacing {tmp_path / 'o'}.bin/.idx, made from another tokenizer" in capsys.readouterr().err
