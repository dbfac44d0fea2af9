"""Naming the rank that died, on every rank of its host, in one line that replaces gloo's abort: this module is
the rank's side (`start` forks the watcher and sends the rank's output through it, `stop` ends it).

When a rank dies, gloo aborts the others from C++ (`terminate called ... Connection reset by peer`, then
Paddle's `C++ Traceback ... FatalError: Process abort signal`) with no word on who died. So each rank
publishes `host:pid` in the launcher's TCP store and forks a watcher (`distributed.launcher.watcher`: plain os
calls only, no Paddle, its own session) that

- carries the rank's stdout and stderr to its workerlog through a pipe, checking before it passes any output
  on that every rank of this host is still alive: output written after a peer's death (gloo's abort, its
  traceback) is dropped, since a process is counted dead from the moment it starts exiting, before its
  sockets close (`processes`), while what the rank wrote before it is kept (`watcher.before_abort`);
- polls the ranks of this host every 0.05 s and, at a death, writes one line naming the rank that died,
  its host, pid and how it ended (`killed by SIGKILL`, `exited with code 2`), and stops its own rank;
- records, for launch.sh, how its own rank ended when that rank is the one that died (`job.record`).

Which rank died first is decided from what the watchers saw, shared in a directory of this host
(`distributed.launcher.verdict`): a rank seen alive while another was already dead is not the cause (`outlived.R`); each
death's exit status is read from /proc while the launcher has not reaped it yet (it polls once a second) (`status.R`);
when all that leaves two candidates, a rank aborted by SIGABRT (gloo's abort) is the consequence of the other, and when
every dead rank was aborted, a live rank whose last progress mark is older than theirs (`distributed.launcher.progress`)
is the cause: it hung, and gloo gave up waiting for it. The verdict is decided once: the first watcher to settle
publishes it (`cause`, created exclusively) and every other watcher of the host writes what it says, so every log names
the same rank; the shared directory is removed by the last watcher to finish (`done.R`), never under a watcher still
reading it, and, when every rank and watcher of the host was killed at once (SIGKILL: none finished), by the next launch
or rank on the host (`tempdirs.watch_dir`: each rank and its watcher hold a lock on it).

A rank that makes no progress (`distributed.launcher.progress.hung`, checked every `watcher.HANG_POLL` s) is named the
same way: `rank R (pid P on H) made no progress for N s while in <phase> at step S`; every watcher of the host SIGKILLs
its own rank (a stopped process too) and the hung rank's watcher records exit `watcher.HUNG` for launch.sh. A straggler
is named once in every log of the host. Peers on other hosts are not watched, but a rank alone on its host (one CPU
process per node, launch.sh's default) has a watcher too: without it a `kill -STOP` there hung its node for ever, and a
kill there was named nowhere. When every death on a host is gloo's abort (or its timeout) and no rank of the host hung,
the cause is a rank on another host: the line says so and points at that node's log (`Watcher._lost`,
docs/RELIABILITY.md).

A watcher that ends while its rank runs (killed: `kill -9` of the wrong pid, an OOM killer's choice) is said once by
its rank (`_watch_watcher`, a thread of the rank woken by the watcher's pidfd): what the watcher's pipe still holds is
copied to the workerlog, the rank's output goes there directly again, and one line says that training goes on
unwatched. The rank holds a close-on-exec copy of the pipe's read end meanwhile, so that a write between the death and
the take-over waits in the pipe instead of failing (EPIPE: a lost line, a print that raises). The bound: the pipe holds
as much as the system lets it (`_spawn`: 1 MiB or `/proc/sys/fs/pipe-max-size` if less; 64 KiB where raising it
fails), and a write waits once that much is unread; the take-over that drains it is a Python thread needing the GIL
and `_LOCK`, so a rank writing that much after the death from C++ while it holds the GIL (glog, std::cerr in a pybind
call, a C++ abort's text), or from a native thread while its main thread holds the GIL, blocks for good; alone on its
host, nothing names it. Ending a healthy run for the watcher's death would lose the steps since the last checkpoint;
the host's other ranks' watchers, if any, still name a death or hang of any rank of the host in their own logs.

A rank's part of a save is waited for by rank 0 in no collective (it polls the checkpoint's directory for the rank's
completion record), so neither gloo nor rank 0's host's watchers tell rank 0 of a death on another host: while a
rank writes a record someone waits for (`owing`), its watcher writes a death notice in its place if the rank dies
or hangs first (`Watcher._pay`), and rank 0 ends at once, naming the rank (`training.shard_writer.collect`).
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import threading
import time
from pathlib import Path

from pretrain_cli.distributed.launcher import progress
from pretrain_cli.distributed.launcher.watcher import Watcher, read_held
from pretrain_cli.run_layout import ParallelConfig

_KEY = "pretrain_cli"
_WATCHER = None  # (pid of this rank's watcher, saved stdout fd, saved stderr fd, shared dir, rank, the pipe's read
# end kept by the rank) while one runs
_LOCK = threading.Lock()  # who ends the watcher's part of `_WATCHER`: `stop`, or `_gone` after its death
_OWNERS = None  # this rank's descriptor holding its shared lock on the watch directory (`tempdirs.watch_dir`)
_ALONE = None  # (launch.sh's verdict directory, rank) of a job of one process launched by launch.sh (`start`)


def start(parallel: ParallelConfig, grace: float = 15.0, hang_timeout: float | None = None,
          output_dir: str | None = None, overwrite: bool = False, resume_from: str | None = None) -> None:
    """Start this rank's watcher (a job of one process needs none; a rank alone on its host gets one too: it names
    its own rank's death or hang, and a gloo abort as the loss of a rank on another host); `hang_timeout`: the run's
    key (`distributed.launcher.progress.allowance`); `output_dir`, `overwrite`, `resume_from`: the run's output
    settings, from which its line's re-run advice names where the same command starts (`rerun`). A job of one
    process launched by launch.sh keeps its progress record and its stop's note (`stop_began`) in launch.sh's verdict
    directory instead (`_ALONE`): its launcher names its death from them (`failure_report._record_alone`)."""
    if parallel.world_size <= 1:
        from pretrain_cli.distributed.launcher import job

        global _ALONE
        directory = job.verdict_dir()
        if directory is not None and directory.is_dir():
            _ALONE = (directory, parallel.rank)
            with contextlib.suppress(OSError):
                progress.open_record(directory / f"progress.{parallel.rank}")
        return
    import socket
    import uuid

    from paddle.base import core

    from pretrain_cli.distributed.launcher import job, tempdirs

    store = core.create_or_get_global_tcp_store()
    host, me = socket.gethostname(), parallel.rank
    store.set(f"{_KEY}/peer/{me}", f"{host}:{os.getpid()}".encode())
    if me == 0:
        store.set(f"{_KEY}/job", uuid.uuid4().hex.encode())
    ranks, remote = {me: os.getpid()}, {}
    for r in range(parallel.world_size):
        if r != me:
            h, pid = bytes(store.get(f"{_KEY}/peer/{r}")).decode().rsplit(":", 1)
            if h == host:
                ranks[r] = int(pid)
            else:
                remote[r] = h
    # the host's own directory, even where TMPDIR is shared between hosts: a verdict is about this host's ranks; held
    # (`_OWNERS`) by this rank and its watcher, so that a launch after a SIGKILL of both removes it (`tempdirs`)
    global _OWNERS
    shared, _OWNERS = tempdirs.watch_dir(bytes(store.get(f"{_KEY}/job")).decode())
    progress.open_record(shared / f"progress.{me}")
    _spawn(Watcher(me, ranks, host, shared, job.verdict_dir(), grace, hang_timeout, remote, output_dir, overwrite,
                   resume_from))


def _spawn(watcher: Watcher) -> None:
    """Fork `watcher` and send this process's stdout and stderr through it; the watcher keeps this rank's lock on the
    watch directory (`_OWNERS`, as fd 5): it outlives its rank at a death, and uses the directory until it ends."""
    import sys

    sys.stdout.flush()
    sys.stderr.flush()
    read_end, write_end = os.pipe()
    _widen(write_end)
    log = os.dup(2)  # the workerlog the launcher opened
    child = os.fork()
    if child == 0:
        try:
            os.setsid()  # its own session: a launcher tearing down the job's process group must not kill it first
            os.close(write_end)
            # (the lock first moved clear of 3-5, which it may hold: a dup2 onto it would drop it)
            held = None if _OWNERS is None else fcntl.fcntl(_OWNERS, fcntl.F_DUPFD, 64)
            os.dup2(read_end, 3)
            os.dup2(log, 4)
            if held is not None:
                os.dup2(held, 5)
            os.closerange(5 if held is None else 6, 4096)  # no socket of the rank's stays open here
            watcher.announce(True)
            watcher.run(3, 4)
        finally:
            watcher.announce(False)
            os._exit(0)
    os.close(log)
    global _WATCHER
    # read_end stays open here (close-on-exec, as os.pipe makes it): the pipe keeps a reader should the watcher die
    _WATCHER = (child, os.dup(1), os.dup(2), watcher.shared, watcher.me, read_end)
    os.dup2(write_end, 1)
    os.dup2(write_end, 2)
    os.close(write_end)
    # (the thread takes no process-directed stop signal: each must reach the main thread, as in `launch`)
    held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT, signal.SIGHUP})
    try:
        threading.Thread(target=_watch_watcher, args=(child,), name="watcher-watch", daemon=True).start()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)


def _widen(pipe: int, most: int = 1 << 20) -> None:
    """Raise the pipe's capacity to `most` bytes, or the system's limit if lower (best effort: the kernel's 64 KiB
    stays where it refuses): what the rank may write after its watcher's death before a write waits (module doc)."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        limit = int(Path("/proc/sys/fs/pipe-max-size").read_text())
        fcntl.fcntl(pipe, fcntl.F_SETPIPE_SZ, min(most, limit))


