"""What train-tokenizer says while it reads and merges, and --max_doc_num's sample: a .txt corpus's bar was sized by
lines (a document is a paragraph) and stopped at 9 %, a log got nothing for minutes, and the merges were silent."""
from __future__ import annotations

import argparse
import gzip
import sys

import pytest

from data_helpers import make_texts, write_jsonl
from pretrain_cli.commands import train_tokenizer as cmd
from pretrain_cli.data import tokenizer_training
from pretrain_cli.data.documents import DocumentReader
from pretrain_cli.data.tokenizer import load_tokenizer
from pretrain_cli.errors import UserError


def _train(argv):
    p = argparse.ArgumentParser()
    cmd.add_arguments(p)
    return cmd.main(p.parse_args([str(a) for a in argv]))


def _paragraphs(path, n: int, seed: int) -> int:
    """A .txt of `n` three-line paragraphs (documents): three lines each, which a line count took for documents."""
    texts = make_texts(3 * n, seed=seed)
    path.write_text("\n\n".join("\n".join(texts[3 * i : 3 * i + 3]) for i in range(n)) + "\n")
    return path.stat().st_size


def test_the_reading_bar_counts_bytes_against_the_files_sizes(tmp_path, monkeypatch):
    """On a terminal: the bar's total is the files' bytes (decompressed, for .gz) and it ends full."""
    (tmp_path / "c").mkdir()
    size = _paragraphs(tmp_path / "c" / "a.txt", 30, 1)
    raw = "\n\n".join(make_texts(20, seed=2)).encode()
    (tmp_path / "c" / "b.txt.gz").write_bytes(gzip.compress(raw))
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    reader = DocumentReader([tmp_path / "c"])
    progress = tokenizer_training._Progress(reader, None, 300)
    assert (progress.unit, progress.total) == ("B", size + len(raw))
    assert sum(1 for _ in progress.texts()) == 50 == reader.documents
    assert progress.bar.n == progress.bar.total == size + len(raw)  # a line count said 30 * 3 + 20 lines


def test_a_log_gets_progress_lines_and_the_merges_are_announced(tmp_path, monkeypatch, capsys):
    size = _paragraphs(tmp_path / "a.txt", 40, 3)
    monkeypatch.setattr(tokenizer_training, "PROGRESS_EVERY", 0.0)  # a line after every document
    assert _train(["--input_path", tmp_path / "a.txt", "--output_dir", tmp_path / "tok", "--vocab_size", 300]) == 0
    err = capsys.readouterr().err.splitlines()
    reading = [ln for ln in err if ln.startswith("train-tokenizer: read ") and " of " in ln]
    assert len(reading) >= 39 and reading[-1].startswith(f"train-tokenizer: read {size / 1e6:,.1f} MB of "
                                                         f"{size / 1e6:,.1f} MB (100 %), 40 documents, 0:")
    ended = next(i for i, ln in enumerate(err) if ln.startswith("train-tokenizer: read 40 documents ("))
    assert err[ended].startswith(f"train-tokenizer: read 40 documents ({size / 1e6:,.1f} MB) in 0:")
    assert err[ended].endswith("; training BPE on them (vocab 300): the trainer reports no progress while it merges; "
                               "a line every 0 s says it is still merging")
    assert all(ln.startswith("train-tokenizer: merging, ") for ln in err[ended + 1 :]), err[ended + 1 :]


def test_max_doc_num_trains_on_a_sample(tmp_path, capsys):
    write_jsonl(tmp_path / "a.jsonl", make_texts(200, seed=4))
    assert _train(["--input_path", tmp_path / "a.jsonl", "--output_dir", tmp_path / "tok", "--vocab_size", 300,
                   "--max_doc_num", 50]) == 0
    out = capsys.readouterr()
    assert "train-tokenizer: 50 documents -> " in out.out and "train-tokenizer: read 50 documents (" in out.err
    assert load_tokenizer(tmp_path / "tok").vocab_size == 300
    with pytest.raises(UserError, match=r"^--max_doc_num: must be >= 1, got 0$"):
        _train(["--input_path", tmp_path / "a.jsonl", "--output_dir", tmp_path / "t0", "--vocab_size", 300,
                "--max_doc_num", 0])
