"""One input file -> its document texts, streamed: JSON lines, text paragraphs and Parquet columns,
plain or compressed (.gz, .zst, .bz2, .xz).

Nothing is decompressed to disk and no file is read whole: compressed files are decoded as a
stream (zstandard, gzip, bz2, lzma) and Parquet is read one row group at a time, in batches,
with only the text column decoded (pyarrow), so memory stays flat however large the file.
Every problem is reported through `bad(where, problem, fix)` with `where` naming the file and
line (or row group and row); the caller decides whether that is fatal or skipped and counted.
"""
from __future__ import annotations

import bz2
import gzip
import io
import json
import lzma
import zlib
from pathlib import Path

from pretrain_cli import json_mistakes
from pretrain_cli.json_mistakes import NESTED

FORMATS = (".jsonl", ".json", ".txt")
COMPRESSIONS = (".gz", ".zst", ".zstd", ".bz2", ".xz")
PARQUET = ".parquet"
_PARQUET_BATCH = 1024  # rows decoded at once: bounds memory even for huge row groups
# a .txt paragraph of this many lines is said as it is read (`FileReader.long_paragraph`): documents written one a
# line with no blank line between them, which would otherwise be held and tokenized as one document unsaid
LONG_PARAGRAPH_LINES = 1000
# a .txt paragraph past this many bytes is bad input: lines run together that far are many documents with no blank
# line between them, not one text. A .txt rule, not a memory bound (a .jsonl line has none; a 62 MB paragraph
# peaked at 1,013 MB RSS, ~16x). PaddleNLP's trans_to_json.py splits .txt at blank lines (--doc_spliter), unbounded
PARAGRAPH_BYTES = 64 << 20


def kind(path: Path) -> tuple[str, str] | None:
    """(format, compression) of a readable file by its name, e.g. ('.jsonl', '.zst'); None: not an input."""
    suffixes = [s.lower() for s in path.suffixes[-2:]]
    if suffixes and suffixes[-1] == PARQUET:
        return PARQUET, ""
    comp = suffixes[-1] if suffixes and suffixes[-1] in COMPRESSIONS else ""
    fmt = path.suffix.lower() if not comp else (suffixes[-2] if len(suffixes) == 2 else "")
    return (fmt, comp) if fmt in FORMATS else None


def _corrupt_errors() -> tuple:
    import zstandard

    return (EOFError, zlib.error, lzma.LZMAError, zstandard.ZstdError)


def _is_corrupt(e: BaseException) -> bool:
    """A decoder's complaint about the data (not the system's: EIO, EACCES keep their OSError)."""
    return isinstance(e, _corrupt_errors()) or (isinstance(e, OSError) and e.errno is None)


def open_binary(path: Path, compression: str, raw=None):
    """A buffered binary stream of the decompressed bytes. `raw`: `path` already opened binary, to read through
    (the caller closes it; its `tell()` says how far into the file on disk reading is)."""
    src = path if raw is None else raw
    if compression == ".gz":
        return gzip.open(src, "rb")
    if compression == ".bz2":
        return bz2.open(src, "rb")
    if compression == ".xz":
        return lzma.open(src, "rb")
    if compression in (".zst", ".zstd"):
        return io.BufferedReader(_ZstdFrames(path, raw), 1 << 20)
    return open(path, "rb", buffering=1 << 20) if raw is None else raw


class _ZstdFrames(io.RawIOBase):
    """zstandard's decompressor frame after frame (files are often concatenated frames), raising ZstdError
    when the data ends inside a frame: zstandard's `stream_reader` returns a silent short read instead."""

    def __init__(self, path: Path, raw=None):
        import zstandard

        self._zstd = zstandard
        self._owned = raw is None  # (a caller's file is the caller's to close)
        self._raw = open(path, "rb") if raw is None else raw
        # a 2 GiB window: The Pile and DCLM were written with long-distance matching
        self._dctx = zstandard.ZstdDecompressor(max_window_size=2**31)
        self._obj, self._fed = self._dctx.decompressobj(), False
        self._buf, self._pos = b"", 0

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        while self._pos >= len(self._buf):
            chunk = self._raw.read(1 << 20)
            if not chunk:
                if self._fed and not self._obj.eof:
                    raise self._zstd.ZstdError("the data ends inside a frame (truncated file)")
                return 0
            self._buf, self._pos = self._feed(chunk), 0
        n = min(len(b), len(self._buf) - self._pos)
        b[:n] = self._buf[self._pos : self._pos + n]
        self._pos += n
        return n

    def _feed(self, data: bytes) -> bytes:
        out = []
        while data:
            if self._obj.eof:
                self._obj = self._dctx.decompressobj()
            self._fed = True
            out.append(self._obj.decompress(data))
            data = self._obj.unused_data if self._obj.eof else b""
        return b"".join(out)

    def close(self) -> None:
        if self._owned:
            self._raw.close()
        super().close()


