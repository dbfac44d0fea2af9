"""Writing a token file: the MMIDIDX `.bin`/`.idx` pair (`data.indexed` reads it), streamed so memory stays flat for
any corpus size, published atomically (the `.idx` last: it is the commit point), resumable after a kill
(`preprocess`'s progress record), and appendable from whole token files (`merge-data`).
"""
from __future__ import annotations

import os
import struct
from pathlib import Path

import numpy as np

from pretrain_cli import atomic
from pretrain_cli.atomic import first_missing, remove_made_dirs
from pretrain_cli.data.indexed import CHUNK, CODE_OF, DTYPE_CODES, HEADER_BYTES, MAGIC, strip_prefix
from pretrain_cli.errors import UserError


# every name a writer, preprocess or merge-data puts under a prefix (published, in progress, or the task's record)
_OUTPUT_NAMES = (".bin", ".idx", ".json", ".lsm", ".progress.json", ".bin.tmp", ".idx.tmp", ".sizes.tmp",
                 ".docs.tmp", ".lock")


def check_output_prefix(given: str, option: str, prefix: str | None = None) -> str:
    """The output prefix `given` to `option`, refused before any work (`preprocess`, `merge-data`): one ending in a
    separator (or empty) would write the hidden files `.bin`/`.idx`, which a directory `input_dir` then blends in;
    one under a file, or whose output names (of `prefix`, a task's, if given) are directories, could only fail
    after the whole corpus was read. Returns `given` without a .bin/.idx suffix."""
    base = strip_prefix(given)
    if not os.path.basename(base):
        raise UserError(f"{option} {given!r}: names a directory, not the files' name; add one, "
                        f"e.g. {os.path.join(base, 'corpus')}")
    parent = os.path.dirname(os.path.abspath(base))
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise UserError(f"{option} {given}: {parent} is a file, not a directory; choose a prefix in a directory")
    stem = prefix or base
    taken = next((stem + ext for ext in _OUTPUT_NAMES if os.path.isdir(stem + ext)), None)
    if taken:
        raise UserError(f"{option} {given}: {taken} is a directory, where an output file goes; move it or choose "
                        "another prefix")
    return base


def sidecar_mismatch(prefix: str, meta: dict) -> str | None:
    """Why the published pair at `prefix` is not the one its sidecar `meta` (one sequence per document, as
    `preprocess` writes) describes, or None. Reads the `.idx` header, its last size and pointer and both files'
    lengths only: a re-run that finds its inputs' sidecar asks this before calling the files complete (a `.bin`
    cut short, or written over by a second run, had been called complete, and `check` then refused it)."""
    idx, bin_ = prefix + ".idx", prefix + ".bin"
    try:
        with open(idx, "rb") as f:
            head = f.read(HEADER_BYTES)
            idx_bytes, bin_bytes = os.fstat(f.fileno()).st_size, os.path.getsize(bin_)
            if len(head) < HEADER_BYTES or head[: len(MAGIC)] != MAGIC:
                return f"{idx} is not an MMIDIDX index"
            _, code, n, d = struct.unpack("<QBQQ", head[len(MAGIC):])
            dtype = np.dtype(DTYPE_CODES[code]) if code in DTYPE_CODES else None
            if dtype is None or dtype.name != meta.get("dtype"):
                return f"{idx} holds dtype code {code}, the sidecar says {meta.get('dtype')}"
            if idx_bytes != HEADER_BYTES + 12 * n + 8 * d:
                return f"{idx} is {idx_bytes} bytes, its header counts {HEADER_BYTES + 12 * n + 8 * d}"
            if (n, d) != (meta.get("documents"), (meta.get("documents") or 0) + 1):
                return f"{idx} counts {n} sequences and {d - 1} documents, the sidecar {meta.get('documents')}"
            want = int(meta.get("tokens") or 0) * dtype.itemsize
            if bin_bytes != want:
                return f"{bin_} is {bin_bytes} bytes, the sidecar's {meta.get('tokens')} tokens take {want}"
            if n:  # the last sequence ends where the .bin does
                f.seek(HEADER_BYTES + 4 * (n - 1))
                size = int(np.frombuffer(f.read(4), "<i4")[0])
                f.seek(HEADER_BYTES + 4 * n + 8 * (n - 1))
                end = int(np.frombuffer(f.read(8), "<i8")[0]) + size * dtype.itemsize
                if end != bin_bytes:
                    return f"{idx}'s last sequence ends at byte {end} of {bin_}'s {bin_bytes}"
    except OSError as e:
        return f"{e.filename}: {e.strerror}"
    return None


