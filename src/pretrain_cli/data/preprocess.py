"""`pretrain-cli preprocess`: documents (jsonl/json/txt) -> `<prefix>.bin/.idx` + `<prefix>.json`.

Reading stays in the parent process (so a bad line names its file and line number);
tokenization runs in a worker pool fed through a bounded window of batches, because
`Pool.imap` drains its input eagerly and would hold the whole corpus in memory.
`.txt` files hold one document per blank-line-separated paragraph.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

from pretrain_cli.data.indexed import SIDECAR_FORMAT, IndexedDatasetWriter, dtype_for_vocab, strip_prefix, write_json_atomic
from pretrain_cli.errors import UserError

SUFFIXES = (".jsonl", ".json", ".txt")
BATCH_DOCS, BATCH_BYTES = 256, 1 << 20
_REPORTED_BAD_LINES = 10


def list_input_files(paths) -> tuple[list[Path], list[Path]]:
    """(files we read, files we skip). Directories are walked recursively in sorted order."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    files, skipped = [], []
    for p in map(Path, paths):
        if p.is_dir():
            cands = sorted(q for q in p.rglob("*") if q.is_file())
        elif p.is_file():
            cands = [p]
        else:
            raise UserError(f"{p}: input path not found; pass an existing file or directory to --input_path")
        for q in cands:
            (files if q.suffix in SUFFIXES else skipped).append(q)
    if not files:
        raise UserError(f"--input_path: no .jsonl/.json/.txt files in {' '.join(map(str, paths))}; "
                        "convert the corpus to jsonl (one {\"text\": ...} object per line)")
    return files, skipped


def count_documents(paths) -> int:
    """Line count of all inputs: an upper bound on documents, cheap enough for a progress bar."""
    n = 0
    for f in list_input_files(paths)[0]:
        with open(f, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 24), b""):
                n += block.count(b"\n")
    return n


class DocumentReader:
    """Streams document texts; counts documents, empty ones, skipped bad lines and bytes."""

    def __init__(self, paths, json_key: str = "text", skip_bad_lines: bool = False, max_docs: int | None = None):
        self.files, self.skipped_files = list_input_files(paths)
        self.json_key, self.skip_bad_lines, self.max_docs = json_key, skip_bad_lines, max_docs
        self.documents = self.empty = self.bad_lines = self.bytes = 0

    def _bad(self, where: str, problem: str, fix: str) -> None:
        if not self.skip_bad_lines:
            raise UserError(f"{where}: {problem}; {fix} or pass --skip_bad_lines")
        self.bad_lines += 1
        if self.bad_lines <= _REPORTED_BAD_LINES:  # never silent: name the first few, count all
            more = " (further skipped lines are only counted)" if self.bad_lines == _REPORTED_BAD_LINES else ""
            print(f"warning: skipped {where}: {problem}{more}", file=sys.stderr)

    def _jsonl(self, path: Path):
        with open(path, encoding="utf-8", errors="strict") as f:
            for lineno, line in enumerate(f, 1):
                self.bytes += len(line)
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                except ValueError as e:
                    self._bad(f"{path}:{lineno}", f"not valid JSON ({getattr(e, 'msg', e)})", "fix it")
                    continue
                text = obj.get(self.json_key) if isinstance(obj, dict) else None
                if not isinstance(text, str):
                    self._bad(f"{path}:{lineno}", f"no string field {self.json_key!r}", "fix it, pass --json_key KEY")
                    continue
                yield text

    def _txt(self, path: Path):
        para: list[str] = []
        with open(path, encoding="utf-8") as f:
            for line in f:
                self.bytes += len(line)
                if line.strip():
                    para.append(line)
                elif para:
                    yield "".join(para).rstrip("\n")
                    para = []
        if para:
            yield "".join(para).rstrip("\n")

    def __iter__(self):
        for path in self.files:
            gen = self._txt(path) if path.suffix == ".txt" else self._jsonl(path)
            try:
                for text in gen:
                    if not text.strip():
                        self.empty += 1
                        continue
                    if self.max_docs is not None and self.documents >= self.max_docs:
                        return
                    self.documents += 1
                    yield text
            except UnicodeDecodeError as e:
                raise UserError(f"{path}: not UTF-8 ({e.reason} at byte {e.start}); re-encode the file as UTF-8") from None


def batches(texts, max_docs: int = BATCH_DOCS, max_bytes: int = BATCH_BYTES):
    batch, size = [], 0
    for t in texts:
        batch.append(t)
        size += len(t)
        if len(batch) >= max_docs or size >= max_bytes:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


_WORKER: dict = {}


def _init_worker(tokenizer_dir: str, dtype: str, eos: int | None) -> None:
    from pretrain_cli.tokenizer import load_tokenizer

    _WORKER.update(tok=load_tokenizer(tokenizer_dir), dtype=np.dtype(dtype), eos=eos)


