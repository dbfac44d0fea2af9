"""A test's processes and everything they started, found by parent (/proc) and killed together: a launcher's ranks
run in sessions of their own (Paddle's launcher starts each with setsid, and a rank's watcher takes another), so a
kill of the launcher, or of its process group, leaves them running (tests/forkserver.py's timeout)."""
from __future__ import annotations

import contextlib
import os
import signal
import time


def kill_tree(roots) -> None:
    """SIGKILL the processes `roots` and every process descended from them, and return once none of them runs (30 s at
    most). Each is stopped first (SIGSTOP), pass after pass until no new descendant appears, so that none forks a
    child that escapes, nor is handed to init by its parent's death before it is found: killing the launcher alone
    (or its process group) left its ranks, each in a session of its own, running on."""
    found, frontier = set(), {pid for pid in roots if pid > 0}
    while frontier:
        for pid in frontier:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGSTOP)
        deadline = time.monotonic() + 5
        while any(_state(pid) not in (None, "T", "t", "Z", "X") for pid in frontier) and time.monotonic() < deadline:
            time.sleep(0.005)  # stopped for sure before its children are listed: none forked after the listing
        found |= frontier
        frontier = {pid for pid, parent in parents().items() if parent in found} - found
    for pid in found:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while any(_state(pid) not in (None, "Z", "X") for pid in found) and time.monotonic() < deadline:
        time.sleep(0.01)


def _state(pid: int) -> str | None:
    """Process `pid`'s state letter (/proc/<pid>/stat field 3), None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0].decode()
    except (OSError, IndexError):
        return None


def parents() -> dict:
    """{pid: its parent's pid} of every process."""
    out = {}
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                out[int(name)] = int(f.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
    return out
