"""merge-data takes its output prefix's lock, as preprocess does: both write through the same in-progress names
(`.bin.tmp`, `.sizes.tmp`, `.docs.tmp`), so a merge and a preprocess (or two merges) into one prefix would publish
a pair neither wrote whole."""
from __future__ import annotations

import os

import pytest

from data_helpers import make_texts, make_tokenizer, preprocess_held, tree, write_jsonl
from pretrain_cli import cli
from pretrain_cli.data.merge import merge
from pretrain_cli.data.prefix_lock import PrefixLock
from pretrain_cli.data.preprocess import Job, preprocess
from pretrain_cli.errors import UserError


@pytest.fixture(scope="module")
def parts(tmp_path_factory):
    """Two token files to merge, made with one tokenizer."""
    d = tmp_path_factory.mktemp("parts")
    tok = make_tokenizer(d / "tok")
    for k, name in enumerate(("a", "b")):
        src = write_jsonl(d / f"{name}.jsonl", make_texts(40, seed=20 + k))
        assert preprocess(Job((str(src),), str(d / "in" / name), str(tok), append_eos=True)) == 0
    return d, tok


def test_a_merge_into_a_prefix_a_preprocess_is_writing_is_refused_and_touches_nothing(tmp_path, parts, capsys):
    d, tok = parts
    src = write_jsonl(tmp_path / "c.jsonl", make_texts(100, seed=7))
    out = tmp_path / "out"
    with preprocess_held(src, out / "r", tok) as before:
        assert "r.bin.tmp" in [n for n, _, _ in before] and "r.lock" in [n for n, _, _ in before]
        capsys.readouterr()
        assert cli.main(["merge-data", str(out / "r"), str(d / "in" / "a"), str(d / "in" / "b")]) == 2
        captured = capsys.readouterr()
        assert captured.out == ""
        assert captured.err == (f"error: {out / 'r'} is being written by another preprocess (pid {os.getpid()}); "
                                "wait for it or choose another output prefix\n")
        assert tree(out) == before  # nothing touched
    assert sorted(p.name for p in out.iterdir()) == ["r.bin", "r.idx", "r.json"]  # the preprocess finished intact


def test_a_preprocess_into_a_prefix_a_merge_holds_is_told_it_is_a_merge(tmp_path, parts):
    """The refusal names the holder's command: a preprocess refused by a merge's lock is not told of a preprocess."""
    d, tok = parts
    src = write_jsonl(tmp_path / "c.jsonl", make_texts(10, seed=3))
    lock = PrefixLock(str(tmp_path / "m"), "output prefix", "merge-data")  # what merge() takes
    try:
        with pytest.raises(UserError, match=r"is being written by another merge-data \(pid \d+\); wait for it or "
                                            r"choose another --output_prefix$"):
            preprocess(Job((str(src),), str(tmp_path / "m"), str(tok)))
        with pytest.raises(UserError, match="another merge-data"):  # and two merges
            merge(str(tmp_path / "m"), [str(d / "in" / "a")])
    finally:
        lock.release()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.jsonl"]


def test_a_merge_releases_its_lock(tmp_path, parts):
    """Taken and released: the lock file goes with the merge, and the next writer gets the prefix."""
    d, tok = parts
    merge(str(tmp_path / "m"), [str(d / "in" / "a"), str(d / "in" / "b")])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.bin", "m.idx", "m.json"]
    src = write_jsonl(tmp_path / "c.jsonl", make_texts(10, seed=5))
    assert preprocess(Job((str(src),), str(tmp_path / "in" / "c"), str(tok))) == 0  # no EOS: refused by the merge
    out = tmp_path / "new" / "deeper" / "n"  # directories the lock makes
    with pytest.raises(UserError, match="made without --append_eos"):  # a merge failing once it holds the lock
        merge(str(out), [str(d / "in" / "a"), str(tmp_path / "in" / "c")])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.jsonl", "in", "m.bin", "m.idx", "m.json"]  # no new/
    PrefixLock(str(out)).release()  # not held either