def _encode(texts: list[str]):
    """-> (flat tokens, lengths int64 [docs], max id); documents that tokenize to nothing are dropped."""
    ids = _WORKER["tok"].encode_batch(texts)
    eos = _WORKER["eos"]
    if eos is not None:
        ids = [x + [eos] if x else x for x in ids]
    lengths = np.fromiter((len(x) for x in ids), np.int64, len(ids))
    flat = np.fromiter((t for x in ids for t in x), np.int64, int(lengths.sum()))
    max_id = int(flat.max()) if flat.size else -1
    return flat.astype(_WORKER["dtype"]), lengths[lengths > 0], max_id, int((lengths == 0).sum())


def _results(ns, texts, dtype, eos):
    """Yield worker results in input order, keeping at most a few batches in flight."""
    if ns.workers <= 1:
        _init_worker(ns.tokenizer, dtype.str, eos)
        for b in batches(texts):
            yield _encode(b)
        return
    import multiprocessing as mp

    with mp.get_context("fork").Pool(ns.workers, _init_worker, (ns.tokenizer, dtype.str, eos)) as pool:
        window = collections.deque()
        for b in batches(texts):
            window.append(pool.apply_async(_encode, (b,)))
            if len(window) >= 2 * ns.workers + 2:
                yield window.popleft().get()
        while window:
            yield window.popleft().get()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--input_path", nargs="+", required=True, help=".jsonl/.json/.txt file(s) or directories")
    parser.add_argument("--output_prefix", required=True, help="writes PREFIX.bin, PREFIX.idx, PREFIX.json")
    parser.add_argument("--tokenizer", required=True, help="tokenizer directory (tokenizer.json)")
    parser.add_argument("--json_key", default="text")
    parser.add_argument("--append_eos", action="store_true", help="append the tokenizer's EOS to every document")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--log_interval", type=int, default=10000, help="documents between progress lines")
    parser.add_argument("--max_doc_num", type=int, default=None)
    parser.add_argument("--skip_bad_lines", action="store_true", help="skip and count bad lines (default: fatal)")


def main(ns: argparse.Namespace) -> int:
    from pretrain_cli.tokenizer import load_tokenizer

    tok = load_tokenizer(ns.tokenizer)
    eos = None
    if ns.append_eos:
        eos = tok.eos_token_id
        if eos is None:
            raise UserError(f"{ns.tokenizer}: no EOS token (tokenizer_config.json eos_token); set one or drop --append_eos")
    prefix = strip_prefix(ns.output_prefix)
    reader = DocumentReader(ns.input_path, ns.json_key, ns.skip_bad_lines, ns.max_doc_num)
    outputs = {os.path.abspath(prefix + ext) for ext in (".bin", ".idx", ".json")}
    clash = [str(f) for f in reader.files if os.path.abspath(f) in outputs]
    if clash:
        raise UserError(f"--output_prefix: {prefix} would overwrite the input {clash[0]}; choose another prefix")
    dtype = dtype_for_vocab(tok.vocab_size)
    t0 = time.perf_counter()
    docs = tokens = max_id = empty_after = 0
    next_log = ns.log_interval
    with IndexedDatasetWriter(prefix, dtype) as writer:
        for flat, lengths, batch_max, n_empty in _results(ns, reader, dtype, eos):
            if batch_max >= tok.vocab_size:
                raise UserError(f"{ns.tokenizer}: produced token id {batch_max} >= vocab size {tok.vocab_size}; "
                                "the tokenizer files are inconsistent, re-create them")
            writer.add_documents(flat, lengths)
            docs, tokens = docs + lengths.size, tokens + int(flat.size)
            max_id, empty_after = max(max_id, batch_max), empty_after + n_empty
            if ns.log_interval and docs >= next_log:
                next_log = docs + ns.log_interval
                el = time.perf_counter() - t0
                print(f"preprocess: {docs} docs, {docs / el:.0f} docs/s, {tokens / el:.0f} tokens/s, "
                      f"{reader.bytes / el / 1e6:.1f} MB/s", file=sys.stderr, flush=True)
        if docs == 0:
            writer.abort()
            raise UserError(f"--input_path: no non-empty documents in {' '.join(map(str, ns.input_path))}; "
                            f"check the files and --json_key ({ns.json_key!r})")
        writer.finalize()
    el = time.perf_counter() - t0
    meta = {
        "format": SIDECAR_FORMAT, "documents": docs, "tokens": tokens, "max_token_id": max_id,
        "dtype": dtype.name, "vocab_size": tok.vocab_size, "tokenizer": str(ns.tokenizer),
        "tokenizer_sha256": tok.sha256, "eos_appended": bool(ns.append_eos), "eos_token_id": eos,
        "json_key": ns.json_key, "input_files": len(reader.files), "skipped_bad_lines": reader.bad_lines,
        "skipped_empty_documents": reader.empty + empty_after,
    }
    write_json_atomic(prefix + ".json", meta)
    for f in reader.skipped_files[:5]:
        print(f"preprocess: skipped {f} (not .jsonl/.json/.txt)", file=sys.stderr)
    print(f"preprocess: wrote {prefix}.bin/.idx: {docs} documents, {tokens} tokens ({dtype.name}), "
          f"max id {max_id}, {reader.empty + empty_after} empty skipped, {reader.bad_lines} bad lines skipped, "
          f"{el:.1f}s ({tokens / max(el, 1e-9):.0f} tokens/s, {reader.bytes / max(el, 1e-9) / 1e6:.1f} MB/s)")
    return 0
