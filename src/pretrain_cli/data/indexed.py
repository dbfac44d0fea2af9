"""Token files: the MMIDIDX `.bin`/`.idx` pair (Megatron-LM and PaddleNLP), the legacy
`_ids.npy`/`_idx.npz` pair and the optional `.lsm` loss mask: their format and reading them
(`data.indexed_writer` writes the pair).

Everything is memory-mapped: corpora are often larger than RAM, and every rank opens the
same files. Validation happens on open so a truncated or foreign file fails with one line
naming the file, instead of an IndexError or a silent garbage batch hours into a run.
"""
from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import numpy as np

from pretrain_cli import atomic
from pretrain_cli.errors import UserError

MAGIC = b"MMIDIDX\x00\x00"
HEADER_BYTES = 34  # magic 9 + version 8 + dtype code 1 + N 8 + D 8
DTYPE_CODES = {
    1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64,
    6: np.float64, 7: np.float32, 8: np.uint16, 9: np.uint32, 10: np.uint64,
}
CODE_OF = {np.dtype(v): k for k, v in DTYPE_CODES.items()}
SIDECAR_FORMAT = "pretrain-cli-tokens/1"
CHUNK = 1 << 22  # elements per chunk when scanning whole files


def dtype_for_vocab(vocab_size: int) -> np.dtype:
    """Megatron's and PaddleNLP's best-fit rule: uint16 below 65,500 ids, else int32."""
    return np.dtype(np.uint16 if vocab_size < 65500 else np.int32)


def strip_prefix(path: str | os.PathLike) -> str:
    """Users pass `foo`, `foo.bin` or `foo.idx` interchangeably; normalise to `foo`."""
    p = str(path)
    for ext in (".bin", ".idx", "_ids.npy", "_idx.npz"):
        if p.endswith(ext):
            return p[: -len(ext)]
    return p


def read_sidecar(prefix: str) -> dict | None:
    """Our `<prefix>.json` statistics, or None if absent or not ours (a user's input file)."""
    path = prefix + ".json"
    try:
        with open(path, encoding="utf-8") as f:
            meta = json.load(f)
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) and meta.get("format") == SIDECAR_FORMAT else None


class IndexedDataset:
    """Read-only view of one token file pair; sequence i is `get(i)`."""

    def __init__(self, prefix: str, sizes, pointers, doc_idx, data, lsm=None, fmt="mmidx"):
        self.prefix, self.format = prefix, fmt
        self.sizes, self.pointers, self.doc_idx = sizes, pointers, doc_idx
        self.data, self.loss_mask = data, lsm
        self.dtype = data.dtype
        self._min_id = self._max_id = None
        self.unit = _unit(doc_idx, len(sizes))

    def __len__(self) -> int:
        return int(self.sizes.shape[0])

    @property
    def num_documents(self) -> int:
        return int(self.doc_idx.shape[0]) - 1

    @property
    def num_tokens(self) -> int:
        return int(self.data.shape[0])

    def element_offset(self, i: int) -> int:
        return int(self.pointers[i]) // self.dtype.itemsize

    def get(self, i: int, offset: int = 0, length: int | None = None) -> np.ndarray:
        """Tokens of sequence i (a view into the memmap; copy before mutating)."""
        size = int(self.sizes[i])
        if length is None:
            length = size - offset
        start = self.element_offset(i) + offset
        return self.data[start : start + length]

    def tokens(self, start: int, stop: int) -> np.ndarray:
        """Flat slice of the whole token stream (sequences are stored back to back)."""
        return self.data[start:stop]

    def max_token_id(self) -> int:
        """Largest id in the file: from our sidecar if it matches, else one chunked scan."""
        if self._max_id is None:
            self._id_range(need_min=False)
        return self._max_id

    def min_token_id(self) -> int:
        """Smallest id (negative only in a signed dtype): from our sidecar if it records it, else one chunked scan."""
        if self._min_id is None:
            self._id_range(need_min=True)
        return self._min_id

    def _id_range(self, need_min: bool) -> None:
        """Both ends from a sidecar that matches, else from one scan (then cached in that sidecar: a sidecar from
        before `min_token_id` was recorded costs one scan, once)."""
        meta = read_sidecar(self.prefix)
        fits = meta is not None and meta.get("tokens") == self.num_tokens
        if fits and "max_token_id" in meta and (not need_min or "min_token_id" in meta):
            self._max_id = int(meta["max_token_id"])
            self._min_id = int(meta["min_token_id"]) if "min_token_id" in meta else None
            return
        lo, hi = None, -1
        for s in range(0, self.num_tokens, CHUNK):
            chunk = self.data[s : s + CHUNK]
            lo = int(chunk.min()) if lo is None else min(lo, int(chunk.min()))
            hi = max(hi, int(chunk.max()))
        self._min_id, self._max_id = lo, hi
        if fits:
            try:
                atomic.write_json(self.prefix + ".json", {**meta, "min_token_id": lo, "max_token_id": hi},
                                  sort_keys=True)
            except OSError:  # read-only data directory: the in-memory values are enough
                pass


