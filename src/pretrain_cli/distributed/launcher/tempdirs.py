"""A launch's directories in TMPDIR, each named by the process it belongs to, so that what a launch killed with SIGKILL
leaves there is removed by the next launch on the host.

Two kinds: launch.sh's verdict directory (each rank's end for `job.decide`; removed by launch.sh's EXIT trap) and a
node's launcher's join directory (its ranks' join marks for `joining`; removed when scripts/paddle_launch.py ends, by
a signal too: `remove_own`). A SIGKILL runs neither removal (launch.sh killed with its process group: a scheduler's
kill after its grace period, a test's clean-up; a node's launcher killed), and a long-lived node collected them for
ever. So each is named `<kind>-<host>-<owner pid>-<owner start ticks>-<random>` (the random part is `mkdtemp`'s: TMPDIR
is shared, and a name another user could guess would be theirs to take first), and `sweep` (run by `create`, and at
every start of scripts/paddle_launch.py) removes this user's directories of either kind made on this host whose owner
is gone: no process with that pid and start time, so a pid reused since is not the owner (and another host's pids say
nothing here, where TMPDIR is shared between hosts). A directory named the older way (`pretrain-cli-join-<random>`,
`pretrain-cli-verdicts.<random>`) names no owner and is left as it is.
"""
from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import stat
import tempfile
from pathlib import Path

from pretrain_cli import processes

JOIN, VERDICTS = "pretrain-cli-join", "pretrain-cli-verdicts"
# kind, host, pid, start ticks, mkdtemp's random part (which has no '-')
_NAME = re.compile(rf"(?:{JOIN}|{VERDICTS})-(.+)-(\d+)-(\d+)-[a-z0-9_]+")
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
    """Remove this user's directories of either kind made on this host in `root` (TMPDIR when None) whose owner is
    gone; the ones removed. Another host's or user's, and anything not a directory, are left alone."""
    where, host = Path(root or tempfile.gettempdir()), _host()
    try:
        names = os.listdir(where)
    except OSError:
        return []
    removed = []
    for name in names:
        match = _NAME.fullmatch(name)
        if match is None or match[1] != host or processes.alive(int(match[2]), None if match[3] == "0" else match[3]):
            continue
        path = where / name
        with contextlib.suppress(OSError):
            info = os.lstat(path)
            if stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid():
                shutil.rmtree(path)
                removed.append(path)
    return removed


def remove_own() -> None:
    """Remove the directories this process made for itself: at its exit, and first thing in scripts/paddle_launch.py's
    `end`, whose `os._exit` skips the exit functions."""
    while _OWN:
        shutil.rmtree(_OWN.pop(), ignore_errors=True)


def _host() -> str:
    return socket.gethostname().replace(os.sep, "_")
