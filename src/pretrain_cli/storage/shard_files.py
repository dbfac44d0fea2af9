"""Safetensors files written one tensor at a time and read one block at a time.

The writer streams: the header is built from shapes and dtypes alone, then each tensor is copied to
the host (`produce()`, ideally a view of the tensor's own memory) and written a few MiB at a time,
checksummed (zlib.crc32 over the file's bytes), so writing a rank's shard stages at most one chunk (a
transposed block) or one tensor's host copy (bf16, a GPU tensor), never the shard. The reader memory-maps the data
section and copies out only the requested block of a tensor (rows or columns), so a rank resuming on another layout
reads about its own share. Files are plain safetensors (`safetensors`, `transformers` read them); bf16 is
carried as its uint16 bits, as `Tensor.numpy()` gives it. Every file is published through `atomic`.
"""
from __future__ import annotations

import json
import os
import struct
import zlib
from pathlib import Path
from typing import NamedTuple

import numpy as np

from pretrain_cli import atomic
from pretrain_cli.errors import UserError

NUMPY = {"F32": np.float32, "BF16": np.uint16, "F16": np.float16, "F64": np.float64, "I32": np.int32,
         "I64": np.int64, "U16": np.uint16, "U8": np.uint8, "I8": np.int8, "BOOL": np.bool_,
         "F8_E4M3": np.uint8}  # FP8 as its bits (`storage.fp8` decodes them)
_ITEM = {k: np.dtype(v).itemsize for k, v in NUMPY.items()}
CHUNK = 8 * 2**20  # bytes per write and checksum call; a transposed block is copied this much at a time


CODES = {"float32": "F32", "bfloat16": "BF16", "float16": "F16"}


def cast(arr: np.ndarray, code: str, to: str) -> np.ndarray:
    """`arr`, a tensor stored as dtype `code` (bf16 as its uint16 bits), as dtype `to`: via fp32, bf16 rounded to
    nearest even as Paddle's and torch's casts round (NaN kept NaN). `arr` itself when the codes agree."""
    if code == to:
        return arr
    f32 = (arr.astype(np.uint32) << 16).view(np.float32) if code == "BF16" else arr.astype(np.float32)
    if to == "F32":
        return f32
    if to == "F16":
        with np.errstate(over="ignore"):  # beyond fp16's range: inf, as every cast gives it
            return f32.astype(np.float16)
    bits = np.ascontiguousarray(f32).view(np.uint32)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where(np.isnan(f32), np.uint16(0x7FC0), rounded)


