"""Naming the rank that died, on every rank of its host, in one line that replaces gloo's abort.

When a rank dies, gloo aborts the others from C++ (`terminate called ... Connection reset by peer`, then
Paddle's `C++ Traceback ... FatalError: Process abort signal`) with no word on who died. So each rank
publishes `host:pid` in the launcher's TCP store and forks a watcher (plain os calls only, no Paddle, its
own session) that

- carries the rank's stdout and stderr to its workerlog through a pipe, checking before it passes any output
  on that every rank of this host is still alive: output written after a peer's death (gloo's abort, its
  traceback) is dropped, since a process is counted dead from the moment it starts exiting, before its
  sockets close (`processes`);
- polls the ranks of this host every 0.05 s and, at a death, writes one line naming the rank that died,
  its host, pid and how it ended (`killed by SIGKILL`, `exited with code 2`), and stops its own rank;
- records, for launch.sh, how its own rank ended when that rank is the one that died (`job.record`).

Which rank died first is decided from what the watchers saw, shared in a directory of this host: a rank
seen alive while another was already dead is not the cause (`outlived.R`); each death's exit status is
read from /proc while the launcher has not reaped it yet (it polls once a second) (`status.R`); when all
that leaves two candidates, a rank aborted by SIGABRT (gloo's abort) is the consequence of the other.
Every watcher of the host reaches the same verdict, the dead rank's own one included. Peers on other hosts
are not watched: gloo's abort names nothing there (docs/RELIABILITY.md).
"""
from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from pathlib import Path

from pretrain_cli import atomic, processes
from pretrain_cli.run_config import ParallelConfig

_KEY = "pretrain_cli"
_WATCHER = None  # (pid of this rank's watcher, saved stdout fd, saved stderr fd, shared dir) while one runs
POLL = 0.05
SETTLE = 0.5  # after the first death: how long the other deaths (its consequences) take to be seen


def start(parallel: ParallelConfig, grace: float = 15.0) -> None:
    """Start this rank's watcher (a job of one process, or with no other rank on this host, needs none)."""
    if parallel.world_size <= 1:
        return
    import socket
    import tempfile
    import uuid

    from paddle.base import core

    from pretrain_cli.distributed import job

    store = core.create_or_get_global_tcp_store()
    host, me = socket.gethostname(), parallel.rank
    store.set(f"{_KEY}/peer/{me}", f"{host}:{os.getpid()}".encode())
    if me == 0:
        store.set(f"{_KEY}/job", uuid.uuid4().hex.encode())
    ranks = {me: os.getpid()}
    for r in range(parallel.world_size):
        if r != me:
            h, pid = bytes(store.get(f"{_KEY}/peer/{r}")).decode().rsplit(":", 1)
            if h == host:
                ranks[r] = int(pid)
    if len(ranks) == 1:
        return
    shared = Path(tempfile.gettempdir()) / f"pretrain-cli-watch-{bytes(store.get(f'{_KEY}/job')).decode()}"
    shared.mkdir(exist_ok=True)
    _spawn(_Watcher(me, ranks, host, shared, job.verdict_dir(), grace))


def _spawn(watcher: "_Watcher") -> None:
    """Fork `watcher` and send this process's stdout and stderr through it."""
    import sys

    sys.stdout.flush()
    sys.stderr.flush()
    read_end, write_end = os.pipe()
    log = os.dup(2)  # the workerlog the launcher opened
    child = os.fork()
    if child == 0:
        try:
            os.setsid()  # its own session: a launcher tearing down the job's process group must not kill it first
            os.close(write_end)
            os.dup2(read_end, 3)
            os.dup2(log, 4)
            os.closerange(5, 4096)  # no socket of the rank's stays open here
            watcher.run(3, 4)
        finally:
            os._exit(0)
    os.close(read_end)
    os.close(log)
    global _WATCHER
    _WATCHER = (child, os.dup(1), os.dup(2), watcher.shared)
    os.dup2(write_end, 1)
    os.dup2(write_end, 2)
    os.close(write_end)


def stop() -> None:
    """Stop this rank's watcher (its output passed on first); every rank calls it after its last collective,
    before any rank may exit."""
    global _WATCHER
    if _WATCHER is None:
        return
    import sys

    child, out, err, shared = _WATCHER
    _WATCHER = None
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(out, 1)
    os.dup2(err, 2)
    os.close(out)
    os.close(err)
    with contextlib.suppress(OSError):
        os.kill(child, signal.SIGTERM)  # it passes on what is left in the pipe and exits
        deadline = time.monotonic() + 5.0
        while os.waitpid(child, os.WNOHANG)[0] == 0:
            if time.monotonic() > deadline:
                os.kill(child, signal.SIGKILL)
                os.waitpid(child, 0)
                break
            time.sleep(0.01)
    import shutil

    shutil.rmtree(shared, ignore_errors=True)


