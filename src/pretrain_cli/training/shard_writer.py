"""Writing one `checkpoint-N/` from every rank at once, and publishing it only once every rank is done.

Each rank writes the pieces it owns (`Strategy.pieces`, one writer per replicated piece:
`distributed.layout.pieces.writer_of`) into its own files under `checkpoint-N.tmp/` (a shared file system
across nodes), one tensor at a time (`storage.shard_files`; each file's metadata says which block of which tensor each
of its tensors is: `checkpoint_index.file_metadata`), then leaves a completion record
`rank-0000r.done.json` (its files' sizes and checksums, its pieces' offsets) next to them. Rank 0 waits
for every record, merges them into `checkpoint.index.json` (`storage.checkpoint_index`), writes
`trainer_state.json` last and renames the directory: a save killed at any point, on any rank, never
leaves a directory named `checkpoint-N`. Waiting on files rather than in a collective lets the same
code run in `async_save`'s background threads, which must never issue a collective, and keeps slow
saves clear of gloo's 30 s collective timeout. A rank that fails leaves an error record instead, which
rank 0 reports as the save's error; a rank that dies or hangs while it owes its record gets a death notice in its
place from its watcher (`distributed.launcher.watchdog.owing`), which rank 0 reports as the loss of that rank: no
collective is in flight to tell rank 0 of a death on another host.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np

from pretrain_cli import atomic, waiting
from pretrain_cli.distributed.launcher import watchdog
from pretrain_cli.errors import PeerFailed, UserError
from pretrain_cli.storage import checkpoint_index, shard_files

RECORD = "rank-{:05d}.done.json"


class PartFailed(UserError):
    """Another rank could not write its part of a checkpoint (disk full, permissions): the system's refusal, exit 1
    as that rank's own error would be (2, a usage error, is never restarted by launch.sh)."""

    exit_code = 1
    kind = "system"


def tmp_dir(final: Path) -> Path:
    return final.with_name(final.name + ".tmp")


def write_rank(tmp: Path, rank: int, world: int, pieces) -> dict:
    """This rank's files for `pieces` [(Piece, produce)] (`produce()` the block as numpy, HF layout), then its
    completion record; returns the record. Until the record is written its watcher owes rank 0 a death notice."""
    with watchdog.owing(tmp / RECORD.format(rank)):
        return _write_rank(tmp, rank, world, pieces)


def _write_rank(tmp: Path, rank: int, world: int, pieces) -> dict:
    tmp.mkdir(parents=True, exist_ok=True)
    files, recs = {}, []
    for kind, stem in (("weights", "model"), ("optimizer", "optimizer")):
        mine = [(p, produce) for p, produce in pieces if p.kind == kind]
        if not mine:
            continue
        fname = checkpoint_index.file_name(stem, rank, world)
        entries = [(p.name, p.dtype, p.box.shape, produce) for p, produce in mine]
        held = [{"name": p.name, "kind": kind, "dtype": p.dtype, "global_shape": list(p.box.global_shape),
                 "offsets": list(p.box.offsets), "shape": list(p.box.shape), "file": fname} for p, _ in mine]
        files[fname] = shard_files.write(tmp / fname, entries, checkpoint_index.file_metadata(held))
        recs += held
    record = {"rank": rank, "files": files, "pieces": recs}
    atomic.write_json(tmp / RECORD.format(rank), record)
    return record


def report_failure(tmp: Path, rank: int, error: BaseException) -> None:
    """Best effort: tell rank 0 this rank's part failed (it then fails the save instead of waiting). Only into `tmp` as
    it is: this rank made it before its first file, so a `tmp` gone is one rank 0 removed, having failed the save;
    made again, it would stay behind holding only this record."""
    try:
        atomic.write_json(tmp / RECORD.format(rank), {"rank": rank, "error": f"{type(error).__name__}: {error}"})
    except OSError:
        pass


def collect(tmp: Path, world: int, step: int) -> list[dict]:
    """Rank 0: every rank's record, polling the directory for up to `waiting.TIMEOUT_ENV` seconds; a rank's error
    record fails the save (`PartFailed`), a death notice (its watcher's, `watchdog.owing`) ends this rank
    (`PeerFailed`: the rank lost is elsewhere, its host's watchers name it)."""
    records = {}

    def all_in():
        for r in range(world):
            path = tmp / RECORD.format(r)
            if r not in records and path.is_file():
                rec = json.loads(path.read_text(encoding="utf-8"))
                if "lost" in rec:  # its watcher's notice: it died or hung while writing (`watchdog.owing`)
                    raise PeerFailed(f"rank 0: {rec['lost']}, while writing its part of checkpoint-{step}; this rank "
                                     f"stops too. That rank's workerlog (scripts/launch.sh: output_dir/log/node-N) "
                                     f"says more; re-run the same command (or launch with MAX_RESTART) to resume from "
                                     f"the newest complete checkpoint-N")
                if "error" in rec:
                    raise PartFailed(f"rank {r} could not write its part of checkpoint-{step}: {rec['error']}; "
                                    f"free space or fix the file system, then re-run")
                records[r] = rec
        return [records[r] for r in range(world)] if len(records) == world else None

    def late(seconds: float) -> UserError:
        missing = sorted(set(range(world)) - set(records))
        return UserError(f"checkpoint-{step}: ranks {missing} have not finished writing after {seconds:.0f} s; "
                         f"raise {waiting.TIMEOUT_ENV} if that is expected")

    return waiting.poll(all_in, None, late, first=0.01, longest=0.5)


def publish(tmp: Path, final: Path, records: list[dict], layout: str, state: dict) -> Path:
    """Rank 0, once every record is in: the index (and transformers' own index where the weights are whole),
    trainer_state.json last, the records removed, one rename."""
    from pretrain_cli.models.model_files import INDEX_FILE

    index = checkpoint_index.build(records, len(records), layout)
    weight_map = checkpoint_index.hf_weight_map(index)
    if weight_map is not None and len(weight_map["weight_map"]) and len(set(weight_map["weight_map"].values())) > 1:
        atomic.write_json(tmp / INDEX_FILE, weight_map)
    checkpoint_index.write_index(tmp, index)
    atomic.write_json(tmp / "trainer_state.json", state)  # written last: its presence marks a finished write
    for r in range(len(records)):
        (tmp / RECORD.format(r)).unlink(missing_ok=True)
    return atomic.publish_dir(tmp, final)


def drop(tmp: Path) -> None:
    """A failed save's partial directory, removed (frees the space it took): by rank 0 as it fails the save, and by
    every other rank of a synchronous save once rank 0 has ended it (`checkpoint.Saver._write_sync`), since a rank
    still writing then made the directory again (its mkdir, its files, its record) after rank 0 removed it."""
    shutil.rmtree(tmp, ignore_errors=True)


def layout_out(arr: np.ndarray, transpose: bool):
    """A staged host copy handed to the writer: transposed as a view, laid out a few rows at a time as it is
    written (`shard_files.write`), not in the training step."""
    return lambda: arr.T if transpose and arr.ndim == 2 else arr
