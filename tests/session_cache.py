"""What a test session builds once, for every pytest-xdist worker: a directory filled by the first worker that asks
for it, under a file lock, in the base directory the session's workers share.

xdist gives each worker a base temporary directory of its own (`popen-gwN`), so a session-scoped fixture runs once
per worker; fixtures whose result is only read (a corpus, a one-process reference run) build it here instead, and
the worker that comes second waits for the first and reads the same files."""
from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path


def shared_dir(tmp_path_factory) -> Path:
    """`<the session's base directory>/shared`: the parent of the workers' own base directories under xdist."""
    base = tmp_path_factory.getbasetemp()
    return (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "shared"


@contextlib.contextmanager
def _locked(path: Path):
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def built_once(d: Path, build) -> Path:
    """`d`, filled by `build(d)` by the first caller of the test session (the other workers wait on a file lock,
    then read it). A build that raised is not marked done: the next caller builds it again."""
    with _locked(d.with_name(d.name + ".lock")):
        if not (d / ".done").is_file():
            shutil.rmtree(d, ignore_errors=True)
            d.mkdir(parents=True)
            build(d)
            (d / ".done").write_text("")
    return d