class _Watcher:
    def __init__(self, me: int, ranks: dict, host: str, shared: Path, verdicts: Path | None, grace: float):
        self.me, self.ranks, self.host, self.shared, self.verdicts = me, ranks, host, shared, verdicts
        self.grace, self.parent = grace, ranks[me]
        self.statuses: dict[int, int | None] = {}
        self.stopping = False

    # ------------------------------------------------------------------ the loop
    def run(self, pipe: int, log: int) -> None:
        import select

        signal.signal(signal.SIGTERM, lambda *_: setattr(self, "stopping", True))
        open_pipe = True
        while True:
            if self.stopping:  # the rank is done: pass on its last output and leave
                self._drain(pipe, log if open_pipe else None)
                return
            chunk = b""
            if open_pipe and select.select([pipe], [], [], POLL)[0]:
                chunk = os.read(pipe, 1 << 16)
                open_pipe = bool(chunk)
            elif not open_pipe:
                time.sleep(POLL)
            gone = self._gone()
            if not gone:
                if chunk:
                    os.write(log, chunk)
                continue
            self._handle(gone, chunk, pipe if open_pipe else None, log)
            return

    def _handle(self, gone: set, chunk: bytes, pipe: int | None, log: int) -> None:
        """A rank of this host died: stop this rank if it still runs, settle who died first, say it once."""
        self._mark(gone)
        last_words = [chunk]
        if self.me not in gone:  # a survivor: what it writes from now on is the abort, not news
            last_words = []
            self._stop_parent()
        self._observe(gone)
        deadline = time.monotonic() + SETTLE
        while time.monotonic() < deadline:
            if pipe is not None:
                more = self._read_available(pipe)
                if self.me in gone:
                    last_words.append(more)
            self._observe(self._gone())
            time.sleep(POLL)
        causes = self._causes()
        if self.me in causes:  # its own output up to its death is the story (its error line, its traceback)
            os.write(log, b"".join(last_words))
            if pipe is not None:
                os.write(log, self._read_available(pipe))
        os.write(log, self._line(causes).encode())
        if self.me in causes and self.verdicts is not None:
            from pretrain_cli.distributed import job

            job.record(self.me, processes.exit_code(self.statuses.get(self.me)), "died", self._line([self.me]).strip(),
                       directory=self.verdicts, overwrite=False)
        time.sleep(2 * SETTLE)  # the other watchers of this host may still read the shared records
        import shutil

        shutil.rmtree(self.shared, ignore_errors=True)

    # ------------------------------------------------------------------ evidence
    def _gone(self) -> set:
        return {r for r, pid in self.ranks.items() if not processes.alive(pid)}

    def _mark(self, gone: set) -> None:
        """Every rank alive next to a dead one outlived it: it is not the cause."""
        for r in set(self.ranks) - gone:
            self._share(f"outlived.{r}", ",".join(map(str, sorted(gone))))

    def _observe(self, gone: set) -> None:
        """Share what this watcher sees: who outlived whom, and each death's exit status."""
        self._mark(gone)
        for r in gone:
            if r not in self.statuses:
                self.statuses[r] = self._status(self.ranks[r])
                if self.statuses[r] is not None:
                    self._share(f"status.{r}", str(self.statuses[r]))

    @staticmethod
    def _status(pid: int) -> int | None:
        """The exit status of a dead process, waiting a moment for an exiting one to become a zombie."""
        deadline = time.monotonic() + 0.5
        while True:
            status = processes.exit_status(pid)
            if status is not None or time.monotonic() > deadline:
                return status
            time.sleep(0.01)

    def _share(self, name: str, text: str) -> None:
        path = self.shared / name
        if not path.exists():
            with contextlib.suppress(OSError):
                self.shared.mkdir(exist_ok=True)
                atomic.write_text(path, text)

    def _shared_status(self, r: int) -> int | None:
        if self.statuses.get(r) is not None:
            return self.statuses[r]
        with contextlib.suppress(OSError, ValueError):
            return int((self.shared / f"status.{r}").read_text())
        return None

    def _causes(self) -> list[int]:
        """The ranks that died first: dead, never seen alive after another's death; of those, a rank aborted
        (SIGABRT: gloo's reaction to a closed socket) only when no other death explains it."""
        gone = sorted(self._gone())
        causes = [r for r in gone if not (self.shared / f"outlived.{r}").exists()] or gone
        own = [r for r in causes if (self._shared_status(r) or 0) & 0x7F != signal.SIGABRT]
        return own or causes

    # ------------------------------------------------------------------ acting
    def _stop_parent(self) -> None:
        deadline = time.monotonic() + self.grace
        while processes.alive(self.parent) and time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                os.kill(self.parent, signal.SIGKILL)
            time.sleep(0.02)

    def _line(self, causes: list[int]) -> str:
        statuses = [self._shared_status(r) for r in causes]
        named = ", ".join(f"rank {r} (pid {self.ranks[r]} on {self.host}) died: {processes.describe_status(st)}"
                          for r, st in zip(causes, statuses))
        usage = any(processes.exit_code(st) == 2 for st in statuses)  # a usage error: resuming would repeat it
        if self.me in causes:
            todo = ("Fix the error above, then re-run" if usage else "Re-run the same command (or launch with "
                    "MAX_RESTART) to resume from the newest complete checkpoint-N")
            return f"\n[pretrain-cli] {named}; the other ranks stop too. {todo}.\n"
        todo = "for its error" if usage else "for its cause; re-run to resume from the newest complete checkpoint-N"
        return f"\n[pretrain-cli] rank {self.me}: {named}; this rank stops too. See that rank's workerlog {todo}.\n"

    @staticmethod
    def _read_available(pipe: int) -> bytes:
        import select

        out = []
        while select.select([pipe], [], [], 0)[0]:
            chunk = os.read(pipe, 1 << 16)
            if not chunk:
                break
            out.append(chunk)
        return b"".join(out)

    def _drain(self, pipe: int, log: int | None) -> None:
        if log is not None:
            os.write(log, self._read_available(pipe))
