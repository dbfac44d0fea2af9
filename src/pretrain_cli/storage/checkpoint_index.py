"""`checkpoint.index.json`: where every piece of a sharded checkpoint lives, and reading any block back.

Each rank writes the pieces it owns into its own files (`model-0000k-of-0000n.safetensors`,
`optimizer-0000k-of-0000n.safetensors`; one process: `model.safetensors` / `optimizer.safetensors`) and a
small record of what it wrote; rank 0 merges the records into this index, written last:

    {"format": "pretrain-cli sharded checkpoint", "version": 2, "world_size": 2, "layout": "...",
     "weights_whole": false,
     "tensors": {"model.layers.0.mlp.up_proj.weight": {"kind": "weights", "dtype": "F32", "shape": [128, 64],
                 "pieces": [{"file": "model-00001-of-00002.safetensors", "offsets": [0, 0], "shape": [64, 64]},
                            {"file": "model-00002-of-00002.safetensors", "offsets": [64, 0], "shape": [64, 64]}]},
                 ...},
     "files": {"model-00001-of-00002.safetensors": {"bytes": 123456, "crc32": "89abcdef"}, ...},
     "crc32": "01234567"}

**Pieces that identify themselves** (version 2). Each rank's file records in its safetensors metadata
(`pretrain_cli.pieces`, `file_metadata`) which block of which tensor each of its tensors is (offsets and global
shape; the header already gives the block's shape), and the index carries the crc32 of its own canonical text
(`seal`). A hand-edited index fails its checksum; an index whose checksum was made again after an edit, or a
mis-merge of two runs' indexes, is caught by `against_file`, which compares the index with each file's own record
(`storage.intact` runs it on every file it checks, reading the headers only). Either is damage. An index of
version 1 (written before the files recorded their pieces) is read as before, with one note: refusing it would
strand every run started before, and its files' crc32s are still checked (docs/CHECKPOINTS.md, "Damage").

`Reader.read(name, offsets, shape)` returns any block of any tensor, reading from each piece only the
part that intersects the block, so a layout resumes by reading about its own share.

`load` checks what it can without reading a tensor: a `version` this code does not know stops with one line
(`UnknownVersion`: a newer pretrain-cli wrote it; it is not damage, so no older checkpoint is taken instead).
`world_size` and `layout` describe the writing run only (any layout resumes from any other), so they are
checked against the index's own pieces, not against the reading run: every piece lies in a file the index
lists, named for a rank below `world_size`; the pieces of each tensor tile its global shape exactly once; and
`weights_whole` says what the weights' pieces say. An index that disagrees with itself is damage.
"""
from __future__ import annotations

import json
import logging
import zlib
from pathlib import Path

import numpy as np

from pretrain_cli import atomic
from pretrain_cli.errors import UserError
from pretrain_cli.storage.shard_files import RESUME, Advice, File

INDEX = "checkpoint.index.json"
FORMAT = "pretrain-cli sharded checkpoint"
VERSION = 2  # what `build` writes; `load` reads it and version 1 (no piece records, no checksum of its own)
PIECES_KEY = "pretrain_cli.pieces"  # a rank file's safetensors metadata: {tensor: {"offsets", "global_shape"}}
_NOTED: set = set()  # version-1 indexes already noted in this process
STEMS = {"weights": "model", "optimizer": "optimizer"}  # a piece's kind -> the stem of its rank's file


class UnknownVersion(UserError):
    """An index written by another version of pretrain-cli (not damage: an older checkpoint is not taken instead)."""


def file_name(kind: str, rank: int, world: int) -> str:
    """A rank's file for `kind` ("model" weights, "optimizer" state); HF's shard names, one shard per rank."""
    return f"{kind}.safetensors" if world == 1 else f"{kind}-{rank + 1:05d}-of-{world:05d}.safetensors"


