"""A rank's own limit on its wait in the join of the process group, where no launcher watches the join: Paddle's
launcher run directly (the README's 8-GPU and 2-node lines), or one node (scripts/paddle_launch.py watches the join,
`joining`, only after a meeting of several nodes). There a rank whose peers never come (a node lost after Paddle's
meeting, a start-up stalled on another node or this one) waited in Paddle's join with no word (still waiting after 17
minutes when it was stopped; gloo's own limit on it is an hour).

Why a process: Paddle's join (`init_parallel_env`, fleet's `init`) holds the GIL for its whole wait: measured, a thread
of rank 0 that ticked every second did not run once while rank 0 waited 15 s there for rank 1. So `arm` forks a helper
(plain os calls, no Paddle) that waits on a pipe for `disarm` (the join done) for the run's start-up allowance
(`progress.allowance`: `hang_timeout`, at least 600 s, the same the launchers' join watch allows a node); past it, it
says so in one line in the rank's log, records the end for launch.sh (`HUNG`, 124, as a late node's) and SIGKILLs the
rank, the one way to end a process inside C++ holding the GIL. A rank that leaves otherwise (its join failed and it
exits) closes the pipe, and the helper goes too. While it waits it says so every `NOTE` s (then every `REPEAT` s):
which ranks of this host have come to the join and which have not, and why not (`join_wait`: stopped, gone, still
starting up); at the limit the rank of this host that never came is the one named and recorded (a stopped one also
killed), not the rank that waited for it.

What it cannot do from inside the ranks: name the node that is missing, or end the others at once when a node vanished
(the launchers' join watch learns both from the nodes' beats at MASTER's store, which a rank is not told of), or choose
the job's exit code under Paddle's launcher (the rank's SIGKILL: its 247).
"""
from __future__ import annotations

import contextlib
import os
import signal
import socket

HUNG = 124  # the class of a late node (`joining`, `watcher.HUNG`)
NOTE = 60.0  # s in the join before the first waiting note (a user is not left with nothing for the whole allowance)
REPEAT = 300.0  # s between the notes after it
_ARMED: list = []  # (the helper's pid, the pipe's write end) while this rank waits in the join


def arm(rank: int, allowance: float | None, world_size: int | None = None, record=None, verdicts=None) -> None:
    """Limit this launched rank's wait in the join to `allowance` seconds (None: no limit); past it, `record(rank,
    code, kind, line, local=...)` (`job.record`) is called in the helper before the kill; `verdicts`: launch.sh's
    directory, whose `joining` records say which ranks came (`join_wait.came`). Nothing when not launched (no
    `PADDLE_TRAINER_ID`: a caller that survives a failed join would be killed later) or armed already."""
    if allowance is None or _ARMED or not os.environ.get("PADDLE_TRAINER_ID", "").strip():
        return
    read_end, write_end = os.pipe()
    parent = os.getpid()
    child = os.fork()
    if child == 0:
        try:
            os.close(write_end)
            _wait(read_end, rank, parent, allowance, world_size, record, verdicts)
        finally:
            os._exit(0)
    os.close(read_end)
    _ARMED.append((child, write_end))


def disarm() -> None:
    """The join is done (or given up): the helper ends without a word."""
    while _ARMED:
        child, write_end = _ARMED.pop()
        try:
            os.write(write_end, b"j")
            os.close(write_end)
            os.waitpid(child, 0)
        except OSError:
            pass


def line(rank: int, pid: int, allowance: float, world_size: int | None) -> str:
    who = f"the process group of {world_size} ranks" if world_size else "the process group"
    return (f"[pretrain-cli] rank {rank} (pid {pid} on {socket.gethostname()}): {who} has not formed {allowance:.0f} s "
            f"after this rank came to the join (hang_timeout's start-up allowance): a rank of it has not come (its "
            f"start-up stalled or slower than that, or its node lost; its workerlog says where it is); this rank "
            f"stops, killed (launch.sh: exit {HUNG}). Find what holds the missing ranks and re-run on every node "
            f"(several nodes under scripts/launch.sh name the node that is missing)")


def _wait(read_end: int, rank: int, parent: int, allowance: float, world_size: int | None, record,
          verdicts=None) -> None:
    import select
    import time

    from pretrain_cli import processes
    from pretrain_cli.distributed.launcher import join_wait

    os.closerange(3, read_end)  # none of the rank's sockets or files stays open here (stderr: its log)
    os.closerange(read_end + 1, 4096)
    began, due = time.monotonic(), NOTE
    while True:
        waited = time.monotonic() - began
        if waited >= allowance:
            break
        if select.select([read_end], [], [], max(0.0, min(allowance, due) - waited))[0]:
            return  # disarmed, or the rank is gone (the pipe closed)
        waited = time.monotonic() - began
        if due <= waited < allowance:
            ranks = join_wait.host_ranks(parent)
            arrived = join_wait.came(verdicts, ranks)
            text = join_wait.note(rank, parent, waited, allowance, world_size, ranks,
                                  join_wait.absent(ranks, arrived, rank), arrived)
            os.write(2, f"\n{text}\n".encode())
            due += REPEAT
    ranks = join_wait.host_ranks(parent)
    arrived = join_wait.came(verdicts, ranks)
    missing = join_wait.absent(ranks, arrived, rank)
    if missing:  # a rank of this host never came, or came and stopped: it is the cause, not this one
        culprit = missing[0]
        text = join_wait.named(rank, culprit, len(missing) - 1, allowance, world_size, HUNG,
                               came=culprit[0] in (arrived or ()))
        os.write(2, f"\n{text}\n".encode())
        if record is not None:
            record(culprit[0], HUNG, "hung", text.removeprefix("[pretrain-cli] "),
                   local=join_wait.local_rank(culprit[1]))
        if processes.stopped(culprit[1]):  # (it would hold the launcher's stop: SIGKILL reaches a stopped process)
            with contextlib.suppress(OSError):
                os.kill(culprit[1], signal.SIGKILL)
    else:
        text = line(rank, parent, allowance, world_size)
        os.write(2, f"\n{text}\n".encode())
        if record is not None:
            record(rank, HUNG, "hung", text.removeprefix("[pretrain-cli] "))
    try:
        os.kill(parent, signal.SIGKILL)
    except OSError:
        pass
