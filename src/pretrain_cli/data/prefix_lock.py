"""One writer (`preprocess`, `merge-data`) per output prefix: `PREFIX.lock`, held with `flock` for the whole task.

Two runs into one prefix would share its in-progress names (`.bin.tmp`, `.sizes.tmp`, `.docs.tmp`): the second
truncates the first's files, both write on, the first publishes a `.bin` its `.idx` does not count with a sidecar
that calls it complete, and the second fails on a file the first renamed. The lock refuses the second at once,
before it reads or writes anything under the prefix. The kernel drops a `flock` when its holder ends, however
it ends (SIGKILL, the out-of-memory killer), so a lock file a dead run left never blocks the re-run; the file
holds the holder's `pid@host command` only for the refusal's line (on a shared file system the holder may run on
another machine, where its pid alone names nothing). A file system without `flock` (NFS without lockd: ENOLCK;
Lustre without `-o flock`: ENOSYS; EOPNOTSUPP) cannot refuse a second run; that is said once and the run goes on
(refusing would make preprocess unusable there), leaving no lock file behind. Release removes the file (while
still holding it), so a run that opened the name just before must check, once it holds a lock, that it holds the
file under the name. A forked process (a tokenizer worker of `--workers N`) closes its copy of the descriptor at
once: else the orphaned workers of a killed run keep the lock for seconds after it, and the re-run is refused
naming a dead pid.
"""
from __future__ import annotations

import errno
import fcntl
import os
import socket
from pathlib import Path

from pretrain_cli.atomic import first_missing, remove_made_dirs
from pretrain_cli.errors import UserError

_HELD: set[int] = set()  # this process's lock descriptors
_UNSUPPORTED = {errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP}  # no flock on this file system


def _drop_in_child() -> None:
    """After fork, in the child: close (never unlock: that would release the parent's lock) the inherited copies."""
    for fd in _HELD:
        try:
            os.close(fd)
        except OSError:
            pass
    _HELD.clear()


os.register_at_fork(after_in_child=_drop_in_child)


def _holder(fd: int) -> str:
    """`preprocess (pid N)`, or `... (pid N on host H)` when held from another machine, read from the lock file,
    which `fd` closes."""
    who, _, command = os.pread(fd, 256, 0).decode("ascii", "replace").strip().partition(" ")
    os.close(fd)
    pid, _, host = who.partition("@")
    where = f" on host {host}" if host and host != socket.gethostname() else ""
    return f"{command or 'run'} (pid {pid or 'unknown'}{where})"


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass


class PrefixLock:
    """Held from construction until `release()`; refused (UserError) while another process holds it."""

    def __init__(self, prefix: str, option: str = "--output_prefix", command: str = "preprocess", note=None):
        """`note` receives the one line said when the file system cannot lock (None: not said)."""
        self.path = prefix + ".lock"
        self._fd: int | None = None
        self._released = False
        parent = Path(self.path).parent
        # the outermost directory made for the lock: release() removes it if the run left it empty
        self._created = first_missing(parent)
        parent.mkdir(parents=True, exist_ok=True)
        while True:
            existed = os.path.exists(self.path)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise UserError(f"{prefix} is being written by another {_holder(fd)}; wait for it or choose "
                                f"another {option}") from None
            except OSError as e:
                os.close(fd)
                if not existed:  # the empty file this open made
                    _remove(self.path)
                if e.errno not in _UNSUPPORTED:
                    raise UserError(f"{self.path}: cannot lock it ({os.strerror(e.errno or 0)}); choose another "
                                    f"{option}") from None
                if note is not None:
                    note(f"this file system cannot lock {prefix} ({os.strerror(e.errno)}): two runs into it are "
                         "not refused")
                return
            try:
                held = os.path.samestat(os.fstat(fd), os.stat(self.path))
            except FileNotFoundError:
                held = False
            if held:  # (else the holder removed the name between our open and our lock: take the new file)
                break
            os.close(fd)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}@{socket.gethostname()} {command}\n".encode(), 0)
        self._fd = fd
        _HELD.add(fd)

    def release(self) -> None:
        if self._released:
            return
        self._released = True
        if self._fd is not None:  # (None: the file system could not lock; no file was kept)
            _remove(self.path)
            _HELD.discard(self._fd)
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
        remove_made_dirs(Path(self.path).parent, self._created)  # a run that wrote nothing leaves the tree as found

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()
        return False