def _unit(doc_idx, n: int) -> str:
    """`IndexedDataset.unit`, what `split` divides and samples shuffle, as Megatron-core and PaddleNLP do: the
    `.idx`'s sequences, its documents unless Megatron's `--split-sentences` (a sequence per sentence) or an empty
    document (a doc_idx entry with no sequence) made them differ; then the lines that count them say "sequence". The
    index itself is compared, not the counts: a 2-sentence document beside an empty one has 2 of each. Worked out
    once, at open, a chunk at a time: read twice per source, a whole-index comparison cost ~0.5 s and 400 MB a read
    at 50M documents."""
    if int(doc_idx.shape[0]) != n + 1:
        return "sequence"
    for s in range(0, n + 1, CHUNK):
        part = np.asarray(doc_idx[s : s + CHUNK])
        if not np.array_equal(part, np.arange(s, s + part.shape[0])):
            return "sequence"
    return "document"


def check_token_ids(ds: IndexedDataset, vocab_size: int | None = None, vocab: str = "", fix: str = "") -> None:
    """Ids that no embedding holds, refused when the data is opened instead of at the first step: below 0 (only a
    signed dtype can hold one: unsigned files are never scanned for it) and, given `vocab_size`, at or above it
    (`vocab` says whose vocabulary, `fix` what to do)."""
    if ds.dtype.kind != "u" and ds.min_token_id() < 0:
        _fail(ds.prefix + ".bin", f"token id {ds.min_token_id()} < 0 ({ds.dtype.name}); these are not a tokenizer's "
                                  "ids")
    if vocab_size is not None and ds.max_token_id() >= vocab_size:
        raise UserError(f"{ds.prefix}.bin: max token id {ds.max_token_id()} >= {vocab or f'vocab_size {vocab_size}'}; "
                        f"{fix}")


def _fail(path: str, problem: str, fix: str = "re-create it with `pretrain-cli preprocess`"):
    raise UserError(f"{path}: {problem}; {fix}")


def _check_pointers(idx_path: str, sizes, pointers, itemsize: int) -> None:
    """p[0] = 0 and p[i+1] = p[i] + sizes[i]*itemsize, checked in chunks to bound memory."""
    n = sizes.shape[0]
    expected_next = 0
    for s in range(0, n, CHUNK):
        sz = np.asarray(sizes[s : s + CHUNK], dtype=np.int64)
        p = np.asarray(pointers[s : s + CHUNK], dtype=np.int64)
        if (sz < 0).any():
            _fail(idx_path, f"negative sequence size at sequence {s + int(np.argmax(sz < 0))}")
        want = expected_next + np.concatenate(([0], np.cumsum(sz[:-1] * itemsize)))
        bad = np.nonzero(p != want)[0]
        if bad.size:
            j = s + int(bad[0])
            kind = "decreasing" if j and int(pointers[j]) < int(pointers[j - 1]) else "inconsistent"
            _fail(idx_path, f"{kind} pointer at sequence {j} ({int(pointers[j])}, expected {int(want[bad[0]])})")
        expected_next = int(want[-1] + sz[-1] * itemsize)


def _check_doc_idx(idx_path: str, doc_idx, n: int) -> None:
    d = np.asarray(doc_idx)
    if d.shape[0] < 2:
        _fail(idx_path, "contains zero documents", "preprocess a non-empty corpus")
    if int(d[0]) != 0 or int(d[-1]) != n:
        _fail(idx_path, f"doc_idx runs {int(d[0])}..{int(d[-1])} but there are {n} sequences")
    if (np.diff(d) < 0).any():
        _fail(idx_path, "doc_idx is not non-decreasing")


