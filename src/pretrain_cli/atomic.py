"""Publishing files and directories atomically: the one way anything in pretrain-cli is written.

Every file goes to a temporary name next to its destination, is flushed and fsynced, and is
renamed into place, so a reader (or a resumed run after kill -9 or a full disk) sees the old
file or the complete new one, never half of one; on any error the temporary is removed and the
error propagates, naming the file (a write's `No space left on device` names none of its own).
Directories (checkpoints) are built under a temporary name, fsynced file by file, and published with
one rename. A published file gets the mode `open()` would give it (0666 less
the umask; 0777 less it when executable): libraries that write through a private temporary (safetensors
creates 0600 files) would otherwise leave checkpoints that only their writer can read. A writer that
ends with nothing published removes the directories it made (`first_missing`, `remove_made_dirs`).
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import stat
import threading
from pathlib import Path

from pretrain_cli import processes


def tmp_path(path) -> Path:
    """`<path>.tmp<pid>`: unique per process, so concurrent writers never share a temporary."""
    path = Path(path)
    return path.with_name(f"{path.name}.tmp{os.getpid()}")


_TMP_SUFFIX = re.compile(r"\.tmp(\d+)$")  # what `tmp_path` appends


def stale_temporaries(directory) -> list[Path]:
    """The files in `directory` that `tmp_path` named for a process that is gone: a writer killed between
    opening its temporary and the rename (kill -9 while the loss curve was being drawn, say). A temporary of a
    live process (this one, or an `eval` running next to training) is kept: its rename is still to come."""
    found = []
    root = Path(directory)
    for p in root.iterdir() if root.is_dir() else ():
        m = _TMP_SUFFIX.search(p.name)
        if m and p.is_file() and not processes.alive(int(m.group(1))):
            found.append(p)
    return found


_UMASK_LOCK = threading.Lock()


def umask() -> int:
    """The process umask, read without changing it where Linux shows it (`os.umask` sets while it reads, and a
    file another thread creates in between would get the wrong mode)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    with _UMASK_LOCK:
        mask = os.umask(0o022)
        os.umask(mask)
    return mask


def shareable(path) -> None:
    """Give `path` the mode `open()` would have: 0666 less the umask (0777 less it when executable)."""
    st = os.stat(path)
    want = (0o777 if st.st_mode & 0o111 else 0o666) & ~umask()
    if stat.S_IMODE(st.st_mode) != want:
        os.chmod(path, want)


def fsync_dir(path) -> None:
    fd = os.open(str(path), os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def publishing(path, mode: str = "wb", encoding: str | None = None):
    """`with publishing(p) as f: f.write(...)` -> `p` appears complete, or not at all."""
    path = Path(path)
    tmp = tmp_path(path)
    try:
        with open(tmp, mode, encoding=encoding) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        if isinstance(e, OSError) and e.filename is None:  # a write's ENOSPC names no file: the one line names it
            e.filename = str(path)
        raise


def publish_file(tmp, path) -> None:
    """Publish a file that another library wrote to `tmp` (safetensors, numpy, a compiler)."""
    try:
        shareable(tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise


def write_bytes(path, data: bytes) -> None:
    with publishing(path, "wb") as f:
        f.write(data)


def write_text(path, text: str) -> None:
    with publishing(path, "w", encoding="utf-8") as f:
        f.write(text)


def write_json(path, obj, sort_keys: bool = False) -> None:
    with publishing(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, default=str, sort_keys=sort_keys)
        f.write("\n")


def fsync_tree(root) -> None:
    """fsync every file and directory under `root`, giving each file the mode `open()` would (`shareable`)."""
    for dirpath, _, files in os.walk(root):
        for name in files:
            shareable(os.path.join(dirpath, name))
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(dirpath)


def remove_tree(path) -> None:
    """Delete a directory so that a crash midway never leaves it half-deleted under its own name."""
    path = Path(path)
    doomed = path.with_name(path.name + ".deleting")
    os.replace(path, doomed)
    shutil.rmtree(doomed, ignore_errors=True)


def publish_dir(tmp, final) -> Path:
    """fsync every file under `tmp`, then make it `final` with one rename (replacing an older `final`)."""
    tmp, final = Path(tmp), Path(final)
    fsync_tree(tmp)
    if final.exists():
        remove_tree(final)
    os.replace(tmp, final)
    fsync_dir(final.parent)
    return final


def first_missing(parent: Path) -> Path | None:
    """The outermost directory of `parent`'s chain that does not exist yet: what a run will create to write there."""
    return next((p for p in reversed([parent, *parent.parents]) if not p.exists()), None)


def remove_made_dirs(d: Path, created: Path | None) -> None:
    """Remove `d` and its parents up to `created` (`first_missing`'s answer before the run made them) while they are
    empty: a run that leaves nothing there leaves the tree as it found it."""
    while created is not None:
        try:
            d.rmdir()
        except OSError:
            return
        if d == created:
            return
        d = d.parent
