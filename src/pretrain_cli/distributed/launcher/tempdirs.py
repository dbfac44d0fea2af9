"""A launch's directories in TMPDIR, each removed when its owners are gone, so that what a launch killed with SIGKILL
leaves there is removed by the next launch on the host.

Three kinds: launch.sh's verdict directory (each rank's end for `job.decide`; removed by launch.sh's EXIT trap), a
node's launcher's join directory (its ranks' join marks for `joining`; removed when scripts/paddle_launch.py ends, by
a signal too: `remove_own`), and a job's watch directory on this host (its ranks' progress records and their
watchers' evidence, `watchdog`; removed by the host's last watcher to finish). A SIGKILL runs none of these removals
(launch.sh killed with its process group: a scheduler's kill after its grace period, a test's clean-up; a node's
launcher killed; every process of a job killed at once, its rank watchers too), and a long-lived node collected them
for ever. So the verdict and join directories are named `<kind>-<host>-<owner pid>-<owner start ticks>-<random>` (the
random part is `mkdtemp`'s: TMPDIR is shared, and a name another user could guess would be theirs to take first), and
a watch directory, which the host's ranks of one job share whichever launcher started them, holds `OWNERS`, a file
every rank and its forked watcher keep a shared `flock` on while they live (`watch_dir`; the kernel drops a lock with
the last process holding it, SIGKILL too). `sweep` (run by `create`, by `watch_dir` at every rank's start, so under a
bare `python -m paddle.distributed.launch` too, and at every start of scripts/paddle_launch.py) removes this user's
directories made on this host whose owners are gone: no process with that pid and start time, so a pid reused since is
not the owner (and another host's pids say nothing here, where TMPDIR is shared between hosts); for a watch directory,
no lock left on its `OWNERS` (the sweep takes it exclusively while it removes the directory, and a rank that finds the
directory gone under its lock makes it again). A directory named the older way (`pretrain-cli-join-<random>`,
`pretrain-cli-verdicts.<random>`, a watch directory without `OWNERS`) names no owner and is left as it is.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import shutil
import socket
import stat
import tempfile
from pathlib import Path

from pretrain_cli import processes

JOIN, VERDICTS = "pretrain-cli-join", "pretrain-cli-verdicts"
WATCH, FRESH = "pretrain-cli-watch", "pretrain-cli-watchfresh"  # a job's watch directory; one being made (`watch_dir`)
OWNERS = "owners.lock"  # in a watch directory: locked (shared) by every process that uses it
# kind, host, pid, start ticks, mkdtemp's random part (which has no '-')
_NAME = re.compile(rf"(?:{JOIN}|{VERDICTS}|{FRESH})-(.+)-(\d+)-(\d+)-[a-z0-9_]+")
_WATCH_NAME = re.compile(rf"{WATCH}-[0-9a-f]{{32}}-(.+)")  # the job id (rank 0's uuid4 hex), the host
_OWN: list[Path] = []  # the directories this process made for itself (`remove_own`)


def create(kind: str, owner: int | None = None) -> Path:
    """A new directory of `kind` (`JOIN`, `VERDICTS`) in TMPDIR for process `owner` (this process when None: removed at
    its exit, and by `remove_own`), after a `sweep`. OSError when TMPDIR takes none."""
    sweep()
    pid = owner or os.getpid()
    path = Path(tempfile.mkdtemp(prefix=f"{kind}-{_host()}-{pid}-{processes.start_ticks(pid) or 0}-"))
    if pid == os.getpid():
        if not _OWN:
            import atexit

            atexit.register(remove_own)
        _OWN.append(path)
    return path


def sweep(root: str | os.PathLike | None = None) -> list[Path]:
    """Remove this user's directories of every kind made on this host in `root` (TMPDIR when None) whose owners are
    gone; the ones removed. Another host's or user's, and anything not a directory, are left alone."""
    where, host = Path(root or tempfile.gettempdir()), _host()
    try:
        names = os.listdir(where)
    except OSError:
        return []
    removed = []
    for name in names:
        path, match, watch = where / name, _NAME.fullmatch(name), _WATCH_NAME.fullmatch(name)
        if match is not None:
            if match[1] != host or processes.alive(int(match[2]), None if match[3] == "0" else match[3]):
                continue
        elif watch is None or watch[1] != host:
            continue
        with contextlib.suppress(OSError):
            info = os.lstat(path)
            if stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid() and (match or _unowned_removed(path)):
                if match:
                    shutil.rmtree(path)
                removed.append(path)
    return removed


def _unowned_removed(path: Path) -> bool:
    """Remove watch directory `path` if no process holds a lock on its `OWNERS` (kept locked meanwhile: a rank
    arriving waits, then finds its lock's file gone and makes the directory again); True if removed. One without
    `OWNERS` (named the older way) is kept."""
    try:
        fd = os.open(path / OWNERS, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # OSError (EWOULDBLOCK) while an owner lives
        shutil.rmtree(path)
        return True
    finally:
        os.close(fd)  # (the lock with it)


def watch_dir(job_id: str) -> tuple[Path, int]:
    """This host's watch directory of job `job_id` in TMPDIR (one for every rank of the job on this host, whichever
    launcher started it: the host's verdict is theirs together), after a `sweep`; and a descriptor holding a shared
    lock on its `OWNERS` for this process (a forked watcher keeps it too, `watchdog._spawn`): while any holder lives,
    no sweep removes the directory. A directory is made whole elsewhere (`FRESH`, named by this process like the
    other kinds) and renamed into place with its lock held, so no sweep ever sees it unowned. OSError when TMPDIR
    takes none."""
    sweep()
    final, pid = Path(tempfile.gettempdir()) / f"{WATCH}-{job_id}-{_host()}", os.getpid()
    for _ in range(1000):  # (a directory of that name without OWNERS, which no rank makes, ends it)
        with contextlib.suppress(FileNotFoundError):
            fd = os.open(final / OWNERS, os.O_RDONLY | os.O_NOFOLLOW)
            fcntl.flock(fd, fcntl.LOCK_SH)  # (waits while a sweep that found no owner removes the directory)
            if os.fstat(fd).st_nlink:
                return final, fd
            os.close(fd)  # removed by that sweep: made again below
            continue
        fresh = Path(tempfile.mkdtemp(prefix=f"{FRESH}-{_host()}-{pid}-{processes.start_ticks(pid) or 0}-",
                                      dir=final.parent))
        fd = os.open(fresh / OWNERS, os.O_RDONLY | os.O_CREAT, 0o600)
        fcntl.flock(fd, fcntl.LOCK_SH)
        try:
            os.rename(fresh, final)
            return final, fd
        except OSError as e:  # another rank of this host made it first: take a lock on that one
            os.close(fd)
            shutil.rmtree(fresh, ignore_errors=True)
            if e.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                raise
    raise OSError(errno.EEXIST, f"{final} exists without {OWNERS}; remove it")


def remove_own() -> None:
    """Remove the directories this process made for itself: at its exit, and first thing in scripts/paddle_launch.py's
    `end`, whose `os._exit` skips the exit functions."""
    while _OWN:
        shutil.rmtree(_OWN.pop(), ignore_errors=True)


def _host() -> str:
    return socket.gethostname().replace(os.sep, "_")