def intersect(a_off, a_shape, b_off, b_shape):
    """The overlap of two blocks as (offsets, shape), or None when they do not overlap."""
    lo = [max(a, b) for a, b in zip(a_off, b_off)]
    hi = [min(a + n, b + m) for a, n, b, m in zip(a_off, a_shape, b_off, b_shape)]
    if any(h <= l for l, h in zip(lo, hi)):
        return None
    return tuple(lo), tuple(h - l for l, h in zip(lo, hi))


def build(records: list[dict], world: int, layout: str) -> dict:
    """The index from every rank's record ({"files": {...}, "pieces": [...]}), checking that the pieces of each
    tensor tile it exactly once (a replicated piece written twice, or a block nobody wrote, is a bug here)."""
    tensors, files = {}, {}
    for rec in records:
        files.update(rec["files"])
        for p in rec["pieces"]:
            t = tensors.setdefault(p["name"], {"kind": p["kind"], "dtype": p["dtype"], "shape": p["global_shape"],
                                               "pieces": []})
            t["pieces"].append({"file": p["file"], "offsets": p["offsets"], "shape": p["shape"]})
    for name, t in tensors.items():
        t["pieces"].sort(key=lambda q: q["offsets"])
        covered = sum(int(np.prod(q["shape"], dtype=np.int64)) for q in t["pieces"])
        if covered != int(np.prod(t["shape"], dtype=np.int64)):
            raise RuntimeError(f"{name}: pieces cover {covered} of {int(np.prod(t['shape']))} elements")
    whole = all(len(t["pieces"]) == 1 for t in tensors.values() if t["kind"] == "weights")
    return seal({"format": FORMAT, "version": VERSION, "world_size": world, "layout": layout, "weights_whole": whole,
                 "tensors": dict(sorted(tensors.items())), "files": dict(sorted(files.items()))})


def file_metadata(pieces) -> dict:
    """The safetensors metadata of a rank's file holding `pieces` (records with `name`, `offsets`, `global_shape`):
    which block of which tensor each of its tensors is. `format: pt` keeps it a file transformers loads."""
    held = {p["name"]: {"offsets": [int(o) for o in p["offsets"]], "global_shape": [int(n) for n in p["global_shape"]]}
            for p in pieces}
    return {"format": "pt", PIECES_KEY: json.dumps(held, separators=(",", ":"), sort_keys=True)}


def _crc32(index: dict) -> str:
    """The crc32 of the index's canonical text, without its own checksum."""
    text = json.dumps({k: v for k, v in index.items() if k != "crc32"}, sort_keys=True, separators=(",", ":"))
    return f"{zlib.crc32(text.encode()):08x}"


def seal(index: dict) -> dict:
    """`index` carrying the checksum of its own contents (what `build` returns; what a tool that edits an index on
    purpose calls before writing it)."""
    return {**{k: v for k, v in index.items() if k != "crc32"}, "crc32": _crc32(index)}


def against_file(index: dict, fname: str, tensors: dict, metadata: dict) -> str | None:
    """Where file `fname`'s own record of its pieces (its safetensors header's `tensors` and `metadata`) disagrees
    with the index (a piece the file does not hold, at other offsets or of another shape, or a piece the index does
    not put there), or None. Version-1 indexes come with files that record nothing: None."""
    if index.get("version") == 1:
        return None
    try:
        held = json.loads(metadata[PIECES_KEY])
        assert isinstance(held, dict)
    except (KeyError, TypeError, ValueError, AssertionError):
        return f"{fname} holds no record of its pieces (safetensors metadata {PIECES_KEY!r})"
    listed = {n: p for n, t in index["tensors"].items() for p in t["pieces"] if p["file"] == fname}
    for name, p in listed.items():
        mine, header = held.get(name), tensors.get(name)
        if not isinstance(mine, dict) or not isinstance(header, dict):
            return f"the index puts a piece of {name} in {fname}, which holds none"
        shape = list(index["tensors"][name]["shape"])
        if (mine.get("offsets") != list(p["offsets"]) or mine.get("global_shape") != shape
                or header.get("shape") != list(p["shape"])):
            return (f"the index puts the piece {list(p['shape'])} at {list(p['offsets'])} of {name} in {fname}, which "
                    f"holds its piece {header.get('shape')} at {mine.get('offsets')}")
    extra = sorted(set(held) - set(listed))
    if extra:
        return f"{fname} holds a piece of {extra[0]} the index does not put there"
    return None