def header_for(entries, metadata: dict | None = None) -> tuple[bytes, list[tuple[int, int]]]:
    """The safetensors header for `entries` [(name, dtype code, shape)] in that order, padded to 8 bytes."""
    head, offset, spans = {}, 0, []
    for name, dtype, shape in entries:
        size = int(np.prod(shape, dtype=np.int64)) * _ITEM[dtype]
        head[name] = {"dtype": dtype, "shape": [int(s) for s in shape], "data_offsets": [offset, offset + size]}
        spans.append((offset, offset + size))
        offset += size
    if metadata:
        head["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    raw = json.dumps(head, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return raw, spans


def write(path, entries, metadata: dict | None = None) -> dict:
    """Publish a safetensors file at `path`; `entries` [(name, dtype code, shape, produce)], `produce()` giving a
    numpy array of that shape (a view is best: it is written a few rows at a time), called once, in order.
    Returns {"bytes", "crc32"} of the file."""
    raw, spans = header_for([(n, d, s) for n, d, s, _ in entries], metadata)
    crc, total = 0, 0
    with atomic.publishing(path) as f:
        for block in _file_blocks(raw, entries, spans):
            f.write(block)
            crc = zlib.crc32(block, crc)
            total += len(block)
    return {"bytes": total, "crc32": f"{crc:08x}"}


def _file_blocks(raw: bytes, entries, spans):
    """The file's bytes in order, so that one loop writes and checksums them all: the header's length, the
    header, then each tensor's (produced when its turn comes, and let go before the next is produced)."""
    yield struct.pack("<Q", len(raw))
    yield raw
    for (name, _, shape, produce), (begin, end) in zip(entries, spans):
        arr = produce()
        if tuple(arr.shape) != tuple(shape) or arr.nbytes != end - begin:
            raise ValueError(f"{name}: produced {arr.shape} {arr.dtype}, the header says {list(shape)}")
        yield from _blocks(arr)
        del arr


def _blocks(arr: np.ndarray):
    """`arr`'s bytes in C order, at most about CHUNK at a time: a contiguous array as views of its memory, any
    other (a transposed view of a tensor) as copies of a few rows each, so writing it never copies it whole."""
    if arr.flags.c_contiguous:
        view = memoryview(arr.reshape(-1)).cast("B") if arr.size else memoryview(b"")
        for i in range(0, len(view), CHUNK):
            yield view[i:i + CHUNK]
        return
    step = max(1, CHUNK // max(arr[0].nbytes, 1))
    for i in range(0, arr.shape[0], step):
        yield memoryview(np.ascontiguousarray(arr[i:i + step]).reshape(-1)).cast("B")


def checksum(path) -> dict:
    """{"bytes", "crc32"} of a file on disk, read in chunks."""
    crc, total = 0, 0
    with open(path, "rb") as f:
        while True:
            block = f.read(CHUNK)
            if not block:
                break
            crc = zlib.crc32(block, crc)
            total += len(block)
    return {"bytes": total, "crc32": f"{crc:08x}"}


CHECKPOINT_ADVICE = "resume from another checkpoint"  # what a resume can do (`RESUME`, `File`'s default)
MAX_HEADER = 100_000_000  # the longest header the safetensors format allows: a longer length read is damage
USES = ("resume", "continue_training", "inference", "export")  # what a reader reads a directory for (`advice_for`)


class Advice(NamedTuple):
    """How a line about a damaged file ends: what that makes of the directory holding it (`holder`, e.g. "the
    checkpoint": "the checkpoint is incomplete"; None: nothing said of it), then `fix`, what its reader can do.
    `kind`: what `advice_for` found the directory to be, "checkpoint" (a run's checkpoint), "final" (our run's final
    directory, its final model written: a trainer state), "unfinished" (our run's output_dir before its final model:
    still training, or stopped before it) or "model" (a directory no run of ours wrote), for a caller whose own line
    depends on it."""

    holder: str | None
    fix: str
    kind: str = "checkpoint"

    def said(self, state: str) -> str:
        """The line's end, after what `state` ("incomplete": a file missing or cut short; "damaged") makes of it."""
        return f"{self.holder} is {state}: {self.fix}" if self.holder else self.fix


RESUME = Advice("the checkpoint", CHECKPOINT_ADVICE)


def advice_for(directory, use: str) -> Advice:
    """What a reader of `directory` that finds one of its files damaged tells its user, decided here alone from
    what the directory is and what the command does with it (`use`, one of `USES`): a checkpoint (a `checkpoint-N`
    with a trainer state or optimizer state, as ours, transformers' and PaddleNLP's Trainers write them, or one of
    our run's checkpoints by another name: its args.json record and optimizer state) has other checkpoints beside
    it; our run's final directory (its args.json record, `run_dir.is_record`) has its run's checkpoint-N inside
    it, or none (a run that saved none, a copy); any other directory is a model downloaded or copied, to fetch
    again, whatever it ships (a Hub snapshot may hold the trainer_state.json transformers' and PaddleNLP's
    `save_state` write). A resume always reads a checkpoint and turns to another; the others name the argument
    that picked the directory (`model_name_or_path`, `--model`)."""
    from pretrain_cli.run_dir import ARGS_FILE, CHECKPOINT, STATE_FILE, is_record, list_checkpoints

    if use not in USES:
        raise ValueError(f"use {use!r}: one of {USES}")
    path = Path(directory)
    if use == "resume":  # (what it reads was found a checkpoint by its trainer state first)
        return RESUME
    point = {"inference": "point --model to", "export": "export"}.get(use, "point model_name_or_path to")
    try:  # (`CheckpointDir.record`'s test; that module reads through this one)
        ours = is_record(json.loads((path / ARGS_FILE).read_text(encoding="utf-8")))
    except (OSError, UnicodeDecodeError, ValueError):
        ours = False
    optimizer = any(path.glob("optimizer*.safetensors"))
    if (CHECKPOINT.match(path.name) and (optimizer or (path / STATE_FILE).is_file())) or (ours and optimizer):
        return Advice("the checkpoint", {"continue_training": "point model_name_or_path to another of the run's "
                                                              "checkpoints"}.get(use, f"{point} another checkpoint-N"))
    if not ours:
        return Advice(None, f"download it again, or {point} a complete directory", "model")
    kind = "final" if (path / STATE_FILE).is_file() else "unfinished"
    saved = list_checkpoints(path)
    if saved:
        return Advice("the run's final model", f"{point} one of its checkpoints (the newest: {saved[-1][1]})", kind)
    return Advice("the run's final model", f"{point} another directory (no checkpoint-N of its run is in {path})",
                  kind)


class Problem(str):
    """Why a file or directory cannot be read (one line naming the file), and what that makes of the directory:
    `state`, "incomplete" (a file missing or cut short: a copy or save that did not finish) or "damaged" (one there
    whole but altered or unreadable), as `Advice.said` takes it; `storage.intact` returns these. `kind`: what a
    reader decides on besides the state (`storage.intact.LOST_INDEX`), else None: never the line's words."""

    def __new__(cls, text: str, state: str = "damaged", kind: str | None = None):
        self = super().__new__(cls, text)
        self.state, self.kind = state, kind
        return self


class FileError(UserError):
    """A `File`'s line: its `problem`, then its advice said for the problem's state."""

    def __init__(self, problem: Problem, advice: Advice):
        super().__init__(f"{problem}; {advice.said(problem.state)}")
        self.problem = problem


class _Short(Exception):
    """A file that ends before its header does: cut short (incomplete), not damaged."""


class File:
    """One safetensors file opened for block reads: its header parsed, its data section memory-mapped lazily.

    Every line it raises says what is wrong with the file, then `advice` (`advice_for` the directory holding it
    and what its reader does with it): what that makes of the directory (a file missing or cut short leaves it
    incomplete; one with a tensor its header lacks, or an unreadable header, damaged) and what to do. A file that
    is there but whose permissions keep it from being opened says so instead: it may well be whole."""

    def __init__(self, path, what: str = "safetensors file", advice: Advice = RESUME,
                 listed_in: str | None = None):
        """`listed_in`: the index that names this file, said when the file is missing (what makes it expected)."""
        self.path, self.advice = Path(path), advice
        try:
            size = os.path.getsize(self.path)
            with open(self.path, "rb") as f:
                length = f.read(8)
                if len(length) < 8:  # (an empty file too)
                    raise _Short(f"{size:,} bytes, shorter than the 8 that give the header's length")
                n = struct.unpack("<Q", length)[0]
                if n > MAX_HEADER:
                    raise ValueError(f"a header length of {n:,} bytes, past the format's {MAX_HEADER:,}")
                if n > size - 8:
                    raise _Short(f"{size:,} bytes, its header alone says {8 + n:,}")
                head = json.loads(f.read(n))
        except FileNotFoundError:
            listed = f", though {listed_in} names it" if listed_in else ""
            raise FileError(Problem(f"{self.path}: missing{listed}", "incomplete"), advice) from None
        except PermissionError as e:
            raise UserError(f"{self.path}: unreadable ({e.strerror}); fix its permissions") from None
        except _Short as e:
            raise FileError(Problem(f"{self.path}: truncated ({e})", "incomplete"), advice) from None
        except OSError as e:  # a directory in its place, an I/O error: the reason, as the system gives it
            raise FileError(Problem(f"{self.path}: unreadable ({e.strerror or e})"), advice) from None
        except (ValueError, struct.error) as e:
            raise FileError(Problem(f"{self.path}: unreadable {what} ({e})"), advice) from None
        self.metadata = head.pop("__metadata__", {})
        self.tensors, self.start, self.size = head, 8 + n, size
        self._map = None
        self.bytes_read = 0  # of tensor data, by `read` (what a block read touches)

    @property
    def data_end(self) -> int:
        """Where the header says the last tensor's data ends: past `size`, the file was cut short."""
        ends = [info["data_offsets"][1] for info in self.tensors.values()
                if isinstance(info, dict) and len(info.get("data_offsets") or ()) == 2]
        return self.start + max(ends, default=0)

    def require_data(self) -> "File":
        """This file, once every tensor's data is found present (the header alone read: a few KiB), else one line:
        a file cut short fails here rather than at the first `read` past its end."""
        if self.data_end > self.size:
            raise UserError(f"{self.path}: truncated ({self.size:,} bytes, its header says {self.data_end:,}); "
                            f"{self.advice.said('incomplete')}")
        return self

    def read(self, name: str, offsets=None, shape=None) -> np.ndarray:
        """The block `offsets` + `shape` (default: all) of tensor `name`, copied out of the file."""
        info = self.tensors.get(name)
        if info is None:
            raise UserError(f"{self.path}: tensor {name!r} is missing; {self.advice.said('damaged')}")
        begin, end = info["data_offsets"]
        if self.start + end > self.size:
            raise UserError(f"{self.path}: truncated ({self.size:,} bytes, tensor {name!r} ends at "
                            f"{self.start + end:,}); {self.advice.said('incomplete')}")
        if self._map is None:
            self._map = np.memmap(self.path, dtype=np.uint8, mode="r")
        dtype = NUMPY[info["dtype"]]
        full = self._map[self.start + begin:self.start + end].view(dtype).reshape(info["shape"])
        if offsets is None:
            block = full
        else:
            block = full[tuple(slice(o, o + s) for o, s in zip(offsets, shape))]
        self.bytes_read += block.nbytes
        return np.array(block)

    def close(self) -> None:
        self._map = None


class Files:
    """Safetensors files holding whole tensors (a Hugging Face or PaddleNLP directory, a checkpoint from before
    the index), read block by block like the pieces of an indexed checkpoint (`checkpoint_index.Reader`: the same
    `index`, `read`, `bytes_read`, `opened`, `close`)."""

    def __init__(self, paths, what: str, advice: Advice = RESUME):
        self.files, self.index, self._where = [File(p, what, advice=advice) for p in paths], {"tensors": {}}, {}
        for f in self.files:
            for n, t in f.tensors.items():
                self.index["tensors"][n] = {"shape": t["shape"], "dtype": t["dtype"]}
                self._where[n] = f

    def read(self, name, offsets=None, shape=None):
        return self._where[name].read(name, offsets, shape)

    @property
    def bytes_read(self) -> int:
        return sum(f.bytes_read for f in self.files)

    @property
    def opened(self) -> list:
        return [f.path for f in self.files]

    def close(self):
        for f in self.files:
            f.close()
