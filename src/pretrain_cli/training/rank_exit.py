"""How the ranks leave where they all end at the same point with nothing after it (a stop by signal, nothing to train,
a non-finite loss or a loss spike that stops the run, each decided by a collective): together, once every rank's
watcher is stopped.

Why: a rank's watcher (`distributed.launcher.watcher`) takes any exit of a rank of its host for a death and SIGKILLs its
own rank. Each rank stopping its own watcher (`watchdog.stop`) and then leaving is not enough: a rank that left while
another rank's watcher still ran had that rank killed. Rank 0 was killed so after a stop by SIGTERM under launch.sh,
between its `stopped at step N and saved` line and its `finally`, which releases the run lock: the clean stop (exit 0)
left `run.lock` in output_dir, and workerlog.0 said `rank 1 (...) died: exited with code 0` (rank 1 had left first:
rank 0 was the slower one from the save's last round to its `watchdog.stop`). Rank 0 leaving first had rank 1 killed
the same way, after its save (`rank 0 (...) died: exited with code 0` in workerlog.1).
"""
from __future__ import annotations

from pretrain_cli.distributed.launcher import watchdog


def leave_together(comm) -> None:
    """Stop this rank's watcher, then return only once every rank has stopped its own (`comm`: the run's `NoComm` or
    `Comm`). Two rounds of rank 0's over the launcher's store: a rank sees the first only after its `watchdog.stop`,
    so rank 0 opens the second once every rank has seen the first, and stays until every rank has seen the second
    (its process hosts the store: `wait_until_seen`). Only for a point every rank provably reaches: a rank that never
    arrives keeps rank 0 30 s a round (`wait_until_seen` gives up, then rank 0 leaves), and another rank until rank 0's
    process ends (its store gone: `PeerFailed`) or `PRETRAIN_CLI_RANK0_TIMEOUT` (1 h)."""
    watchdog.stop()
    for what in ("stopping its rank watcher", "waiting for every rank to stop its watcher"):
        if comm.rank == 0:
            comm.rank0_done()
            comm.wait_until_seen()
        else:
            comm.wait_for_rank0(what)