def _drain(kept: int, to: int, quiet: float = 0.5) -> None:
    """Copy what the pipe's read end `kept` holds to `to` until nothing more comes for `quiet` s (or every write end
    is closed): a write that waited on a full pipe goes on as it is read, and what it adds is copied too. An empty
    pipe alone does not end it: on a loaded host the woken writer may not have refilled it yet, and closing the read
    end then cut that write short (EPIPE: ~1 MiB of a 3 MiB line lost, test_watcher_gone)."""
    import select

    with contextlib.suppress(OSError):
        while True:
            if chunk := read_held(kept):
                os.write(to, chunk)
                continue
            if not select.select([kept], [], [], quiet)[0]:
                return  # nothing for `quiet` s: no write was waiting
            chunk = os.read(kept, 1 << 16)  # readable: bytes, or b"" once no write end is open
            if not chunk:
                return
            os.write(to, chunk)


def _watch_watcher(child: int, poll: float = 1.0) -> None:
    """Wait for the watcher `child` to end (its pidfd; without one, polled every `poll` s), then `_gone`."""
    import select

    from pretrain_cli import processes

    fd = processes.exit_fd(child)
    try:
        if fd is not None:
            select.select([fd], [], [])
        else:
            while processes.alive(child):
                time.sleep(poll)
    finally:
        if fd is not None:
            os.close(fd)
    _gone(child)


