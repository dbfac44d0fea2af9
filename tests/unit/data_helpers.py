"""Tiny corpora and tokenizers built in tmp dirs (no downloads), shared by the data tests."""
from __future__ import annotations

import contextlib
import json
import struct
import threading
from pathlib import Path

import numpy as np

WORDS = ("alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho "
         "sigma tau upsilon phi chi psi omega the quick brown fox jumps over lazy dog").split()


def make_texts(n: int, seed: int = 0, min_words: int = 3, max_words: int = 40) -> list[str]:
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, size=int(rng.integers(min_words, max_words)))) + "." for _ in range(n)]


def write_jsonl(path: Path, texts, key: str = "text") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for t in texts:
            f.write(json.dumps({key: t}) + "\n")
    return path


def make_tokenizer(directory: Path, texts=None, vocab_size: int = 300) -> Path:
    """Train and save a tiny byte-level BPE with the tutorial's special tokens."""
    from pretrain_cli.data.tokenizer import DEFAULT_SPECIALS, Tokenizer, _roles_for
    from pretrain_cli.data.tokenizer_training import train_bpe

    tok = train_bpe(texts or make_texts(200), vocab_size, DEFAULT_SPECIALS, min_frequency=1)
    Tokenizer(tok, str(directory), _roles_for(DEFAULT_SPECIALS), "").save(directory)
    return directory


def write_mmidx_reference(prefix: str, docs, dtype=np.uint16) -> None:
    """An independent numpy implementation of the MMIDIDX layout (ARCHITECTURE.md facts: MMIDIDX v1)."""
    codes = {np.uint8: 1, np.int8: 2, np.int16: 3, np.int32: 4, np.int64: 5, np.uint16: 8}
    dt = np.dtype(dtype)
    sizes = np.array([len(d) for d in docs], "<i4")
    pointers = np.concatenate(([0], np.cumsum(sizes[:-1].astype(np.int64)) * dt.itemsize)).astype("<i8")
    doc_idx = np.arange(len(docs) + 1, dtype="<i8")
    with open(prefix + ".bin", "wb") as f:
        for d in docs:
            f.write(np.asarray(d, dt.newbyteorder("<")).tobytes())
    with open(prefix + ".idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, codes[dt.type], len(docs), len(docs) + 1))
        f.write(sizes.tobytes() + pointers.tobytes() + doc_idx.tobytes())


def write_tokens(prefix: Path, n_docs: int = 40, doc_len: int = 64, vocab_size: int = 64) -> str:
    """A token file `prefix`.bin/.idx of `n_docs` documents of `doc_len` ids in [3, vocab_size) (what
    `input_dir` names), for tests that prepare a whole run."""
    rng = np.random.default_rng(0)
    write_mmidx_reference(str(prefix), [rng.integers(3, vocab_size, size=doc_len) for _ in range(n_docs)])
    return str(prefix)


def run_preprocess(*argv) -> int:
    """`pretrain-cli preprocess ARGV` in this process, through the command's own argument parser."""
    import argparse

    from pretrain_cli.commands import preprocess

    p = argparse.ArgumentParser()
    preprocess.add_arguments(p)
    return preprocess.main(p.parse_args([str(a) for a in argv]))


@contextlib.contextmanager
def preprocess_held(src: Path, prefix: Path, tok: Path):
    """A preprocess of `src` into `prefix` run in a thread and held at its first progress line (mid-run, holding the
    prefix's lock and its in-progress files) for the block; then let go, and checked to have finished without
    error. Yields the prefix directory's (name, size, mtime) listing as the block began."""
    from pretrain_cli.data.preprocess import Job, preprocess

    started, go, failed = threading.Event(), threading.Event(), []

    def hold(line):
        if " docs/s" in line and not started.is_set():
            started.set()
            go.wait(120)

    def run():
        try:
            preprocess(Job((str(src),), str(prefix), str(tok), append_eos=True, log_interval=10), note=hold)
        except BaseException as e:  # noqa: BLE001 - reported below
            failed.append(e)

    t = threading.Thread(target=run)
    t.start()
    try:
        assert started.wait(120)
        yield tree(prefix.parent)
    finally:
        go.set()
        t.join()
    assert not failed, failed


def tree(d: Path) -> list:
    """`d`'s files as (name, size, mtime_ns): what 'nothing touched' compares."""
    return sorted((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in d.iterdir())