class IndexedDatasetWriter:
    """Streams tokens to `<prefix>.bin.tmp`, sequence sizes to `.sizes.tmp` and document ends to
    `.docs.tmp`, so memory stays flat for any corpus size; `finalize()` builds the index from them and
    renames both files into place (the `.idx` last: it is the commit point), so a crash never leaves a
    file under the final names. `checkpoint()` makes everything written so far durable and returns the
    lengths that `resume=` truncates back to after a kill (what `preprocess` records per finished file)."""

    def __init__(self, prefix: str | os.PathLike, dtype=np.uint16, resume: dict | None = None):
        self.prefix = strip_prefix(prefix)
        self.dtype = np.dtype(dtype)
        if self.dtype not in CODE_OF:
            raise ValueError(f"dtype {self.dtype} has no MMIDIDX code")
        parent = Path(self.prefix).parent
        # the outermost directory we create, so abort() leaves the tree as it found it
        self._created = first_missing(parent)
        parent.mkdir(parents=True, exist_ok=True)
        self._bin_tmp = self.prefix + ".bin.tmp"
        self._idx_tmp = self.prefix + ".idx.tmp"
        self._parts = {"bin": self._bin_tmp, "sizes": self.prefix + ".sizes.tmp", "docs": self.prefix + ".docs.tmp"}
        state = resume or {"bin_bytes": 0, "sequences": 0, "documents": 0}
        want = {"bin": int(state["bin_bytes"]), "sizes": 4 * int(state["sequences"]),
                "docs": 8 * int(state["documents"])}
        if resume is not None:
            short = [p for k, p in self._parts.items() if not os.path.exists(p) or os.path.getsize(p) < want[k]]
            if short:
                raise FileNotFoundError(f"{short[0]} is missing or shorter than the progress record")
        files = {}
        for k, path in self._parts.items():
            f = open(path, "r+b" if resume is not None else "wb")
            f.truncate(want[k])  # drop whatever the killed run wrote after its last checkpoint
            f.seek(want[k])
            files[k] = f
        self._bin, self._sizes, self._docs = files["bin"], files["sizes"], files["docs"]
        self.num_tokens = want["bin"] // self.dtype.itemsize
        self.num_sequences, self.num_documents = int(state["sequences"]), int(state["documents"])
        self._last_end = self.num_sequences if self.num_documents else 0  # sequences at the last document end

    def add_item(self, tokens) -> None:
        arr = np.asarray(tokens, dtype=self.dtype)
        if arr.size > np.iinfo(np.int32).max:
            raise UserError(f"{self.prefix}: a sequence exceeds 2^31 tokens; split the document")
        self._bin.write(arr.tobytes(order="C"))
        self._sizes.write(np.int32(arr.size).astype("<i4").tobytes())
        self.num_sequences += 1
        self.num_tokens += arr.size

    def end_document(self) -> None:
        self._docs.write(np.int64(self.num_sequences).astype("<i8").tobytes())
        self.num_documents += 1
        self._last_end = self.num_sequences

    def add_documents(self, flat, lengths) -> None:
        """Many one-sequence documents at once (the preprocess fast path)."""
        flat = np.asarray(flat, dtype=self.dtype)
        lengths = np.asarray(lengths, dtype=np.int64)
        if lengths.size and lengths.max() > np.iinfo(np.int32).max:
            raise UserError(f"{self.prefix}: a sequence exceeds 2^31 tokens; split the document")
        self._bin.write(flat.tobytes(order="C"))
        self._sizes.write(lengths.astype("<i4").tobytes())
        base = self.num_sequences
        self._docs.write(np.arange(base + 1, base + 1 + lengths.size, dtype="<i8").tobytes())
        self.num_sequences += int(lengths.size)
        self.num_documents += int(lengths.size)
        self._last_end = self.num_sequences
        self.num_tokens += int(flat.size)

    def add_dataset(self, ds) -> None:
        """Append a whole token file (merge): its tokens, sizes and document ends shifted by ours."""
        if ds.dtype != self.dtype:
            raise UserError(f"{ds.prefix}: dtype {ds.dtype.name} differs from {self.dtype.name} of the files before "
                            "it; token files can only be joined if they share a dtype (re-run preprocess)")
        if self._last_end != self.num_sequences:
            self.end_document()
        for s in range(0, ds.num_tokens, CHUNK):
            self._bin.write(np.ascontiguousarray(ds.data[s : s + CHUNK]).astype(self.dtype.newbyteorder("<")).tobytes())
        for s in range(0, len(ds), CHUNK):
            self._sizes.write(np.asarray(ds.sizes[s : s + CHUNK]).astype("<i4").tobytes())
        base = self.num_sequences
        for s in range(1, ds.num_documents + 1, CHUNK):
            self._docs.write((np.asarray(ds.doc_idx[s : s + CHUNK], np.int64) + base).astype("<i8").tobytes())
        self.num_sequences += len(ds)
        self.num_documents += ds.num_documents
        self._last_end = self.num_sequences
        self.num_tokens += ds.num_tokens

    def checkpoint(self) -> dict:
        """Flush and fsync what is written; the returned lengths are a valid `resume=` state."""
        for f in (self._bin, self._sizes, self._docs):
            f.flush()
            os.fsync(f.fileno())
        return {"bin_bytes": self.num_tokens * self.dtype.itemsize, "sequences": self.num_sequences,
                "documents": self.num_documents}

    def finalize(self) -> None:
        if self._last_end != self.num_sequences:
            self.end_document()  # sequences added after the last end_document form one document
        for f in (self._bin, self._sizes, self._docs):
            f.close()
        n, d = self.num_sequences, self.num_documents + 1
        with open(self._idx_tmp, "wb") as f:
            f.write(MAGIC + struct.pack("<QBQQ", 1, CODE_OF[self.dtype], n, d))
            _copy_file(self._parts["sizes"], f)
            offset = 0  # pointers: running byte offsets, streamed from the sizes file
            with open(self._parts["sizes"], "rb") as sf:
                for block in iter(lambda: sf.read(1 << 20), b""):  # 256 K sizes: a few MB of temporaries
                    sz = np.frombuffer(block, "<i4").astype(np.int64) * self.dtype.itemsize
                    ends = np.cumsum(sz) + offset
                    f.write(np.concatenate(([offset], ends[:-1])).astype("<i8").tobytes())
                    offset = int(ends[-1])
            f.write(np.zeros(1, "<i8").tobytes())
            _copy_file(self._parts["docs"], f)
        if os.path.exists(self.prefix + ".idx"):
            os.remove(self.prefix + ".idx")  # never pair a stale .idx with the new .bin
        atomic.publish_file(self._bin_tmp, self.prefix + ".bin")
        atomic.publish_file(self._idx_tmp, self.prefix + ".idx")
        for p in (self._parts["sizes"], self._parts["docs"]):
            os.remove(p)

    def close(self) -> None:
        """Stop writing but keep the in-progress files (a later `resume=` continues them)."""
        for f in (self._bin, self._sizes, self._docs):
            if not f.closed:
                f.close()

    def abort(self) -> None:
        self.close()
        for p in (*self._parts.values(), self._idx_tmp):
            if os.path.exists(p):
                os.remove(p)
        remove_made_dirs(Path(self.prefix).parent, self._created)  # the directories this writer made, if empty

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None:
            self.abort()
        return False


def _copy_file(src: str, dst) -> None:
    with open(src, "rb") as f:
        for block in iter(lambda: f.read(1 << 24), b""):
            dst.write(block)
