"""What train-tokenizer says while it reads and merges, and --max_doc_num's sample: a .txt corpus's bar was sized by
lines (a document is a paragraph) and stopped at 9 %, a log got nothing for minutes, and the merges were silent."""
from __future__ import annotations

import argparse
import gzip
import lzma
import sys

import pytest

from data_helpers import make_texts, write_jsonl
from pretrain_cli.commands import train_tokenizer as cmd
from pretrain_cli.data import readers, tokenizer_training
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


def test_the_reading_bar_counts_bytes_on_disk_against_the_files_sizes(tmp_path, monkeypatch):
    """On a terminal: the bar's total is the files' sizes on disk, known without decompressing anything (a full
    decompression of every compressed file came first: minutes, silent, for large .xz/.zst), and it ends full."""
    (tmp_path / "c").mkdir()
    size = _paragraphs(tmp_path / "c" / "a.txt", 30, 1)
    raw = "\n\n".join(make_texts(400, seed=2)).encode()
    (tmp_path / "c" / "b.txt.gz").write_bytes(gzip.compress(raw))
    (tmp_path / "c" / "d.txt.xz").write_bytes(lzma.compress(raw))
    packed = (tmp_path / "c" / "b.txt.gz").stat().st_size + (tmp_path / "c" / "d.txt.xz").stat().st_size
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    reader = DocumentReader([tmp_path / "c"])

    def no_decompression(*a, **k):
        raise AssertionError("decompressed to size the bar")

    with monkeypatch.context() as m:
        m.setattr(readers, "open_binary", no_decompression)
        progress = tokenizer_training._Progress(reader, None, 300)
    assert (progress.unit, progress.total) == ("B", size + packed)
    seen = []
    for _ in progress.texts():
        seen.append(reader.on_disk)
    assert len(seen) == 830 == reader.documents and seen == sorted(seen) and 0 < seen[0] < size
    assert progress.bar.n == progress.bar.total == size + packed  # a line count said 30 * 3 + 800 lines


def test_a_parquet_and_text_mix_is_counted_in_bytes_and_ends_full(tmp_path, monkeypatch):
    """A Parquet file beside .txt files was counted in records: rows, and lines for the text, whose documents are
    paragraphs (the bar stopped at 9 %). Bytes on disk for both now, a Parquet file by the share of rows read."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "c").mkdir()
    size = _paragraphs(tmp_path / "c" / "a.txt", 30, 5)
    pq.write_table(pa.table({"text": make_texts(3000, seed=6)}), tmp_path / "c" / "b.parquet", row_group_size=1000)
    total = size + (tmp_path / "c" / "b.parquet").stat().st_size
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    reader = DocumentReader([tmp_path / "c"])
    progress = tokenizer_training._Progress(reader, None, 300)
    assert (progress.unit, progress.total) == ("B", total)
    seen = [reader.on_disk for _ in progress.texts()]
    assert seen == sorted(seen) and size < seen[-1] < total  # within the Parquet file by its rows, batch by batch
    assert progress.bar.n == progress.bar.total == total


def test_the_merges_get_a_still_merging_line_every_progress_every_seconds(tmp_path, capsys):
    """The trainer says nothing while it merges; in a log a line every PROGRESS_EVERY (30) s says it still works
    (driven by a fake clock: nothing before reading ends, nothing between the lines)."""
    _paragraphs(tmp_path / "a.txt", 3, 7)
    now = [100.0]
    progress = tokenizer_training._Progress(DocumentReader([tmp_path / "a.txt"]), None, 300, clock=lambda: now[0])
    progress.waiting(0)  # still reading: no merging line
    assert capsys.readouterr().err == ""
    assert sum(1 for _ in progress.texts()) == 3
    assert capsys.readouterr().err.startswith("train-tokenizer: read 3 documents (")
    for t in (110.0, 129.9, 130.0, 131.0, 159.9, 160.0, 3700.0):
        now[0] = t
        progress.waiting(t - 100)
    progress.end()
    assert capsys.readouterr().err.splitlines() == ["train-tokenizer: merging, 0:30 elapsed",
                                                    "train-tokenizer: merging, 1:00 elapsed",
                                                    "train-tokenizer: merging, 1:00:00 elapsed"]


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


def test_max_doc_num_trains_on_a_sample_and_says_how_far_into_the_files_it_reached(tmp_path, capsys):
    """The first N documents in file order: the summary says from how many of the files they came."""
    (tmp_path / "c").mkdir()
    for i in range(3):
        write_jsonl(tmp_path / "c" / f"{i}.jsonl", make_texts(40, seed=4 + i))
    assert _train(["--input_path", tmp_path / "c", "--output_dir", tmp_path / "tok", "--vocab_size", 300,
                   "--max_doc_num", 50]) == 0
    out = capsys.readouterr()
    assert "train-tokenizer: 50 documents (the first, from 2 of 3 files) -> " in out.out
    assert "train-tokenizer: read 50 documents (" in out.err
    assert load_tokenizer(tmp_path / "tok").vocab_size == 300
    with pytest.raises(UserError, match=r"^--max_doc_num: must be >= 1, got 0$"):
        _train(["--input_path", tmp_path / "a.jsonl", "--output_dir", tmp_path / "t0", "--vocab_size", 300,
                "--max_doc_num", 0])


def test_a_max_doc_num_past_the_corpus_ends_the_bar_full(tmp_path, monkeypatch):
    """The bar of a --max_doc_num sample counts documents to N; a corpus with fewer ends it at what was read."""
    write_jsonl(tmp_path / "a.jsonl", make_texts(30, seed=9))
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    reader = DocumentReader([tmp_path / "a.jsonl"], max_docs=1000)
    progress = tokenizer_training._Progress(reader, 1000, 300)
    assert sum(1 for _ in progress.texts()) == 30
    assert progress.bar.n == progress.bar.total == 30 == progress.total