def hf_weight_map(index: dict) -> dict | None:
    """`model.safetensors.index.json` for transformers when every weight is whole in one file, else None."""
    if not index["weights_whole"]:
        return None
    total = sum(f["bytes"] for name, f in index["files"].items() if name.startswith("model"))
    return {"metadata": {"total_size": total},
            "weight_map": {n: t["pieces"][0]["file"] for n, t in index["tensors"].items() if t["kind"] == "weights"}}


def load(ckpt) -> dict | None:
    """The index of checkpoint directory `ckpt`, or None for a checkpoint from before it (one process wrote
    model.safetensors + optimizer.safetensors whole)."""
    path = Path(ckpt) / INDEX
    if not path.is_file():
        return None
    try:
        index = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise UserError(f"{path}: unreadable ({e}); resume from another checkpoint") from None
    if not isinstance(index, dict) or index.get("format") != FORMAT or not isinstance(index.get("tensors"), dict):
        raise UserError(f"{path}: not a {FORMAT} index; resume from another checkpoint")
    version = index.get("version")
    if version not in (1, VERSION):
        if isinstance(version, int) and not isinstance(version, bool):
            raise UnknownVersion(f"{path}: index version {version}, this pretrain-cli reads version {VERSION}; "
                                 f"read it with the pretrain-cli that wrote it, or resume from another checkpoint")
        raise UserError(f"{path}: no index version (got {version!r}); resume from another checkpoint")
    if version == 1 and str(path) not in _NOTED:
        _NOTED.add(str(path))
        logging.getLogger("pretrain_cli").warning(
            f"{path}: a version-1 index (from before the files recorded their pieces): its pieces are taken as it "
            f"lists them, checked by size and crc32 only; checkpoints saved from now on are version {VERSION}")
    if version != 1 and index.get("crc32") != _crc32(index):
        raise UserError(f"{path}: does not match its own checksum (crc32 {index.get('crc32')!r}, its contents give "
                        f"{_crc32(index)}); the index was edited or damaged: resume from another checkpoint")
    reason = disagreement(index)
    if reason is not None:
        raise UserError(f"{path}: {reason}; the index is damaged: resume from another checkpoint")
    return index


def disagreement(index: dict) -> str | None:
    """Where the index's `world_size`, `files`, `weights_whole` and its tensors' pieces contradict each other (see
    the module docstring), or None."""
    world, files = index.get("world_size"), index.get("files")
    if not isinstance(world, int) or isinstance(world, bool) or world < 1 or not isinstance(index.get("layout"), str):
        return f"world_size {world!r} / layout {index.get('layout')!r} is not a run's"
    if not isinstance(files, dict):
        return "no files"
    names = {file_name(stem, r, world) for stem in STEMS.values() for r in range(world)}
    whole = True
    for name, t in index["tensors"].items():
        try:
            shape, pieces, stem = [int(n) for n in t["shape"]], t["pieces"], STEMS[t["kind"]]
            if t["kind"] == "weights" and len(pieces) != 1:
                whole = False
            for p in pieces:
                if p["file"] not in files or p["file"] not in names or not p["file"].startswith(stem):
                    return (f"{name}: a piece in {p['file']!r}, which the index does not list or which is no "
                            f"{t['kind']} file of a {world}-process run")
            reason = _tiling(shape, [([int(o) for o in p["offsets"]], [int(n) for n in p["shape"]]) for p in pieces])
        except (KeyError, TypeError, ValueError):
            return f"{name}: not a tensor record (kind, shape, pieces with file, offsets, shape)"
        if reason is not None:
            return f"{name}: {reason}"
    if index.get("weights_whole") is not whole:
        return f"weights_whole is {index.get('weights_whole')!r}, the weights' pieces say {whole}"
    return None