def _gone(child: int) -> None:
    """The watcher `child` ended while its rank runs (not by `stop`): what its pipe holds, then the rank's output, to
    the workerlog directly, one line there; the host's watch directory stays this rank's for its notes (`leave_alone`,
    `stop_began`)."""
    global _WATCHER
    with _LOCK:
        if _WATCHER is None or _WATCHER[0] != child:  # stopped by its rank (`stop`): nothing gone
            return
        _, out, err, shared, me, kept = _WATCHER
        _WATCHER = (None, None, None, shared, me, None)
    from pretrain_cli import processes

    status = None
    with contextlib.suppress(OSError):
        status = os.waitpid(child, 0)[1]
    with contextlib.suppress(OSError):  # what the rank wrote since the watcher's last read: before the pipe goes
        os.write(err, read_held(kept))
    os.dup2(out, 1)
    os.dup2(err, 2)
    _drain(kept, 2)  # writes that raced the dup2 (they reached the pipe, or waited on it full): copied too
    os.close(kept)
    os.close(out)
    os.close(err)
    with contextlib.suppress(OSError):
        os.write(2, (f"\n[pretrain-cli] rank {me}: its watcher (pid {child}) ended: "
                     f"{processes.describe_status(status)}; training goes on unwatched: a rank of this host that dies "
                     f"or hangs is no longer named in this log (only in the logs of the host's other ranks, if any)\n"
                     ).encode())


