"""A rank that leaves alone, on purpose, with its own error, and what the host's other watchers do about it.

A rank's own error (a `UserError` raised on this rank only: a `PeerFailed`, rank 0's failed save, a file missing on
one rank; an out-of-memory step) ends it while the other ranks may be anywhere: in a collective that now never
completes, waiting for rank 0 on the launcher's store, in rank 0's own work. No point is reached by every rank, so the
ranks cannot leave together (`training.rank_exit.leave_together`). Before, the rank stopped its own watcher and left,
and every other watcher of its host took its exit for a death (`rank 1 (...) died: exited with code 2`) and SIGKILLed
its own rank at once: a rank 0 so killed never ran its `finally`, and `run.lock` stayed in output_dir.

So the rank leaving notes it first (`note`: `left.R` in the host's watch directory, holding its error's line), then
stops its watcher (`watchdog.leave_alone`), then exits. A watcher that sees a rank gone that left that note follows it
(`follow`), naming no death. Its own rank ends by itself within `GRACE` s: a collective with the rank that left fails
once that rank's connection closes (gloo raises, and the rank ends through its `finally`; inside the backward gloo
aborts it, SIGABRT), a wait on the store ends once rank 0's store is gone (`PeerFailed`); else (busy in work of its own,
which nothing interrupts) it is SIGKILLed. What it writes meanwhile (the collective library's error, its traceback) is
dropped; its log gets one line naming the rank that left and its error; launch.sh a "peer" record (the job's code is
the leaving rank's own). A rank that ended without its `finally` leaves no run lock behind: rank 0 names it to its
watcher (`watchdog.holding`), which removes it if it still names rank 0's pid. A rank that stops its own watcher
meanwhile leaves on purpose itself and says why in its own lines. Plain os calls only (the watcher's side runs in the
forked watchers, without Paddle).
"""
from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

from pretrain_cli import processes

GRACE = 5.0  # how long a rank gets to end by itself after another rank of its host left with its error
POLL = 0.05


def note(shared: Path, rank: int, line: str) -> None:
    """Rank `rank` leaves on purpose with the error `line`: said to its host's watchers (best effort)."""
    from pretrain_cli import atomic

    with contextlib.suppress(OSError):
        atomic.write_text(shared / f"left.{rank}", line)


def announced(shared: Path, gone: set) -> dict:
    """{rank: its error's line} for the ranks of `gone` that left on purpose (`note`)."""
    left = {}
    for r in sorted(gone):
        with contextlib.suppress(OSError):
            left[r] = (shared / f"left.{r}").read_text()
    return left


def follow(w, left: dict, pipe: int | None, log: int) -> None:
    """The watcher `w` (a `watcher.Watcher`) after the ranks of `left` left with their errors: its rank ends by
    itself within `GRACE` s (else SIGKILL), its output meanwhile dropped; one line in its log, a "peer" record."""
    deadline = time.monotonic() + GRACE
    while not w.stopping and processes.alive(w.parent) and time.monotonic() < deadline:
        if pipe is not None:
            w.read_held(pipe)  # dropped: the consequence of the departure, not news
        time.sleep(POLL)
    if w.stopping:  # its rank stopped this watcher: it leaves on purpose too, with its own lines
        return w._finish()
    w._stop_parent()  # (ended by itself already: nothing to do)
    _free_held(w)
    who = ", ".join(f"rank {r} (pid {w.ranks[r]} on {w.host}) left with an error: {line.strip()}"
                    for r, line in left.items())
    line = f"[pretrain-cli] rank {w.me}: {who}; this rank stops too."
    os.write(log, f"\n{line}\n".encode())
    if w.verdicts is not None:
        from pretrain_cli.distributed.launcher import job
        from pretrain_cli.errors import PeerFailed

        job.record(w.me, PeerFailed.exit_code, "peer", line, directory=w.verdicts, overwrite=False)
    w._finish()


def _free_held(w) -> None:
    """The file its rank held (`watchdog.holding`: rank 0's run lock), removed if it still names that rank's pid: the
    rank ended without its `finally` (gloo aborts a rank whose all-reduce inside the backward loses its peer; SIGKILL
    after `GRACE`). Ended through its `finally`, the rank removed it itself."""
    import json

    try:
        path = Path((w.shared / f"holds.{w.me}").read_text())
        holder = json.loads(path.read_text())
    except (OSError, ValueError):
        return
    if isinstance(holder, dict) and holder.get("pid") == w.parent:
        with contextlib.suppress(OSError):
            path.unlink()
