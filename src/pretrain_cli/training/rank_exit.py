"""How a rank leaves at the end of a run, by the kind of end (`leave`): the one place that chooses.

Why it matters: a rank's watcher (`distributed.launcher.watcher`) takes any exit of a rank of its host for a death and
SIGKILLs its own rank. Each rank stopping its own watcher (`watchdog.stop`) and then leaving is not enough: a rank that
left while another rank's watcher still ran had that rank killed. Rank 0 was killed so after a stop by SIGTERM under
launch.sh, between its `stopped at step N and saved` line and its `finally`, which releases the run lock: the clean
stop (exit 0) left `run.lock` in output_dir, and workerlog.0 said `rank 1 (...) died: exited with code 0` (rank 1 had
left first). Rank 0 leaving first had rank 1 killed the same way.

- `End.AGREED`: every rank ends at the same point, decided by a collective (a stop by signal, nothing to train, a
  non-finite loss or a loss spike that stops the run): together, once every rank's watcher is stopped
  (`leave_together`).
- `End.ALONE`: this rank's own error (a `UserError` raised on some ranks only: a `PeerFailed`, rank 0's failed save, a
  rollback's checkpoint file missing on one rank, a wait's timeout; an out-of-memory step). The others may be in a
  collective that never completes, so no point is shared: the rank tells its host's watchers it leaves on purpose,
  then stops its own (`watchdog.leave_alone`); they let their ranks end by themselves and name no death
  (`distributed.launcher.departure`). Waiting for the others there would keep rank 0 2 x 30 s, another rank until
  rank 0 ends.
- `End.DONE`: past the last collective of a run that ran to its end: each rank stops its watcher; the final export's
  round (rank 0 writes, the others wait for it on the store, rank 0 stays until they have seen it) ends them together.
"""
from __future__ import annotations

from enum import Enum

from pretrain_cli.distributed.launcher import watchdog


class End(Enum):
    """The kinds of end above: a caller names one of these, never a string (`leave` raises TypeError for any other)."""
    AGREED = "agreed"
    ALONE = "alone"
    DONE = "done"


def leave(comm, kind: End, error: BaseException | None = None) -> None:
    """Make this rank ready to exit after an end of `kind` (`comm`: the run's `NoComm` or `Comm`; `error`: what ends
    an `End.ALONE` rank, whose first line its host's watchers repeat)."""
    if kind is End.AGREED:
        leave_together(comm)
    elif kind is End.ALONE:
        text = str(error).strip() if error is not None else ""
        watchdog.leave_alone(text.splitlines()[0] if text else type(error).__name__)
    elif kind is End.DONE:
        watchdog.stop()
    else:  # a string or another enum's member: no kind of end, and leaving by a guess could hang the other ranks
        raise TypeError(f"rank_exit.leave: kind must be an End, not {kind!r}")


def leave_together(comm) -> None:
    """Stop this rank's watcher, then return only once every rank has stopped its own. Two rounds of rank 0's over the
    launcher's store: a rank sees the first only after its `watchdog.stop`, so rank 0 opens the second once every rank
    has seen the first, and stays until every rank has seen the second (its process hosts the store:
    `wait_until_seen`). Only for a point every rank provably reaches: a rank that never arrives keeps rank 0 30 s a
    round (`wait_until_seen` gives up, then rank 0 leaves), and another rank until rank 0's process ends (its store
    gone: `PeerFailed`) or `PRETRAIN_CLI_RANK0_TIMEOUT` (1 h)."""
    watchdog.stop()
    for what in ("stopping its rank watcher", "waiting for every rank to stop its watcher"):
        if comm.rank == 0:
            comm.rank0_done()
            comm.wait_until_seen()
        else:
            comm.wait_for_rank0(what)
