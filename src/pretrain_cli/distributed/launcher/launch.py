"""What `paddle.distributed.launch` told this process: world size and ranks, read from its environment.

The one place that reads the launcher's variables (no Paddle import: `train` needs the world size
to resolve the run before Paddle starts); and a launched rank's tie to its launcher (`end_with_launcher`).
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


def launcher_mark() -> str:
    """What scripts/paddle_launch.py puts in `LAUNCHER` for its ranks: this process, pid and start time."""
    from pretrain_cli import processes

    return f"{os.getpid()}:{processes.start_ticks(os.getpid()) or ''}"


def end_with_launcher() -> None:
    """A launched rank is SIGKILLed by the kernel when its launcher dies (Linux's parent-death signal).

    Why: Paddle's launcher starts every rank in a session of its own (`os.setsid`), so a launcher killed with its
    process group (`kill -9 -PGID` of launch.sh, a test's clean-up, a scheduler's SIGKILL after its grace period)
    left its ranks and their watchers running with PPID 1: training on, or waiting for a peer for up to
    `hang_timeout`. A launcher that ends on its own has ended or killed its ranks first, so this changes nothing
    there. A launcher that died before this call (`LAUNCHER` names it) ends the rank here."""
    if not os.environ.get("PADDLE_TRAINER_ID", "").strip() or not sys.platform.startswith("linux"):
        return
    import ctypes
    import signal

    from pretrain_cli import processes

    if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        return
    pid, _, started = os.environ.get(LAUNCHER, "").partition(":")
    if pid.isdigit() and not processes.alive(int(pid), started or None):
        os.kill(os.getpid(), signal.SIGKILL)
