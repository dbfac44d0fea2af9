"""Counts in English (`pretrain_cli.counts`): a count of one is said in the singular wherever a command states a
count with its noun (the new-user walk met `1 token files`, `from 1 files` and `(1 batches of 8)`)."""
from __future__ import annotations

import numpy as np

from data_helpers import write_mmidx_reference
from pretrain_cli import cli
from pretrain_cli.counts import count, plural
from pretrain_cli.data.inspect import describe_step


def test_count_says_one_in_the_singular_and_the_rest_in_the_plural():
    assert [count(1, "token file"), count(3, "token file"), count(0, "file")] == \
        ["1 token file", "3 token files", "0 files"]
    assert [count(1, "batch"), count(2, "batch"), count(2, "process"), count(2, "box"), count(2, "GPU")] == \
        ["1 batch", "2 batches", "2 processes", "2 boxes", "2 GPUs"]
    assert count(2496, "window", grouped=True) == "2,496 windows" and plural("data rank") == "data ranks"


def test_merge_data_and_inspect_data_of_one_file_say_one(tmp_path, capsys):
    (tmp_path / "d").mkdir()
    write_mmidx_reference(str(tmp_path / "d" / "a"), [[1, 2, 3, 4]])
    assert cli.main(["inspect-data", str(tmp_path / "d")]) == 0
    out = capsys.readouterr().out
    assert f"{tmp_path / 'd'}: 1 token file, 1 document, 4 tokens" in out, out
    assert "note: 1 file has no .json sidecar" in out and "its tokenizer is unknown" in out, out
    assert cli.main(["merge-data", str(tmp_path / "m" / "joined"), str(tmp_path / "d" / "a")]) == 0
    out = capsys.readouterr()
    assert "from 1 file: 1 document, 4 tokens" in out.out + out.err, out


def test_a_step_after_one_skipped_batch_says_batch():
    class Dataset:  # four windows of two tokens: what `micro_batch` reads
        def __len__(self):
            return 4

        def __getitem__(self, i):
            return {"input_ids": np.array([i, i + 1], np.int64), "labels": np.array([i + 1, i + 2], np.int64)}

    first = describe_step(Dataset(), 1, 1, 1, 1, skipped_batches=[0])[0]
    assert first.endswith("(micro_bs 1 x 1 data rank x acc 1; after 1 skipped batch)"), first


def test_first_few_names_three_and_counts_the_rest():
    from pretrain_cli.counts import first_few

    assert first_few([]) == ""
    assert first_few(["a"]) == "a"
    assert first_few(["a", "b", "c"]) == "a, b, c"
    assert first_few(["a", "b", "c", "d", "e"]) == "a, b, c and 2 more"
    assert first_few(["a", "b", "c"], shown=1) == "a and 2 more"
