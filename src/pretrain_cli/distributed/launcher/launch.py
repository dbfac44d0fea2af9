"""What `paddle.distributed.launch` told this process: world size and ranks, read from its environment.

The one place that reads the launcher's variables (no Paddle import: `train` needs the world size
to resolve the run before Paddle starts); and a launched rank's tie to its launcher (`end_with_launcher`: it stops
when its launcher dies, and ends by a deadline).
"""
from __future__ import annotations

import os
import sys


def _int(*names: str, default: int) -> int:
    for name in names:
        value = os.environ.get(name)
        if value not in (None, ""):
            return int(value)
    return default


def world_size() -> int:
    return _int("PADDLE_TRAINERS_NUM", "PADDLE_GLOBAL_SIZE", default=1)


def rank() -> int:
    return _int("PADDLE_TRAINER_ID", "PADDLE_GLOBAL_RANK", default=0)


def local_rank() -> int:
    return _int("PADDLE_LOCAL_RANK", "PADDLE_RANK_IN_NODE", default=0)


def local_size() -> int:
    """Processes on this node (they share its cores)."""
    return _int("PADDLE_LOCAL_SIZE", default=1)


def master() -> str:
    return os.environ.get("PADDLE_MASTER", "?")


LAUNCHER = "PRETRAIN_CLI_LAUNCHER"  # "pid:start ticks" of scripts/paddle_launch.py, in its ranks' environment
PR_SET_PDEATHSIG = 1  # linux/prctl.h
_TIED: list = []  # (the launcher's pid, the seconds this rank outlives it at most), once `end_with_launcher` tied it


def launcher_mark() -> str:
    """What scripts/paddle_launch.py puts in `LAUNCHER` for its ranks: this process, pid and start time."""
    from pretrain_cli import processes

    return f"{os.getpid()}:{processes.start_ticks(os.getpid()) or ''}"


def end_with_launcher() -> None:
    """A launched rank stops when its launcher dies, as at the launcher's SIGTERM, and ends by a deadline.

    Why: Paddle's launcher starts every rank in a session of its own (`os.setsid`), so a launcher that died (a
    hang-up of Paddle's launcher run directly, which does not handle SIGHUP; `kill -9 -PGID` of launch.sh; a
    scheduler's SIGKILL after its grace period) left its ranks and their watchers running with PPID 1: training on,
    or waiting for a peer for up to `hang_timeout`. So the kernel sends the rank SIGTERM at its launcher's death
    (Linux's parent-death signal): in the training loop that is the stop `training.stop_signals` handles (the step
    finishes, the ranks agree, the checkpoint is saved, the lock released, exit 0); before it, SIGTERM's default
    action ends the rank at once. A rank still running `deadline_seconds` after its launcher's death (stuck in a
    collective, a peer gone) SIGKILLs itself (`_end_after`, a thread: Paddle's collectives and store waits release
    the GIL; a rank stopped by `kill -STOP` runs no thread, and its watchers end it as hung). A launcher that ends
    on its own has ended or killed its ranks first, so this changes nothing there. A launcher that died before this
    call (`LAUNCHER` names it) ends the rank here, at once (a kill of the job's own: `account.killed_here`)."""
    if not os.environ.get("PADDLE_TRAINER_ID", "").strip() or not sys.platform.startswith("linux"):
        return
    import ctypes
    import signal
    import threading

    from pretrain_cli import processes

    if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
        return
    pid, _, started = os.environ.get(LAUNCHER, "").partition(":")
    if pid.isdigit() and not processes.alive(int(pid), started or None):
        from pretrain_cli.distributed.launcher import account

        account.killed_here(rank(), "by itself: its launcher had died before it started", os.getpid())
        os.kill(os.getpid(), signal.SIGKILL)
    _TIED[:] = [os.getppid(), deadline_seconds()]
    # the thread lives as long as the rank and only waits, so it takes no process-directed stop signal (it inherits
    # this mask): the kernel gives such a signal to any thread not blocking it, and each of these must reach the
    # main thread, where the rank's own handling is (SIGTERM held back until Paddle's import has set it:
    # `start_signals`; otherwise Paddle's handler ran here: `C++ Traceback ... FatalError: Termination signal`;
    # SIGINT's KeyboardInterrupt and SIGHUP's stop, which Python runs on the main thread only)
    held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT, signal.SIGHUP})
    try:
        threading.Thread(target=_end_after, args=tuple(_TIED), name="launcher-deadline", daemon=True).start()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)