class FileReader:
    """Texts of one file; `bytes` counts decompressed bytes read (for MB/s), `on_disk()` how far into the file on
    disk reading is (for a bar against the files' sizes, which need no decompression to know)."""

    def __init__(self, path: Path, json_key: str, bad, oversized, long_paragraph=None):
        """`oversized(where, size)`: a .txt paragraph past `PARAGRAPH_BYTES`, told as it passes the bound (`size`
        None: the caller may stop there) and, unless it stopped, where it ends (`size` (lines, bytes): what is
        dropped, which may be a whole file, so not one bad line). `long_paragraph(where)`: told once, of a .txt
        file's first paragraph of `LONG_PARAGRAPH_LINES` lines."""
        self.path, self.json_key, self.bad, self.oversized = path, json_key, bad, oversized
        self.long_paragraph = long_paragraph or (lambda where: None)
        self.format, self.compression = kind(path) or (path.suffix, "")
        self.bytes = 0
        self._raw = None  # the file on disk, while it is read
        self._rows = self._rows_read = self._size = 0  # Parquet: its rows, the rows read, its size

    def on_disk(self) -> int:
        """Bytes of the file on disk read so far: compressed bytes for a compressed file, the size's share of the
        rows read for Parquet (read by row group, where no offset says how far)."""
        if self._raw is not None:
            try:
                return self._raw.tell()
            except ValueError:  # closed: the reading ended
                return 0
        return self._size * self._rows_read // self._rows if self._rows else 0

    def __iter__(self):
        if self.format == PARQUET:
            return self._parquet()
        return self._lines()

    def _lines(self):
        lineno = 0
        try:
            with open(self.path, "rb", buffering=1 << 20) as raw, open_binary(self.path, self.compression, raw) as f:
                self._raw = raw
                if self.format == ".txt":
                    yield from self._paragraphs(f)
                    return
                for lineno, line in enumerate(f, 1):
                    self.bytes += len(line)
                    text = self._json_text(line, lineno)
                    if text is not None:
                        yield text
        except Exception as e:  # noqa: BLE001 - decoders raise many types; _is_corrupt sorts them
            if not _is_corrupt(e):
                raise
            name = self.compression or "file"
            self.bad(f"{self.path}: line {lineno + 1}", f"corrupt or truncated {name} data ({e})",
                     "re-download or re-create the file", part=True)

    def _json_text(self, line: bytes, lineno: int) -> str | None:
        if not line.strip():
            return None
        where = f"{self.path}:{lineno}"
        try:
            obj = json.loads(line)
        except RecursionError:  # (`'['*100000`: json_mistakes.loads's words, as a bad line --skip_bad_lines skips)
            self.bad(where, NESTED, "a .jsonl line is one JSON object: fix it")
            return None
        except UnicodeDecodeError as e:
            self.bad(where, f"not UTF-8 ({e.reason} at byte {e.start} of the line)", "re-encode the file as UTF-8")
            return None
        except ValueError as e:
            self.bad(where, f"not valid JSON {_json_problem(e)}", "fix it")
            return None
        text = obj.get(self.json_key) if isinstance(obj, dict) else None
        if not isinstance(text, str):
            self.bad(where, f"no string field {self.json_key!r}", "fix it, pass --json_key KEY")
            return None
        problem = not_unicode(text)
        if problem:
            self.bad(where, problem, "fix it")
            return None
        return text

    def _paragraphs(self, f):
        """One document per blank-line-separated paragraph. Its lines are held until the blank line that ends it, so a
        file of one document a line without blank lines is told (`long_paragraph`) when its paragraph reaches
        `LONG_PARAGRAPH_LINES` lines, before any of it is tokenized, and a paragraph past `PARAGRAPH_BYTES` is bad
        input (`oversized`; skipped: its lines up to the next blank line are dropped, counted and measured)."""
        para = bytearray()
        start = lines = size = 0  # the paragraph's first line number, its lines and bytes so far
        told = over = False
        for lineno, line in enumerate(f, 1):
            self.bytes += len(line)
            if line.strip():
                if not lines:
                    start = lineno
                lines += 1
                size += len(line)
                if lines == LONG_PARAGRAPH_LINES and not told:
                    told = True
                    self.long_paragraph(f"{self.path}:{start}")
                if not over:
                    para += line
                    if len(para) > PARAGRAPH_BYTES:
                        over, para = True, bytearray()
                        self.oversized(f"{self.path}:{start}", None)
                continue
            if over:
                self.oversized(f"{self.path}:{start}", (lines, size))
            elif lines:
                text = self._decode(para, start)
                if text is not None:
                    yield text
            para, lines, size, over = bytearray(), 0, 0, False
        if over:
            self.oversized(f"{self.path}:{start}", (lines, size))
        elif lines:
            text = self._decode(para, start)
            if text is not None:
                yield text

    def _decode(self, para: bytearray, lineno: int) -> str | None:
        try:
            return para.decode("utf-8").rstrip("\n")
        except UnicodeDecodeError as e:
            self.bad(f"{self.path}:{lineno}", f"paragraph is not UTF-8 ({e.reason} at byte {e.start})",
                     "re-encode the file as UTF-8")
            return None

    def _parquet(self):
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            pf = pq.ParquetFile(self.path)
        except (pa.ArrowException, OSError) as e:
            if isinstance(e, OSError) and not isinstance(e, pa.ArrowException) and e.errno is not None:
                raise
            self.bad(str(self.path), f"not a readable Parquet file ({_first_line(e)})",
                     "re-download or re-create the file", part=True)
            return
        self._rows, self._size = pf.metadata.num_rows, self.path.stat().st_size
        schema = pf.schema_arrow
        if self.json_key not in schema.names:
            cols = ", ".join(schema.names[:8]) + (", ..." if len(schema.names) > 8 else "")
            self.bad(str(self.path), f"no column {self.json_key!r} (columns: {cols})",
                     "pass --json_key COLUMN", part=True)
            return
        col_type = schema.field(self.json_key).type
        if not (pa.types.is_string(col_type) or pa.types.is_large_string(col_type)
                or getattr(pa.types, "is_string_view", lambda t: False)(col_type)):
            self.bad(str(self.path), f"column {self.json_key!r} holds {col_type}, not strings",
                     "pass --json_key with a string column", part=True)
            return
        for rg in range(pf.num_row_groups):
            row = 0
            try:
                for batch in pf.iter_batches(_PARQUET_BATCH, row_groups=[rg], columns=[self.json_key],
                                             use_threads=False):
                    texts = batch.column(0).to_pylist()
                    for i, text in enumerate(texts):
                        if text is None:
                            self.bad(f"{self.path}: row group {rg} row {row + i}", f"{self.json_key!r} is null",
                                     "fix it")
                            continue
                        self.bytes += len(text)
                        yield text
                    row += len(texts)
                    self._rows_read += len(texts)
            except (pa.ArrowException, OSError) as e:
                if isinstance(e, OSError) and not isinstance(e, pa.ArrowException) and e.errno is not None:
                    raise
                self.bad(f"{self.path}: row group {rg}", f"corrupt ({_first_line(e)})",
                         "re-download or re-create the file", part=True)


