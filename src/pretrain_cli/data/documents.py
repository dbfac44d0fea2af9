"""Reading a corpus: jsonl/json/txt files and directories -> a stream of document texts.

Shared by `preprocess` and `train-tokenizer`, so both read the same documents and name a
bad line by file and line number the same way. `.txt` files hold one document per
blank-line-separated paragraph.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

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