def _open_mmidx(prefix: str) -> IndexedDataset:
    idx_path, bin_path = prefix + ".idx", prefix + ".bin"
    size = os.path.getsize(idx_path)
    if size < HEADER_BYTES:
        _fail(idx_path, f"truncated: {size} bytes, shorter than the 34-byte header")
    with open(idx_path, "rb") as f:
        header = f.read(HEADER_BYTES)
    if header[:8] == b"TNTIDX\x00\x00":  # megatron/data/indexed_dataset.py: IndexedDataset (--data-impl lazy)
        _fail(idx_path, "a TNTIDX index, the older format of Megatron-LM's and PaddleNLP's --data-impl lazy and "
                        "cached, which is not read here", "re-create the pair from its documents with `pretrain-cli "
                        "preprocess` (or Megatron's tools/preprocess_data.py, which writes MMIDIDX)")
    if header[:9] != MAGIC:
        _fail(idx_path, f"wrong magic {header[:9]!r} (expected {MAGIC!r}); not an MMIDIDX index",
              "pass the prefix of a .bin/.idx pair made by `pretrain-cli preprocess`, Megatron or PaddleNLP")
    (version,) = struct.unpack("<Q", header[9:17])
    if version != 1:
        _fail(idx_path, f"unsupported version {version} (only version 1 exists)")
    code = header[17]
    if code not in DTYPE_CODES:
        _fail(idx_path, f"unknown dtype code {code} (valid: 1-10)")
    n, d = struct.unpack("<QQ", header[18:34])
    want = HEADER_BYTES + 12 * n + 8 * d
    if size not in (want, want + n):  # Megatron-core may append int8 sequence_modes[N]
        _fail(idx_path, f"truncated or corrupt: {size} bytes, expected {want} for {n} sequences and {d} doc_idx "
                        "entries")
    if n and size == want + n:
        _text_modes_only(idx_path, np.memmap(idx_path, np.int8, "r", want, (n,)))
    dtype = np.dtype(DTYPE_CODES[code])
    sizes = np.memmap(idx_path, np.int32, "r", HEADER_BYTES, (n,)) if n else np.zeros(0, np.int32)
    pointers = np.memmap(idx_path, np.int64, "r", HEADER_BYTES + 4 * n, (n,)) if n else np.zeros(0, np.int64)
    doc_idx = np.memmap(idx_path, np.int64, "r", HEADER_BYTES + 12 * n, (d,)) if d else np.zeros(0, np.int64)
    _check_doc_idx(idx_path, doc_idx, n)
    _check_pointers(idx_path, sizes, pointers, dtype.itemsize)
    total = int(np.sum(sizes, dtype=np.int64))
    if not os.path.exists(bin_path):
        _fail(bin_path, "missing (the .idx exists)", "copy the .bin next to the .idx or re-run preprocess")
    bin_size = os.path.getsize(bin_path)
    if bin_size != total * dtype.itemsize:
        _wrong_bin_size(bin_path, bin_size, total, dtype, code)
    if total == 0:
        _fail(bin_path, "contains zero tokens", "preprocess a non-empty corpus")
    data = np.memmap(bin_path, dtype, "r", 0, (total,))
    return IndexedDataset(prefix, sizes, pointers, doc_idx, data, _open_lsm(prefix, total))


def _text_modes_only(idx_path: str, modes) -> None:
    """Megatron-core's multimodal index (`tools/preprocess_mmdata.py`: `IndexedDatasetBuilder(multimodal=True)`)
    appends one int8 mode per sequence: 0 for text, else another kind (1: an image's raw bytes as int32). Those
    sequences are no token ids, and read as ids they would fail later as negative or too large ids, a line that
    does not say why; refused here, naming the modes. An index whose modes are all 0 holds text only and reads."""
    other = np.nonzero(np.asarray(modes) != 0)[0]
    if other.size:
        kinds = ", ".join(str(int(m)) for m in np.unique(np.asarray(modes)[other]))
        _fail(idx_path, f"a multimodal index (Megatron's sequence_modes): {other.size:,} of {len(modes):,} sequences "
                        f"are of mode {kinds}, not text (mode 0), the first sequence {int(other[0])}; their bytes "
                        "are no token ids", "train on a text-only pair (Megatron's tools/preprocess_data.py, or "
                        "`pretrain-cli preprocess`)")


def _wrong_bin_size(bin_path: str, bin_size: int, total: int, dtype: np.dtype, code: int) -> None:
    """A `.bin` of the other token width than its `.idx` says (its size is the tokens at 2 or 4 bytes: a `.bin`
    written for another vocabulary size, since Megatron and `preprocess` write uint16 below 65,500 ids, else int32)
    is said to be that, not only "truncated or mismatched": re-creating it is not the fix, pairing it is."""
    want = total * dtype.itemsize
    width = next((w for w in (2, 4) if w != dtype.itemsize and bin_size == total * w), None)
    if width is not None:
        _fail(bin_path, f"{bin_size} bytes: {total} tokens of {width} bytes ({'uint16' if width == 2 else 'int32'}), "
                        f"but the .idx's dtype code {code} says {dtype.name}; the .bin and the .idx come from "
                        "different writes", "put the .bin beside its own .idx, or re-create the pair")
    short = f", {want - bin_size} bytes short" if bin_size < want else ""
    _fail(bin_path, f"{bin_size} bytes, but the .idx describes {total} {dtype.name} tokens ({want} bytes){short}; "
                    "the pair is truncated or mismatched")