def not_unicode(text: str) -> str | None:
    """Why a JSON line's text is not valid Unicode, or None. JSON's `\\ud800` escapes (and the surrogate bytes
    `json.loads` decodes with 'surrogatepass') give Python strings with lone surrogates, which the tokenizer refuses
    mid-run and no UTF-8 file can hold. Text and Parquet strings are decoded strictly, so never hold one. ASCII
    strings (a flag CPython keeps) are never encoded."""
    if text.isascii():
        return None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        return f"not valid Unicode (a lone surrogate U+{ord(text[e.start]):04X} at character {e.start} of the text)"
    return None


def _json_problem(e: ValueError) -> str:
    """The mistake and its fix as every user's JSON file names it (`json_mistakes.cause`: 'a trailing comma before
    }; remove it'), and its column: "line 1" of one JSONL line says nothing."""
    if not isinstance(e, json.JSONDecodeError):
        return f"({e})"
    pos, what = json_mistakes.cause(e)
    return f"at column {pos - e.doc.rfind(chr(10), 0, pos)}: {what}"


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


def count_records(path: Path) -> int:
    """Lines (or Parquet rows) in one file: an upper bound on its documents, for a progress bar."""
    k = kind(path)
    if k and k[0] == PARQUET:
        import pyarrow.parquet as pq

        try:
            return pq.ParquetFile(path).metadata.num_rows
        except Exception:  # noqa: BLE001 - a bad file is reported when it is read
            return 0
    n = 0
    try:
        with open_binary(path, k[1] if k else "") as f:
            for block in iter(lambda: f.read(1 << 24), b""):
                n += block.count(b"\n")
    except Exception as e:  # noqa: BLE001
        if not _is_corrupt(e):
            raise
    return n
