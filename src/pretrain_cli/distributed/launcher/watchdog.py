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
that leaves two candidates, a rank aborted by SIGABRT (gloo's abort) is the consequence of the other, and when
every dead rank was aborted, a live rank whose last progress mark is older than theirs (`distributed.launcher.progress`) is
the cause: it hung, and gloo gave up waiting for it. The verdict is decided once: the first watcher to settle
publishes it (`cause`, created exclusively) and every other watcher of the host writes what it says, so every log
names the same rank; the shared directory is removed by the last watcher to finish (`done.R`), never under a
watcher still reading it.

A rank that makes no progress (`distributed.launcher.progress.hung`, checked every `HANG_POLL` s) is named the same way:
`rank R (pid P on H) made no progress for N s while in <phase> at step S`; every watcher of the host SIGKILLs its
own rank (a stopped process too) and the hung rank's watcher records exit `HUNG` for launch.sh. A straggler is
named once in every log of the host. Peers on other hosts are not watched: gloo's abort names nothing there
(docs/RELIABILITY.md).
"""
from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from pathlib import Path

from pretrain_cli import atomic, processes
from pretrain_cli.distributed.launcher import progress
from pretrain_cli.run_layout import ParallelConfig

_KEY = "pretrain_cli"
_WATCHER = None  # (pid of this rank's watcher, saved stdout fd, saved stderr fd, shared dir) while one runs
POLL = 0.05
SETTLE = 0.5  # after the first death: how long the other deaths (its consequences) take to be seen
HANG_POLL = 0.5  # how often the progress records are read
HUNG = 124  # the exit code of a job ended because a rank made no progress (as timeout(1)'s)


def start(parallel: ParallelConfig, grace: float = 15.0, hang_timeout: float | None = None) -> None:
    """Start this rank's watcher (a job of one process, or with no other rank on this host, needs none);
    `hang_timeout`: the run's key (`distributed.launcher.progress.allowance`)."""
    if parallel.world_size <= 1:
        return
    import socket
    import tempfile
    import uuid

    from paddle.base import core

    from pretrain_cli.distributed.launcher import job

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
    progress.open_record(shared / f"progress.{me}")
    _spawn(_Watcher(me, ranks, host, shared, job.verdict_dir(), grace, hang_timeout))


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
            watcher.announce(True)
            watcher.run(3, 4)
        finally:
            watcher.announce(False)
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
    progress.close_record()
    with contextlib.suppress(OSError):
        os.kill(child, signal.SIGTERM)  # it passes on what is left in the pipe and exits (`_finish`)
        deadline = time.monotonic() + 5.0
        while os.waitpid(child, os.WNOHANG)[0] == 0:
            if time.monotonic() > deadline:
                os.kill(child, signal.SIGKILL)
                os.waitpid(child, 0)
                break
            time.sleep(0.01)


class _Watcher:
    def __init__(self, me: int, ranks: dict, host: str, shared: Path, verdicts: Path | None, grace: float,
                 hang_timeout: float | None = None):
        self.me, self.ranks, self.host, self.shared, self.verdicts = me, ranks, host, shared, verdicts
        self.grace, self.parent, self.hang_timeout = grace, ranks[me], hang_timeout
        self.statuses: dict[int, int | None] = {}
        self.stopping = False
        self.named: set = set()  # stragglers named in this rank's log already

    # ------------------------------------------------------------------ the loop
    def run(self, pipe: int, log: int) -> None:
        import select

        signal.signal(signal.SIGTERM, lambda *_: setattr(self, "stopping", True))
        open_pipe, next_check = True, time.monotonic() + HANG_POLL
        while True:
            if self.stopping:  # the rank is done: pass on its last output and leave
                self._drain(pipe, log if open_pipe else None)
                return self._finish()
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
                if time.monotonic() >= next_check:
                    next_check = time.monotonic() + HANG_POLL
                    cause = self._decided() or self._check_progress(log)
                    if cause is not None:
                        return self._end(cause, [], pipe if open_pipe else None, log)
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
        while time.monotonic() < deadline and self._decided() is None:
            if pipe is not None:
                more = self._read_available(pipe)
                if self.me in gone:
                    last_words.append(more)
            self._observe(self._gone())
            time.sleep(POLL)
        self._end(self._decided() or self._publish(self._death_cause()), last_words, pipe, log)

    def _end(self, cause: dict, last_words: list, pipe: int | None, log: int) -> None:
        """Say `cause` (the host's one verdict) in this rank's log, stopping this rank first; record it for
        launch.sh when this rank is the cause; leave once the others are done with the shared records."""
        self._stop_parent()  # (a hung rank too: SIGKILL reaches a stopped process)
        culprits = cause["ranks"]
        if self.me in culprits:  # its own output up to its death is the story (its error line, its traceback)
            os.write(log, b"".join(last_words))
            if pipe is not None:
                os.write(log, self._read_available(pipe))
        os.write(log, self._line(cause).encode())
        if self.me in culprits and self.verdicts is not None:
            from pretrain_cli.distributed.launcher import job

            code = HUNG if cause["kind"] == "hung" else processes.exit_code(cause["statuses"][culprits.index(self.me)])
            job.record(self.me, code, cause["kind"], self._line({**cause, "ranks": [self.me]}, own=True).strip(),
                       directory=self.verdicts, overwrite=False)
        self._finish()

    # ------------------------------------------------------------------ evidence
    def _gone(self) -> set:
        return {r for r, pid in self.ranks.items() if not processes.alive(pid)}

    def _mark(self, gone: set) -> None:
        """Every rank alive next to a dead one outlived it: it is not the cause (unless it is stopped: `stopped.R`,
        read before any watcher kills it)."""
        for r in set(self.ranks) - gone:
            if processes.stopped(self.ranks[r]):
                self._share(f"stopped.{r}", "")
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

    def _death_cause(self) -> dict:
        """The verdict of a death: the ranks that died first; or a live rank that hung, when they died of waiting
        for it: gloo's timeout aborts a waiting rank (SIGABRT) or raises in it (exit 1), and the live rank is
        stopped (`kill -STOP`), or made no progress for `progress.WAITED` s outside a collective. A stopped rank whose
        last mark is older than a killed rank's is named too."""
        causes = self._causes()
        statuses = [self._shared_status(r) for r in causes]
        records, now = progress.read(self.shared, self.ranks), time.time()
        first = min((records[r]["since"] for r in causes if r in records), default=now)
        timeouts = all(st is not None and (st & 0x7F == signal.SIGABRT or processes.exit_code(st) == 1)
                       for st in statuses)
        idle = []
        for r in set(records) - set(causes):  # alive, or killed by its watcher since: it outlived the causes
            pid, since = self.ranks[r], records[r]["since"]
            if not (processes.alive(pid) or (self.shared / f"outlived.{r}").exists()):
                continue
            stopped = self._stopped(r) and (timeouts or since < first)
            waiting = records[r]["phase"] in ("collective", "done")  # waiting for others itself, or finished
            if stopped or (timeouts and not waiting and now - since >= progress.WAITED):
                idle.append(r)
        if idle:
            r = min(idle, key=lambda r: (not self._stopped(r), records[r]["since"]))
            return self._hung_cause(r, records[r], now - records[r]["since"])
        return {"kind": "died", "ranks": causes, "statuses": statuses}

    def _stopped(self, r: int) -> bool:
        return processes.stopped(self.ranks[r]) or (self.shared / f"stopped.{r}").exists()

    def _hung_cause(self, rank: int, record: dict, seconds: float) -> dict:
        return {"kind": "hung", "ranks": [rank], "statuses": [None], "seconds": seconds, "phase": record["phase"],
                "step": record["step"]}

    def _check_progress(self, log: int) -> dict | None:
        """A hung rank of this host as the host's verdict (published), or None; names new stragglers."""
        records = progress.read(self.shared, self.ranks)
        stopped = {r for r in records if processes.stopped(self.ranks[r])}
        found = progress.hung(records, time.time(), self.hang_timeout, stopped)
        if found is not None:
            return self._publish(self._hung_cause(found[0], records[found[0]], found[1]))
        for r, ratio in progress.stragglers(records):
            if r not in self.named:
                self.named.add(r)
                who = "" if r == self.me else f"rank {self.me}: "
                os.write(log, (f"[pretrain-cli] {who}rank {r} (pid {self.ranks[r]} on {self.host}) is a straggler: "
                               f"its own work per step (data and forward, the median of the last {progress.WINDOW} "
                               f"steps) takes {ratio:.1f}x the other ranks'; training goes on\n").encode())
        return None

    # ------------------------------------------------------------------ the one verdict of the host
    def _decided(self) -> dict | None:
        """The verdict another watcher of this host published, if any."""
        with contextlib.suppress(OSError, ValueError):
            return json.loads((self.shared / "cause").read_text())
        return None

    def _publish(self, cause: dict) -> dict:
        """Publish `cause` unless another watcher was first; returns the one that stands."""
        tmp = self.shared / f"cause.{self.me}.{os.getpid()}.{time.monotonic_ns()}"
        with contextlib.suppress(OSError):
            tmp.write_text(json.dumps(cause))
            os.link(tmp, self.shared / "cause")  # fails when it exists: the first verdict stands
        with contextlib.suppress(OSError):
            tmp.unlink()
        return self._decided() or cause

    def announce(self, running: bool) -> None:
        """launch.sh waits for the watchers before reading the verdicts: `watcher-R.pid` while this one runs."""
        if self.verdicts is None:
            return
        path = self.verdicts / f"watcher-{self.me}.pid"
        with contextlib.suppress(OSError):
            path.write_text(str(os.getpid())) if running else path.unlink(missing_ok=True)

    def _finish(self) -> None:
        """This watcher is done with the shared records; the last of the host's removes them."""
        import shutil

        self._share(f"done.{self.me}", "")
        if all((self.shared / f"done.{r}").exists() for r in self.ranks):
            shutil.rmtree(self.shared, ignore_errors=True)

    # ------------------------------------------------------------------ acting
    def _stop_parent(self) -> None:
        deadline = time.monotonic() + self.grace
        while processes.alive(self.parent) and time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                os.kill(self.parent, signal.SIGKILL)
            time.sleep(0.02)

    def _line(self, cause: dict, own: bool = False) -> str:
        causes, statuses = cause["ranks"], cause["statuses"]
        if cause["kind"] == "hung":
            r = causes[0]
            named = (f"rank {r} (pid {self.ranks[r]} on {self.host}) made no progress for {cause['seconds']:.0f} s "
                     f"while in {cause['phase']} at step {cause['step']}")
        else:
            named = ", ".join(f"rank {r} (pid {self.ranks[r]} on {self.host}) died: {processes.describe_status(st)}"
                              for r, st in zip(causes, statuses))
        usage = any(processes.exit_code(st) == 2 for st in statuses)  # a usage error: resuming would repeat it
        if self.me in causes or own:
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
