"""What Linux says about another process, by pid: whether it is alive, when it started, how it ended.

Three callers ask: the run lock (is the run that holds `run.lock` still there, or is the lock stale?), the
rank watcher (has a peer rank died, and of what? is it stopped?) and a launcher's join watch (which of its ranks are
alive in the join; its children, the ranks, to stop). Each reads `/proc/<pid>/stat`; elsewhere (no /proc) a
process that answers `kill(pid, 0)` counts as alive and its start time and exit status are unknown.

`/proc/<pid>/stat` fields (proc(5)), counted after the `(comm)` field, which may itself hold spaces: state
(3), the parent's pid (4), flags (9), starttime (22), exit_code (52, the `waitpid` status, readable until the parent
reaps the process). A process counts as dead from the moment it starts exiting (PF_EXITING in its flags): it closes
its sockets before it turns into a zombie, so a peer may see the closed socket before the zombie.
"""
from __future__ import annotations

import os
import signal

_PF_EXITING = 0x4


def _stat(pid: int) -> list[bytes] | None:
    """The fields of /proc/<pid>/stat from `state` on (index 0 = field 3), or None when unreadable."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None


def start_ticks(pid: int) -> str | None:
    """The process's start time since boot (None when unknown): a reused pid has another one."""
    fields = _stat(pid)
    return fields[19].decode() if fields is not None and len(fields) > 19 else None


def alive(pid: int, started: str | None = None) -> bool:
    """Whether `pid` is a running process that is not exiting (a zombie is dead, just not reaped yet); with
    `started` (`start_ticks` taken earlier), also that it is the same process, not a reused pid."""
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):  # no such process; a number no pid can be
        return False
    except PermissionError:
        pass  # another user's process: it exists
    fields = _stat(pid)
    if fields is None:
        return True  # no /proc: it answered kill(pid, 0)
    if fields[0] in (b"Z", b"X") or (len(fields) > 6 and int(fields[6]) & _PF_EXITING):
        return False
    return started is None or len(fields) <= 19 or fields[19].decode() == started


def children(pid: int) -> list[int]:
    """The pids of process `pid`'s children ([] without /proc): a launcher's ranks before they said who they are."""
    try:
        names = os.listdir("/proc")
    except OSError:
        return []
    out = []
    for name in filter(str.isdigit, names):
        fields = _stat(int(name))
        if fields is not None and len(fields) > 1 and fields[1] == str(pid).encode():  # field 4: the parent's pid
            out.append(int(name))
    return out


def stopped(pid: int, traced: bool = True) -> bool:
    """Whether `pid` is stopped (SIGSTOP, a debugger: state T or t): alive, and making no progress. `traced` False:
    a job-control stop only (T), not a tracer's (t: `gdb -p`, `py-spy dump`, `strace -p` touch a healthy process
    for a moment)."""
    fields = _stat(pid)
    return fields is not None and fields[0] in ((b"T", b"t") if traced else (b"T",))


def exit_status(pid: int) -> int | None:
    """How a dead, not yet reaped process ended, as `waitpid` reports it (None when it cannot be read: reaped
    already, still running, or not permitted)."""
    fields = _stat(pid)
    if fields is None or len(fields) <= 49 or fields[0] not in (b"Z", b"X"):
        return None
    return int(fields[49])


def exit_fd(pid: int) -> int | None:
    """A pidfd of `pid` (Linux 5.3+, any process, not only a child): it turns readable when the process exits, so a
    waiter can wake at that moment instead of polling. None where `os.pidfd_open` is missing or refused, or the
    process is reaped already. The caller closes it."""
    try:
        return os.pidfd_open(pid)
    except (OSError, AttributeError):
        return None


def describe_status(status: int | None) -> str:
    """`killed by SIGKILL`, `exited with code 2`, or `exit status unknown`."""
    if status is None:
        return "exit status unknown"
    if status & 0x7F:
        try:
            name = signal.Signals(status & 0x7F).name
        except ValueError:
            name = f"signal {status & 0x7F}"
        return f"killed by {name}"
    return f"exited with code {(status >> 8) & 0xFF}"


def exit_code(status: int | None) -> int | None:
    """The shell's exit code for a `waitpid` status: the code, or 128 + the signal."""
    if status is None:
        return None
    return 128 + (status & 0x7F) if status & 0x7F else (status >> 8) & 0xFF