def deadline_seconds(environ=os.environ) -> int:
    """How long a rank outlives its launcher at most: the time that launcher gives its ranks' stop after its own
    SIGTERM (`stopping.rank_limit`: STOP_TIMEOUT under scripts/launch.sh, Paddle's 30 s run directly), since a
    launcher's death is the same stop; the stop's own warnings and its watcher's naming of a SIGKILL in it
    (`stopping.short`, `stopping.killed`) count with that limit already. Where a stop has no limit (STOP_TIMEOUT=0)
    `stopping.DEFAULT`: the step under way and a save as long as the watchers allow them with the default
    `hang_timeout` before they call a rank hung."""
    from pretrain_cli.distributed.launcher import stopping

    return stopping.rank_limit(environ)[0] or stopping.DEFAULT


def launcher_gone() -> int | None:
    """The seconds this rank has from its launcher's death (`deadline_seconds`) when its launcher is gone, else None
    (not launched, or the launcher runs). Gone from the moment the launcher's main thread ends (`processes.alive`:
    a zombie leader), not only once this rank has another parent: the kernel's signal comes as the thread that
    started the rank ends, and a launcher with more threads (Paddle's serving the nodes' meeting, a `--master` on
    its node) that is SIGKILLed may end that thread first, handing the rank to a thread of its own, same pid, that
    ends a moment later (seen: 1 of 2 two-node runs said a plain `received SIGTERM`)."""
    if not _TIED:
        return None
    from pretrain_cli import processes

    return _TIED[1] if os.getppid() != _TIED[0] or not processes.alive(_TIED[0]) else None


def _end_after(launcher: int, seconds: float, end=None, poll: float = 1.0) -> None:
    """Wait for `launcher` (this process's parent) to die, then give this rank `seconds` to stop before `end`
    (`_end_now`). The launcher's pidfd wakes the wait at its death; where Linux offers none, its parent's pid
    is polled every `poll` s. A pidfd opened while the parent is still `launcher` is that process's: its pid cannot be
    reused before its children are handed to another parent."""
    import select
    import time

    from pretrain_cli import processes

    fd = processes.exit_fd(launcher)
    try:
        if fd is not None and os.getppid() == launcher:
            select.select([fd], [], [])
        else:
            while os.getppid() == launcher:
                time.sleep(poll)
    finally:
        if fd is not None:
            os.close(fd)
    time.sleep(seconds)
    (end or _end_now)(seconds)


def _end_now(seconds: float) -> None:
    """SIGKILL this rank, one line first in its log: its watcher names the SIGKILL, but as the launcher's limit or a
    scheduler's (`stopping.killed`), while here the launcher is gone and the rank ended itself. Marked so for
    launch.sh's line too (`account.killed_here`, with this pid), which would otherwise suggest the OOM killer; launch.sh
    reads it only while it still waits for this launch's records (a limit under `job.wait_for_watchers`' 15 s): by
    then it has usually said its line and ended or started the next launch, and the line in the log is what says it."""
    import contextlib
    import signal

    from pretrain_cli.distributed.launcher import account

    rank = os.environ.get("PADDLE_TRAINER_ID", "?").strip()
    account.killed_here(rank, f"by itself, {seconds:.0f} s after its launcher died", os.getpid())  # (not OOM)
    with contextlib.suppress(OSError):  # (its watcher's pipe may be gone)
        os.write(2, (f"\n[pretrain-cli] rank {rank}: its launcher died {seconds:.0f} s ago and this rank has not ended "
                     f"since (stuck in a collective, a peer gone, or a save longer than that): it ends itself now "
                     f"(SIGKILL), a checkpoint it was saving lost (`distributed.launcher.launch.end_with_launcher`)\n"
                     ).encode())
    os.kill(os.getpid(), signal.SIGKILL)
