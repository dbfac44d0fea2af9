"""Reading a corpus: files, directories and glob patterns -> a stream of document texts.

Shared by `preprocess` and `train-tokenizer`, so both read the same documents and name a bad
line by file and line number the same way. The per-format readers are in `data/readers.py`;
this module decides which files are read, in which order (sorted, so outputs are reproducible),
and whether a problem is fatal or skipped and counted (`--skip_bad_lines`).
"""
from __future__ import annotations

import glob
import json
import os
from pathlib import Path

from pretrain_cli.data.indexed import SIDECAR_FORMAT
from pretrain_cli.data.readers import LONG_PARAGRAPH_LINES, PARAGRAPH_BYTES, FileReader, count_records, kind
from pretrain_cli.data.tasks import PROGRESS_FORMAT
from pretrain_cli.errors import UserError

BATCH_DOCS, BATCH_BYTES = 256, 1 << 20
_REPORTED_BAD_LINES = 10
_RECORD_BYTES = 1 << 20  # a sidecar or progress record is far smaller; larger .json files are not parsed twice
INPUTS = ".jsonl/.json/.txt (plain, .gz, .zst, .bz2, .xz) or .parquet"
_NAMED_LONG_PARAGRAPHS = 3  # .txt files whose long paragraph is named as it is read; a 4th says further ones are not
_TXT_RULE = ("a .txt file's documents are separated by blank lines, not by line ends; if each line is a document, put "
             "a blank line between documents or write them as .jsonl (one {\"text\": ...} object per line)")


def _expand(arg: str) -> tuple[list[Path], bool]:
    """(candidate files, found by walking or globbing) for one --input_path value."""
    p = Path(arg)
    if p.is_dir():
        return sorted(q for q in p.rglob("*") if q.is_file()), True
    if p.is_file():
        return [p], False
    if glob.has_magic(arg):
        hits = sorted(Path(q) for q in glob.glob(arg, recursive=True))
        if not hits:
            raise UserError(f"{arg}: no files match this pattern; check it (quote it so the shell passes it as is)")
        files = []
        for q in hits:
            files.extend(sorted(r for r in q.rglob("*") if r.is_file()) if q.is_dir() else [q])
        return files, True
    raise UserError(f"{p}: input path not found; pass an existing file, directory or glob pattern to --input_path")


def token_file_record(path: Path) -> bool:
    """A `.json` that a token file or a preprocess task wrote (`<prefix>.json` beside its `.idx`/`_idx.npz`, or any
    file carrying our sidecar's or progress record's format marker): statistics, never a corpus. Another job's
    outputs in the input directory would otherwise be read as documents (and fail as bad JSON lines)."""
    if path.suffix.lower() != ".json":
        return False
    stem = str(path)[: -len(".json")]
    if os.path.exists(stem + ".idx") or os.path.exists(stem + "_idx.npz"):
        return True
    try:
        if path.stat().st_size > _RECORD_BYTES:
            return False
        with open(path, encoding="utf-8") as f:
            obj = json.load(f)
    except (OSError, ValueError):
        return False
    return isinstance(obj, dict) and obj.get("format") in (SIDECAR_FORMAT, PROGRESS_FORMAT)


