"""One run per `output_dir`: the lock file that refuses a second run (or a second launcher) in the same directory.

Two runs writing one directory interleave `metrics.jsonl` lines, both write run records and whichever
saves last owns the checkpoints, and both exit 0. The lock is `output_dir/run.lock`, holding the
holder's host, pid and process start time; it is created whole or not at all (a complete temporary
file hard-linked to the lock name: `link` fails if the name exists, on local disks and NFS alike).
Only global rank 0 takes it, so the ranks of one run never conflict, while rank 0 of a second launcher
on a shared directory is refused with one line naming the holder. A lock left by a run that died (same
host, its pid gone or now another process) is stale and is taken over; a lock from another host cannot
be checked from here, so the line says which file to remove once that run is gone.
"""
from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

from pretrain_cli import atomic, processes
from pretrain_cli.errors import UserError

LOCK_FILE = "run.lock"


def _holder_alive(holder: dict) -> bool:
    return processes.alive(holder.get("pid"), holder.get("start_ticks"))


class RunLock:
    """A held lock; `release()` removes it (only if it is still this process's)."""

    def __init__(self, path: Path, me: dict, created_dir: Path | None):
        self.path, self.me, self.created_dir = path, me, created_dir

    def release(self) -> None:
        if _read(self.path) == self.me:
            self.path.unlink(missing_ok=True)
        if self.created_dir is not None:  # a run that wrote nothing leaves no empty directory behind
            try:
                self.created_dir.rmdir()
            except OSError:
                pass


def _read(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def acquire(output_dir) -> RunLock:
    """Take `output_dir`'s lock for this process, or raise a one-line UserError naming the run that holds it."""
    out = Path(output_dir)
    created = None if out.exists() else out
    out.mkdir(parents=True, exist_ok=True)
    path = out / LOCK_FILE
    me = {"host": socket.gethostname(), "pid": os.getpid(), "start_ticks": processes.start_ticks(os.getpid()),
          "started": time.strftime("%Y-%m-%d %H:%M:%S")}
    candidate = atomic.tmp_path(path)  # complete before it gets the lock's name; cleaned up if we die
    atomic.write_json(candidate, me)
    try:
        for _ in range(3):
            try:
                os.link(candidate, path)
                return RunLock(path, me, created)
            except FileExistsError:
                holder = _read(path)
                if holder is None or (holder.get("host") == me["host"] and not _holder_alive(holder)):
                    path.unlink(missing_ok=True)  # stale (its run died) or unreadable: take it over
                    continue
                raise UserError(_refusal(out, path, holder, me["host"])) from None
        raise UserError(f"{path}: could not take the run lock (another run keeps taking it); "
                        f"make sure only one run uses {out}")
    finally:
        candidate.unlink(missing_ok=True)


def refusal(output_dir) -> str | None:
    """The line `acquire` would refuse `output_dir` with now (a live run holds its lock), or None; nothing is
    taken. launch.sh asks before it starts the launcher, whose logs would otherwise go into the running job's."""
    out = Path(output_dir)
    path = out / LOCK_FILE
    holder = _read(path)
    here = socket.gethostname()
    if holder is None or (holder.get("host") == here and not _holder_alive(holder)):
        return None
    return _refusal(out, path, holder, here)


def _refusal(out: Path, path: Path, holder: dict, here: str) -> str:
    where = "this host" if holder.get("host") == here else f"host {holder.get('host')}"
    gone = ("" if holder.get("host") == here else
            f"; if that run is gone, delete {path} (its host cannot be checked from here)")
    return (f"output_dir: {out} is in use by another run (pid {holder.get('pid')} on {where}, started "
            f"{holder.get('started', '?')}); wait for it to finish, stop it, or choose another output_dir{gone}")
