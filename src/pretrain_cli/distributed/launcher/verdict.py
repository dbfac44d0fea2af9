"""Which rank of a host died first, or hung: the evidence the host's watchers share and the one verdict they publish.

Every watcher of a host (`distributed.launcher.watcher`) writes what it sees into the host's shared directory: a
rank seen alive while another was already dead is not the cause (`outlived.R`), a rank seen stopped (`kill -STOP`)
before any watcher killed it (`stopped.R`), each death's exit status read from /proc while the launcher has not
reaped it yet (`status.R`). From that `Evidence.death_cause` decides: the ranks nobody saw alive after another
death; of those, a rank aborted by SIGABRT (gloo's abort) only when no other death explains it; and when every dead
rank died of waiting (gloo's timeout), the live rank that made no progress (`distributed.launcher.progress`). The
first watcher to settle publishes its verdict (`cause`, created exclusively) and every other one adopts it, so
every log names the same rank. Plain os calls only: this runs in the forked watchers, without Paddle.
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


class Evidence:
    """What the watcher of rank `me` knows of the host's ranks (`ranks`: rank -> pid) through the shared directory
    `shared`; `statuses`: the exit statuses it read itself."""

    def __init__(self, me: int, ranks: dict, shared: Path):
        self.me, self.ranks, self.shared = me, ranks, shared
        self.statuses: dict[int, int | None] = {}

    def gone(self) -> set:
        return {r for r, pid in self.ranks.items() if not processes.alive(pid)}

    def mark(self, gone: set) -> None:
        """Every rank alive next to a dead one outlived it: it is not the cause (unless it is stopped: `stopped.R`,
        read before any watcher kills or holds it)."""
        for r in set(self.ranks) - gone:
            if self.stopped_now(r):
                self.share(f"stopped.{r}", "")
            self.share(f"outlived.{r}", ",".join(map(str, sorted(gone))))

    def observe(self, gone: set, wait: bool = True) -> None:
        """Share what this watcher sees: each death's exit status, then who outlived whom. The statuses /proc holds
        now are read first: Paddle's launcher reaps its children once a second, and every share below is an
        fsync'd write, which under load can take longer than that. A rank still exiting (not yet a zombie) is waited
        for after the shares, and only with `wait` (the survivor's watcher stops its own rank first)."""
        for r in gone:
            if self.statuses.get(r) is None:
                status = processes.exit_status(self.ranks[r])
                if status is not None:
                    self.statuses[r] = status
        self.mark(gone)
        for r in gone:
            if wait and r not in self.statuses:
                self.statuses[r] = self._status(self.ranks[r])
            # reaped before it was read: the job's own kill says how, if it was one (only after the wait: a first
            # look, `wait` False, leaves a rank still exiting unread, so the second look waits for it)
            if wait and self.statuses.get(r) is None:
                from pretrain_cli.distributed.launcher import account

                if (killed := account.killed_status(r, self.ranks[r])) is not None:
                    self.statuses[r] = killed
            if self.statuses.get(r) is not None:
                self.share(f"status.{r}", str(self.statuses[r]))

    @staticmethod
    def _status(pid: int) -> int | None:
        """The exit status of a dead process, waiting up to 0.5 s for an exiting one to become a zombie: woken by its
        pidfd at that moment where Linux offers one (the launcher may reap it soon after), else polled every 10 ms."""
        import select

        deadline = time.monotonic() + 0.5
        fd = processes.exit_fd(pid)
        try:
            while True:
                status = processes.exit_status(pid)
                left = deadline - time.monotonic()
                if status is not None or left <= 0:
                    return status
                if fd is None:
                    time.sleep(0.01)
                elif select.select([fd], [], [], left)[0]:  # it has exited: readable now, or reaped already
                    return processes.exit_status(pid)
        finally:
            if fd is not None:
                os.close(fd)

    def share(self, name: str, text: str) -> None:
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

    def causes(self) -> list[int]:
        """The ranks that died first: dead, never seen alive after another's death; of those, a rank aborted
        (SIGABRT: gloo's reaction to a closed socket) only when no other death explains it."""
        gone = sorted(self.gone())
        causes = [r for r in gone if not (self.shared / f"outlived.{r}").exists()] or gone
        own = [r for r in causes if (self._shared_status(r) or 0) & 0x7F != signal.SIGABRT]
        return own or causes

    def death_cause(self) -> dict:
        """The verdict of a death: the ranks that died first; or a live rank that hung, when they died of waiting
        for it: gloo's timeout aborts a waiting rank (SIGABRT) or raises in it (exit 1), and the live rank is
        stopped (`kill -STOP`), or made no progress for `progress.WAITED` s outside a collective. A stopped rank whose
        last mark is older than a killed rank's is named too."""
        causes = self.causes()
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
            waiting = records[r]["phase"] in (*progress.WAITING, "done")  # waiting for others itself, or finished
            if stopped or (timeouts and not waiting and now - since >= progress.WAITED):
                idle.append(r)
        if idle:
            r = min(idle, key=lambda r: (not self._stopped(r), records[r]["since"]))
            return hung_cause(r, records[r], now - records[r]["since"], progress.writes(records))
        return with_writes({"kind": "died", "ranks": causes, "statuses": statuses}, progress.writes(records))

    def _stopped(self, r: int) -> bool:
        return self.stopped_now(r) or (self.shared / f"stopped.{r}").exists()

    def stopped_now(self, r: int, traced: bool = True) -> bool:
        """Whether rank `r` is stopped (`kill -STOP`, a debugger; `traced` False: not a debugger's stop,
        `processes.stopped`), and not by its watcher, which holds a survivor of a death stopped until the host's
        lines are out (`held.R`, shared before its SIGSTOP: `Watcher._hold_parent`)."""
        return processes.stopped(self.ranks[r], traced) and not (self.shared / f"held.{r}").exists()

    # ------------------------------------------------------------------ the one verdict of the host
    def decided(self) -> dict | None:
        """The verdict another watcher of this host published, if any."""
        with contextlib.suppress(OSError, ValueError):
            return json.loads((self.shared / "cause").read_text())
        return None

    def publish(self, cause: dict) -> dict:
        """Publish `cause` unless another watcher was first; returns the one that stands."""
        tmp = self.shared / f"cause.{self.me}.{os.getpid()}.{time.monotonic_ns()}"
        with contextlib.suppress(OSError):
            tmp.write_text(json.dumps(cause))
            os.link(tmp, self.shared / "cause")  # fails when it exists: the first verdict stands
        with contextlib.suppress(OSError):
            tmp.unlink()
        return self.decided() or cause


def hung_cause(rank: int, record: dict, seconds: float, writing: dict | None = None) -> dict:
    """The verdict naming `rank` as hung: no progress for `seconds` since its last mark (`record`); `writing`: the
    host's background checkpoint writes in flight (`with_writes`)."""
    return with_writes({"kind": "hung", "ranks": [rank], "statuses": [None], "seconds": seconds,
                        "phase": record["phase"], "step": record["step"]}, writing)


def with_writes(cause: dict, writing: dict | None) -> dict:
    """`cause` with the background checkpoint writes (`async_save`) its host's ranks had in flight when it was decided
    (`progress.writes`: {str(rank): step}), if any: the stop of every rank of the host leaves them unsaved, which the
    line says (`unsaved.clause`)."""
    return {**cause, "writing": dict(writing)} if writing else cause