def list_input_files(paths, exclude=None, note=None) -> tuple[list[Path], list[Path]]:
    """(files we read, files we skip), in a stable order: the --input_path values in the order given,
    each directory walked recursively and each glob expanded in sorted path order; a file listed twice
    (or reached again through a symbolic link) is read once. `exclude(path)` drops files found by walking or
    globbing (our own outputs); token files' `.json` records are skipped, each said to `note`."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    files, skipped, seen = [], [], set()
    for arg in map(str, paths):
        cands, found = _expand(arg)
        for q in cands:
            key = os.path.realpath(q)
            if key in seen or (found and exclude is not None and exclude(q)):
                continue
            seen.add(key)
            if kind(q) and token_file_record(q):
                if note is not None:
                    note(f"note: skipped {q}: the statistics of a token file (or a preprocess task's progress), "
                         "not a corpus")
                continue
            (files if kind(q) else skipped).append(q)
    if not files:
        raise UserError(f"--input_path: no {INPUTS} files in {' '.join(map(str, paths))}; "
                        "convert the corpus to jsonl (one {\"text\": ...} object per line)")
    return files, skipped


def count_documents(paths) -> int:
    """Line (or Parquet row) count of all inputs: an upper bound on documents, for a progress bar."""
    return sum(count_records(f) for f in list_input_files(paths)[0])


class DocumentReader:
    """Streams document texts file by file; counts documents, empty ones, skipped bad lines, corrupt parts (a
    compressed file's unreadable tail, a Parquet row group) and .txt paragraphs past `PARAGRAPH_BYTES` (with their
    lines and bytes: one such paragraph may be a whole file, not one bad line) and decompressed bytes."""

    def __init__(self, paths, json_key: str = "text", skip_bad_lines: bool = False, max_docs: int | None = None,
                 files=None, exclude=None, note=None):
        """`note(line)`: where the warning for each of the first skipped lines goes (the command's stderr)."""
        self.note = note or (lambda line: None)
        self.files, self.skipped_files = ((files, []) if files is not None
                                          else list_input_files(paths, exclude, self.note))
        self.json_key, self.skip_bad_lines, self.max_docs = json_key, skip_bad_lines, max_docs
        self.documents = self.empty = self.bad_lines = self.bad_parts = self.bytes = 0
        self.dropped_paragraphs = self.dropped_paragraph_lines = self.dropped_paragraph_bytes = 0
        self._disk_done, self._current = 0, None  # the finished files' bytes on disk; the file being read
        self.files_read = 0  # files opened by `read` (--max_doc_num stops before the rest)
        self.long_paragraph_files = 0  # .txt files with a paragraph of LONG_PARAGRAPH_LINES lines (`paragraph_note`)

    _COUNTERS = ("documents", "empty", "bad_lines", "bad_parts", "bytes", "long_paragraph_files",
                 "dropped_paragraphs", "dropped_paragraph_lines", "dropped_paragraph_bytes")

    def counters(self) -> dict:
        """What a resumed preprocess restores: the notes and warnings go on counting from where the files read left
        them (a fourth long-paragraph file is counted as the fourth, not named as the first)."""
        return {k: getattr(self, k) for k in self._COUNTERS}

    def restore(self, counters: dict) -> None:
        for k in self._COUNTERS:
            setattr(self, k, int(counters.get(k, 0)))

    def _bad(self, where: str, problem: str, fix: str, part: bool = False) -> None:
        if not self.skip_bad_lines:
            raise UserError(f"{where}: {problem}; {fix} or pass --skip_bad_lines")
        if part:
            self.bad_parts += 1
        else:
            self.bad_lines += 1
        self._warn(where, problem)

    def _warn(self, where: str, problem: str) -> None:
        n = self.bad_lines + self.bad_parts + self.dropped_paragraphs
        if n <= _REPORTED_BAD_LINES:  # never silent: name the first few, count all
            more = " (further skipped lines are only counted)" if n == _REPORTED_BAD_LINES else ""
            self.note(f"warning: skipped {where}: {problem}{more}")

    def _oversized(self, where: str, size: tuple[int, int] | None) -> None:
        """A .txt paragraph past PARAGRAPH_BYTES: an error as it passes the bound; skipped, counted with its lines and
        bytes where it ends (said then, with its size)."""
        bound = f"{PARAGRAPH_BYTES >> 20} MiB"
        if size is None:
            if not self.skip_bad_lines:
                raise UserError(f"{where}: a paragraph (one document) of more than {bound} with no blank line; put "
                                f"blank lines between documents (or write them as .jsonl) or pass --skip_bad_lines")
            return
        self.dropped_paragraphs += 1
        self.dropped_paragraph_lines += size[0]
        self.dropped_paragraph_bytes += size[1]
        self._warn(where, f"a paragraph (one document) of {size[0]:,} lines / {size[1] / 1e6:,.1f} MB with no blank "
                          f"line, past the {bound} bound")

    def dropped_note(self) -> str:
        """The summary's words for the dropped paragraphs ('' if none): '1 paragraph of 645,000 lines / 70.0 MB'."""
        n = self.dropped_paragraphs
        if not n:
            return ""
        return (f"{n:,} paragraph{'s' if n != 1 else ''} of {self.dropped_paragraph_lines:,} lines / "
                f"{self.dropped_paragraph_bytes / 1e6:,.1f} MB")

    def _long_paragraph(self, where: str) -> None:
        """A .txt file's paragraph reached LONG_PARAGRAPH_LINES lines: said now, while it is read, not after the run
        (where a corpus of one document a line, held as one document, may never get: its memory grows with it)."""
        self.long_paragraph_files += 1
        n = self.long_paragraph_files
        if n <= _NAMED_LONG_PARAGRAPHS:
            self.note(f"note: {where}: a paragraph of {LONG_PARAGRAPH_LINES:,} lines and more with no blank line, one "
                      f"document: {_TXT_RULE}")
        elif n == _NAMED_LONG_PARAGRAPHS + 1:
            self.note(f"note: {where}: also a paragraph of {LONG_PARAGRAPH_LINES:,} lines and more with no blank line "
                      f"(any further such files are not named)")

    @property
    def on_disk(self) -> int:
        """Bytes of the input files on disk read so far (compressed bytes for a compressed file): a bar's position
        against the files' sizes, which, unlike the decompressed total, are known without reading them."""
        return self._disk_done + (self._current.on_disk() if self._current is not None else 0)

    def read(self, path: Path):
        """The non-empty documents of one file (until max_docs)."""
        fr = self._current = FileReader(path, self.json_key, self._bad, self._oversized, self._long_paragraph)
        self.files_read += 1
        counted = 0
        try:
            for text in fr:
                self.bytes += fr.bytes - counted
                counted = fr.bytes
                if not text.strip():
                    self.empty += 1
                    continue
                if self.max_docs is not None and self.documents >= self.max_docs:
                    return
                self.documents += 1
                yield text
        finally:
            self.bytes += fr.bytes - counted
            self._current = None
            try:
                self._disk_done += Path(path).stat().st_size  # (a skipped corrupt tail, too: the file is done)
            except OSError:
                pass

    @property
    def exhausted(self) -> bool:
        return self.max_docs is not None and self.documents >= self.max_docs

    def __iter__(self):
        for path in self.files:
            if self.exhausted:
                return
            yield from self.read(path)


def paragraph_note(reader: DocumentReader) -> str | None:
    """preprocess's line after its summary where more .txt files held a paragraph of LONG_PARAGRAPH_LINES lines than
    were named as they were read (`DocumentReader._long_paragraph`): their count. PaddleNLP's preprocessing reads
    only .jsonl (and .zst) files, so there is no one-line-a-document mode to match: the notes name the two ways the
    files can say where documents end."""
    n = reader.long_paragraph_files
    if n <= _NAMED_LONG_PARAGRAPHS + 1:
        return None
    return (f"note: {n} .txt files held a paragraph of {LONG_PARAGRAPH_LINES:,} lines and more (the first "
            f"{_NAMED_LONG_PARAGRAPHS + 1} named above): {_TXT_RULE}")


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