def _tiling(shape: list[int], blocks: list[tuple[list[int], list[int]]]) -> str | None:
    """Why `blocks` [(offsets, shape)] do not cover a tensor of `shape` exactly once, or None. Counted on the grid
    of the blocks' own edges (one cell per distinct cut, not per element), so a 1.1 TiB tensor costs nothing."""
    if not blocks:
        return "no pieces"
    for off, size in blocks:
        if len(off) != len(shape) or len(size) != len(shape) or any(
                o < 0 or s < 0 or o + s > g for o, s, g in zip(off, size, shape)):
            return f"a piece {size} at {off} does not lie inside its shape {shape}"
    if len(blocks) == 1:
        return None if blocks[0][1] == shape else f"one piece {blocks[0][1]} of shape {shape}"
    cuts = [np.unique([0, g] + [o[d] for o, _ in blocks] + [o[d] + n[d] for o, n in blocks])
            for d, g in enumerate(shape)]  # every block edge along each dimension, sorted
    cover = np.zeros([len(c) - 1 for c in cuts], dtype=np.int64)  # how often each cell between edges is written
    for off, size in blocks:
        cover[tuple(slice(int(np.searchsorted(c, o)), int(np.searchsorted(c, o + n)))
                    for c, o, n in zip(cuts, off, size))] += 1
    if (cover != 1).any():
        return "its pieces do not cover it exactly once (a block is missing or written twice)"
    return None


class Reader:
    """Blocks of a sharded checkpoint's tensors, each read from only the pieces that intersect it."""

    def __init__(self, ckpt, index: dict, advice: Advice = RESUME):
        """`advice`: how a damaged piece's line ends (`shard_files.advice_for`: a resume's unless told another)."""
        self.ckpt, self.index, self.advice = Path(ckpt), index, advice
        self._files: dict = {}

    def names(self, kind: str) -> list[str]:
        return [n for n, t in self.index["tensors"].items() if t["kind"] == kind]

    def info(self, name: str) -> dict:
        t = self.index["tensors"].get(name)
        if t is None:
            raise UserError(f"{self.ckpt / INDEX}: no tensor {name!r}; the checkpoint does not match this model")
        return t

    def file(self, name: str) -> File:
        if name not in self._files:
            self._files[name] = File(self.ckpt / name, "optimizer state" if name.startswith("optimizer") else "weights",
                                     self.advice)
        return self._files[name]

    def read(self, name: str, offsets=None, shape=None) -> np.ndarray:
        """Block `offsets` + `shape` (default: the whole tensor) of tensor `name`, in the saved dtype (bf16 as
        uint16 bits)."""
        t = self.info(name)
        if offsets is None:
            offsets, shape = (0,) * len(t["shape"]), tuple(t["shape"])
        if any(o < 0 or o + s > g for o, s, g in zip(offsets, shape, t["shape"])) or len(shape) != len(t["shape"]):
            raise UserError(f"{self.ckpt / INDEX}: {name} has shape {t['shape']}, this model needs a block "
                            f"{list(shape)} at {list(offsets)}; the checkpoint does not match this model")
        out = None
        for p in t["pieces"]:
            hit = intersect(p["offsets"], p["shape"], offsets, shape)
            if hit is None:
                continue
            at, size = hit
            block = self.file(p["file"]).read(name, [a - o for a, o in zip(at, p["offsets"])], size)
            if out is None:
                out = np.empty(shape, dtype=block.dtype)
            out[tuple(slice(a - o, a - o + s) for a, o, s in zip(at, offsets, size))] = block
        if out is None:  # a zero-sized block
            out = np.empty(shape, dtype=np.float32)
        return out

    @property
    def bytes_read(self) -> int:
        return sum(f.bytes_read for f in self._files.values())

    @property
    def opened(self) -> list:
        """The files the blocks read so far touched (what a rank that read them checksums)."""
        return [f.path for f in self._files.values()]

    def close(self) -> None:
        for f in self._files.values():
            f.close()


def write_index(directory, index: dict) -> None:
    atomic.write_json(Path(directory) / INDEX, index)