def _open_lsm(prefix: str, total: int):
    path = prefix + ".lsm"
    if not os.path.exists(path):
        return None
    if os.path.getsize(path) != total:
        _fail(path, f"{os.path.getsize(path)} bytes, expected one byte per token ({total})",
              "delete it or re-create it with the .bin")
    return np.memmap(path, np.uint8, "r", 0, (total,))


def _open_legacy(prefix: str) -> IndexedDataset:
    """PaddleNLP's `_ids.npy` + `_idx.npz`: each load and each array checked on its own, so the line names the file
    that is broken (a token array of floats, or lens that are negative or not 1-D, would read as garbage samples)."""
    ids_path, idx_path = prefix + "_ids.npy", prefix + "_idx.npz"
    try:
        data = np.load(ids_path, mmap_mode="r", allow_pickle=False)
    except (ValueError, OSError) as e:
        _fail(ids_path, f"unreadable legacy token array ({e})")
    try:
        with np.load(idx_path, allow_pickle=False) as z:
            raw_lens, raw_docs = np.asarray(z["lens"]), np.asarray(z["docs"])
    except (ValueError, KeyError, OSError) as e:
        _fail(idx_path, f"unreadable legacy index ({e})")
    if data.ndim != 1:
        _fail(ids_path, f"expected a 1-D token array, got shape {data.shape}")
    if data.dtype.kind not in "iu":
        _fail(ids_path, f"token array of {data.dtype}, not integers")
    for name, arr in (("lens", raw_lens), ("docs", raw_docs)):
        if arr.ndim != 1 or arr.dtype.kind not in "iu":
            _fail(idx_path, f"'{name}' is {arr.dtype} of shape {arr.shape}, not a 1-D integer array")
    if (raw_lens < 0).any():
        _fail(idx_path, f"negative length in 'lens' at sequence {int(np.argmax(raw_lens < 0))}")
    lens, docs = raw_lens.astype(np.int32), raw_docs.astype(np.int64)
    itemsize = data.dtype.itemsize
    pointers = (np.concatenate(([0], np.cumsum(lens[:-1], dtype=np.int64) * itemsize)) if lens.size
                else np.zeros(0, np.int64))
    _check_doc_idx(idx_path, docs, lens.shape[0])
    total = int(lens.sum(dtype=np.int64))
    if total != data.shape[0]:
        _fail(ids_path, f"{data.shape[0]} tokens, but {idx_path} lens sum to {total}")
    if total == 0:
        _fail(ids_path, "contains zero tokens", "preprocess a non-empty corpus")
    return IndexedDataset(prefix, lens, pointers.astype(np.int64), docs, data, _open_lsm(prefix, total), "legacy")


def open_token_file(path: str | os.PathLike, key: str | None = None) -> IndexedDataset:
    """Open `<prefix>` (legacy pair first, as PaddleNLP does, then MMIDIDX). `key`: the argument that named it
    (`input_dir`), put first in an error line, since the user edits the key, not the file."""
    if key is None:
        return _open_token_file(path)
    try:
        return _open_token_file(path)
    except UserError as e:
        if type(e) is not UserError:
            raise
        raise UserError(f"{key}: {e}") from None


def _open_token_file(path: str | os.PathLike) -> IndexedDataset:
    prefix = strip_prefix(path)
    if os.path.exists(prefix + "_ids.npy") and os.path.exists(prefix + "_idx.npz"):
        return _open_legacy(prefix)
    if os.path.exists(prefix + ".idx"):
        return _open_mmidx(prefix)
    if os.path.isdir(prefix):  # a blend's entry (or eval's --data) names files, where input_dir alone takes a directory
        inside = token_prefixes(prefix)
        _fail(prefix, "is a directory, not a token file prefix", f"name its token files by their prefix ("
              f"{', '.join(inside[:3])}{', ...' if len(inside) > 3 else ''})"
              if inside else "it holds no .bin/.idx pair; create them with `pretrain-cli preprocess --output_prefix "
              "PREFIX`")
    literal = " (paths are used as written, not shell-expanded)" if prefix.startswith("~") or "$" in prefix else ""
    _fail(prefix, f"no token files (.bin/.idx or _ids.npy/_idx.npz) with this prefix{literal}",
          "check the path, or create them with `pretrain-cli preprocess --output_prefix PREFIX`")


def token_prefixes(directory: str | os.PathLike) -> list[str]:
    """Every token-file prefix in a directory (not recursive), sorted."""
    d = Path(directory)
    found = {strip_prefix(p) for p in map(str, d.glob("*.idx"))}
    found |= {strip_prefix(p) for p in map(str, d.glob("*_idx.npz"))}
    return sorted(found)