def stop() -> None:
    """Stop this rank's watcher (its output passed on first); every rank calls it after its last collective,
    before any rank may exit."""
    global _WATCHER
    with _LOCK:
        if _WATCHER is None:
            progress.close_record()  # (a rank alone's, if any: `start`)
            return
        child, out, err, shared, _, kept = _WATCHER
        _WATCHER = None
    if child is None:  # it ended before (`_gone`): the output goes to the workerlog already
        progress.close_record()
        return
    import sys

    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(out, 1)
    os.dup2(err, 2)
    os.close(out)
    os.close(err)
    # (no write of the rank's goes to the pipe now: the watcher reads the rest, or, dead already, leaves it to us)
    dead = False
    with contextlib.suppress(OSError):
        dead = os.waitpid(child, os.WNOHANG)[0] != 0
    if dead:
        _drain(kept, 2)
    os.close(kept)
    progress.close_record()
    if dead:  # (reaped: its pid may be another process's now)
        return
    with contextlib.suppress(OSError):
        os.kill(child, signal.SIGTERM)  # it passes on what is left in the pipe and exits (`_finish`)
        deadline = time.monotonic() + 5.0
        while os.waitpid(child, os.WNOHANG)[0] == 0:
            if time.monotonic() > deadline:
                os.kill(child, signal.SIGKILL)
                os.waitpid(child, 0)
                break
            time.sleep(0.01)


def leave_alone(line: str) -> None:
    """Stop this rank's watcher as a rank that leaves alone, on purpose, with its own error (`line`): noted first for
    the host's other watchers, which then take its exit for no death (`departure`)."""
    if _WATCHER is not None:
        from pretrain_cli.distributed.launcher import departure

        departure.note(_WATCHER[3], _WATCHER[4], line)
    stop()


def holding(path: Path) -> None:
    """This rank holds the file `path`, which names its pid (rank 0: the run lock): should the rank end without its
    `finally` after another rank left with its error, its watcher removes it for it (`departure`)."""
    if _WATCHER is not None:
        from pretrain_cli import atomic

        with contextlib.suppress(OSError):
            atomic.write_text(_WATCHER[3] / f"holds.{_WATCHER[4]}", str(Path(path).absolute()))


def stop_began(clock=None) -> None:
    """This rank's stop begins (`training.stop_signals`: its signal, or the ranks' agreement on another's): noted once
    (`stopping.began`), and left for the host's watchers as `stopping.<rank>` in the watch directory, so that a SIGKILL
    during the stop is named as the launcher's limit (`verdict_line.died`); a rank alone under launch.sh, without a
    watcher, leaves it in launch.sh's verdict directory (`_ALONE`), for its launcher (`failure_report._record_alone`),
    which named such a kill `killed by SIGKILL (often the kernel's OOM killer ...)`. Best effort; else no file."""
    from pretrain_cli.distributed.launcher import stopping

    text = stopping.began(clock)
    notes = (_WATCHER[3], _WATCHER[4]) if _WATCHER is not None else _ALONE
    if notes is None or text is None:
        return
    from pretrain_cli import atomic

    with contextlib.suppress(OSError):
        atomic.write_text(notes[0] / f"stopping.{notes[1]}", text)


@contextlib.contextmanager
def owing(path: Path):
    """While this rank writes `path` (its completion record of a save, which rank 0 waits for by polling the
    directory, in no collective), its watcher writes a death notice there if the rank dies or hangs first
    (`Watcher._pay`): rank 0, on another host too, reads the death at once instead of waiting out `hang_timeout`.
    Nothing without a watcher (one process)."""
    if _WATCHER is None:
        yield
        return
    from pretrain_cli import atomic

    note = _WATCHER[3] / f"owed.{_WATCHER[4]}"  # what the watcher reads: the host's watch directory
    with contextlib.suppress(OSError):
        atomic.write_text(note, str(Path(path).absolute()))
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            note.unlink(missing_ok=True)
