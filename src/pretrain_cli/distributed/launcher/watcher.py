"""A rank's watcher: the forked process (plain os calls only, no Paddle, its own session) that carries the rank's
output to its workerlog, watches the ranks of its host, and at a death or a hang says the host's one verdict
(`distributed.launcher.verdict`) in this rank's log and stops its rank. Started by `distributed.launcher.watchdog`.
This module watches and decides when to write; what its lines say is `distributed.launcher.verdict_line`'s.

The loop (`Watcher.run`): output is passed on while every rank of the host is alive; when a rank's death or
departure is seen, what the pipe holds then is passed on too (a survivor's up to the first line of gloo's or Paddle's
reaction to the loss, `before_abort`), and what a survivor writes after it (gloo's abort) is dropped. The ranks are
checked every `POLL` s and at once when one exits (a pidfd per rank wakes the loop: the death's exit status is read
from /proc before Paddle's launcher, which polls its children once a second, reaps it), every `HANG_POLL` s the
progress records (a hung rank, stragglers: `distributed.launcher.progress`). At a death it stops its own rank first,
shares what it sees for `SETTLE` s or until a verdict stands, then writes one line and, when its own rank
is the cause, records that rank's end for launch.sh (`job.record`: the signal or code, `HUNG` for a hang).

A survivor of a death is held (SIGSTOP, `Watcher._hold_parent`), not killed, until its watcher and the host's other
watchers have written their lines (for at most `HELD` s), and only then SIGKILLed: Paddle's launcher run directly ends
once its ranks have exited (its poll sees the death 0-1 s after it, while the lines come `SETTLE` s after it), and
whatever ends the job with the launcher (a scheduler's step, a container, a test's clean-up) kills the watchers with
it: a survivor killed at once let the launcher end before the lines, which were then lost.
"""
from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

from pretrain_cli import processes
from pretrain_cli.distributed.launcher import departure, progress, rank_log, rerun, unsaved, verdict_line
from pretrain_cli.distributed.launcher.verdict import Evidence, hung_cause

POLL = 0.05
SETTLE = 0.5  # after the first death: how long the other deaths (its consequences) take to be seen
HANG_POLL = 0.5  # how often the progress records are read
HELD = 2.0  # the longest a held survivor waits for the host's other lines (Paddle's launcher kills it at ~3.6 s)
HUNG = 124  # the exit code of a job ended because a rank made no progress (as timeout(1)'s)
LOST = 1  # ... because a rank failed elsewhere (`errors.PeerFailed`'s)


def before_abort(out: bytes) -> bytes:
    """`out`, a survivor's output read when a peer's death or departure was seen, up to its first line of the
    reaction to it (`rank_log.crash_line`: a crash's line, a Python traceback among them: a Python error raised by
    gloo, `RuntimeError: [/paddle/third_party/gloo/...] TIMEOUT`, is the reaction after a peer's loss). Why: what
    the rank wrote before the loss (a step's line, a warning) is its own and is kept, while the reaction, which may
    already be in the pipe when the watcher looks (the peer's sockets close before its exit wakes the watcher), says
    nothing of who was lost. Anchored: a line of the rank's own that merely mentions gloo (a path `/data/gloo_corpus`,
    an error of ours about a gloo group) is no reaction, since everything from the first reaction line on is dropped."""
    lines = out.splitlines(keepends=True)
    for n, line in enumerate(lines):
        text = line.decode(errors="replace")
        if rank_log.crash_line(text):
            return b"".join(lines[:n])
    return out


def read_held(pipe: int) -> bytes:
    """What the pipe `pipe` holds now: as many bytes as its FIONREAD count says at the call, never more. Why: a rank
    that keeps writing would keep a read to the pipe's end going, and the caller's next act (reading a dead rank's
    exit status before Paddle's launcher reaps it, within a second) would wait for it."""
    import array
    import fcntl
    import termios

    count = array.array("i", [0])
    fcntl.ioctl(pipe, termios.FIONREAD, count)
    left, out = count[0], []
    while left > 0:
        chunk = os.read(pipe, left)
        if not chunk:
            break
        out.append(chunk)
        left -= len(chunk)
    return b"".join(out)


def exit_fds(ranks: dict) -> dict:
    """{pidfd: rank} for the host's ranks (`processes.exit_fd`). Empty where Linux offers no pidfd: then `POLL`
    bounds how late a death is seen."""
    fds = {r: processes.exit_fd(pid) for r, pid in ranks.items()}
    return {fd: r for r, fd in fds.items() if fd is not None}


class Watcher:
    """The watcher of rank `me` (`ranks`: this host's ranks -> pids; `shared`: the host's watch directory;
    `verdicts`: launch.sh's directory or None; `grace`: how long its rank gets to die; `hang_timeout`: the run's
    key; `output_dir`, `overwrite`, `resume_from`: the run's output settings, from which the re-run advice names
    where the same command starts: `rerun`)."""

    def __init__(self, me: int, ranks: dict, host: str, shared: Path, verdicts: Path | None, grace: float,
                 hang_timeout: float | None = None, remote: dict | None = None, output_dir: str | None = None,
                 overwrite: bool = False, resume_from: str | None = None):
        self.me, self.ranks, self.host, self.shared, self.verdicts = me, ranks, host, shared, verdicts
        # the user's own (a MAX_RESTART restart's are launch.sh's): where a re-run of their command starts (`rerun`)
        self.output = rerun.as_set(output_dir, overwrite, resume_from)
        self.grace, self.parent, self.hang_timeout = grace, ranks[me], hang_timeout
        self.remote = dict(remote or {})  # the job's ranks on other hosts -> their host (not watched from here)
        self.evidence = Evidence(me, ranks, shared)
        self.stopping = False
        self.held = False  # its rank, a survivor of a death, is held stopped until the host's lines are out
        self.named: set = set()  # stragglers named in this rank's log already
        self.stopped_at: dict = {}  # rank -> when it was first seen stopped (`/proc` state T), while it stays so

    # ------------------------------------------------------------------ the loop
    def run(self, pipe: int, log: int) -> None:
        import select

        signal.signal(signal.SIGTERM, lambda *_: setattr(self, "stopping", True))
        self.evidence.share(f"watcher.{self.me}", str(os.getpid()))  # a survivor's watcher waits for this one's line
        exits = exit_fds(self.ranks)
        open_pipe, next_check = True, time.monotonic() + HANG_POLL
        while True:
            if self.stopping:  # the rank is done: pass on its last output and leave
                self._drain(pipe, log if open_pipe else None)
                return self._finish()
            chunk = b""
            ready = select.select(([pipe] if open_pipe else []) + list(exits), [], [], POLL)[0]
            if open_pipe and pipe in ready:
                chunk = os.read(pipe, 1 << 16)
                open_pipe = bool(chunk)
            gone = self.evidence.gone()
            if not gone:
                for fd in set(ready) & set(exits):  # exited, yet its pid answers (reused): watch it by polling
                    os.close(fd)
                    del exits[fd]
                if chunk:
                    os.write(log, chunk)
                if time.monotonic() >= next_check:
                    next_check = time.monotonic() + HANG_POLL
                    cause = self.evidence.decided() or self._check_progress(log)
                    if cause is not None:
                        return self._end(cause, [], pipe if open_pipe else None, log)
                continue
            # what its rank wrote until the loss was seen, read before anything is done about it (the departure's
            # and the death's handling drop what a survivor writes from then on)
            pending = chunk + (read_held(pipe) if open_pipe else b"")
            if self.me not in gone:
                os.write(log, before_abort(pending))
            left = departure.announced(self.shared, gone)
            if left:  # a rank that left on purpose, with its own error: no death (`departure`)
                if self.me in gone:
                    os.write(log, pending)
                return departure.follow(self, left, pipe if open_pipe else None, log)
            self._handle(gone, pending if self.me in gone else b"", pipe if open_pipe else None, log)
            return

    def _handle(self, gone: set, chunk: bytes, pipe: int | None, log: int) -> None:
        """A rank of this host died: read how it died, stop this rank if it still runs, settle who died first, say it
        once."""
        self.evidence.observe(gone, wait=False)  # the statuses before the launcher reaps them; who outlived whom
        last_words = [chunk]
        if self.me not in gone:  # a survivor: what it writes from now on is the abort, not news
            last_words = []
            self._hold_parent()
        self.evidence.observe(gone)
        deadline = time.monotonic() + SETTLE
        while time.monotonic() < deadline and self.evidence.decided() is None:
            if pipe is not None:
                more = read_held(pipe)
                if self.me in gone:
                    last_words.append(more)
            self.evidence.observe(self.evidence.gone())
            time.sleep(POLL)
        self._end(self.evidence.decided() or self.evidence.publish(self._lost(self.evidence.death_cause())), last_words,
                  pipe, log)

    def _lost(self, cause: dict) -> dict:
        """`cause` as the loss of a rank on another host ("lost") when every death it names is the collective
        library's reaction (gloo's abort, SIGABRT; or its timeout or a lost rank 0, exit 1 with no error of the rank's
        own recorded) and the job has ranks elsewhere: the rank that failed is there, and this host cannot see it."""
        if cause["kind"] != "died" or not self.remote:
            return cause
        for r, status in zip(cause["ranks"], cause["statuses"]):
            aborted = status is not None and status & 0x7F == signal.SIGABRT
            gave_up = processes.exit_code(status) == 1 and self._recorded(r) in ("", "peer")
            if not (aborted or gave_up):
                return cause
        return {**cause, "kind": "lost"}

    def _recorded(self, rank: int) -> str | None:
        """The kind of end rank `rank` of this host recorded for launch.sh ("" when it recorded none: the ranks of a
        node share one launch.sh), or None when that cannot be read (not launched by launch.sh)."""
        import json

        if self.verdicts is None:
            return None
        try:
            return str(json.loads((self.verdicts / f"rank-{rank}.json").read_text()).get("kind", ""))
        except FileNotFoundError:
            return ""
        except (OSError, ValueError):
            return None

    def _end(self, cause: dict, last_words: list, pipe: int | None, log: int) -> None:
        """Say `cause` (the host's one verdict) in this rank's log, stopping this rank first (a held one once the
        host's lines are out, `_finish`); record it for launch.sh when this rank is the cause; leave once the others
        are done with the shared records."""
        if not self.held:
            self._stop_parent()  # (a hung rank too: SIGKILL reaches a stopped process)
        culprits = cause["ranks"]
        if self.me in culprits:  # its own output up to its death is the story (its error line, its traceback)
            os.write(log, b"".join(last_words))
            if pipe is not None:
                os.write(log, read_held(pipe))
            own = [cause["statuses"][culprits.index(self.me)]]
            # (the notice is read as "while writing its part of checkpoint-N" already: no word of the write here)
            self._pay(verdict_line.named(self, {**cause, "ranks": [self.me], "statuses": own, "writing": None}))
        if cause.get("writing"):  # a write in flight: said lost only once no rank of the host can publish it
            unsaved.settle(self.ranks.values())
        os.write(log, verdict_line.line(self, cause).encode())
        if self.verdicts is not None:
            from pretrain_cli.distributed.launcher import job

            if self.me in culprits:
                code = (HUNG if cause["kind"] == "hung" else LOST if cause["kind"] == "lost" else
                        processes.exit_code(cause["statuses"][culprits.index(self.me)]))
                said = verdict_line.line(self, {**cause, "ranks": [self.me]}, own=True).strip()
                job.record(self.me, code, cause["kind"], said, directory=self.verdicts, overwrite=False)
            else:  # stopped because of another rank: its line is the console's when no rank of this node failed
                job.record(self.me, LOST, "peer", verdict_line.line(self, cause).strip(), directory=self.verdicts,
                           overwrite=False)
        self._finish()

    def _pay(self, named: str) -> None:
        """The record its rank owed when it died or hung (`watchdog.owing`: its part of a save), written as a death
        notice `{"rank", "lost": named}`: rank 0 waits for that record by polling the checkpoint's directory, in no
        collective, so gloo never tells it of a death on another host, and it waited out `hang_timeout`. A record
        the rank wrote before it died stands."""
        import json

        from pretrain_cli import atomic

        try:
            target = Path((self.shared / f"owed.{self.me}").read_text())
        except OSError:
            return
        with contextlib.suppress(OSError):
            if not target.exists():
                target.parent.mkdir(exist_ok=True)  # (it died before its save made the directory)
                atomic.write_text(target, json.dumps({"rank": self.me, "lost": named}))

    def _check_progress(self, log: int) -> dict | None:
        """A hung rank of this host as the host's verdict (published), or None; names new stragglers."""
        records, now = progress.read(self.shared, self.ranks), time.time()
        for r in records:  # when each rank was first seen stopped, forgotten once it runs again (`progress.hung`)
            if self.evidence.stopped_now(r, traced=False):
                self.stopped_at.setdefault(r, now)
            else:
                self.stopped_at.pop(r, None)
        found = progress.hung(records, now, self.hang_timeout, dict(self.stopped_at))
        if found is not None:
            return self.evidence.publish(hung_cause(found[0], records[found[0]], found[1], progress.writes(records)))
        for r, ratio in progress.stragglers(records):
            if r not in self.named:
                self.named.add(r)
                os.write(log, verdict_line.straggler(self, r, ratio).encode())
        return None

    def announce(self, running: bool) -> None:
        """launch.sh waits for the watchers before reading the verdicts: `watcher-R.pid` while this one runs."""
        if self.verdicts is None:
            return
        path = self.verdicts / f"watcher-{self.me}.pid"
        with contextlib.suppress(OSError):
            path.write_text(str(os.getpid())) if running else path.unlink(missing_ok=True)

    def _finish(self) -> None:
        """This watcher is done with the shared records (its line is written); a held rank is killed once the host's
        other watchers are done too; the last of the host's removes the records."""
        import shutil

        self.evidence.share(f"done.{self.me}", "")
        if self.held:
            self._await_lines()
            self._stop_parent()
        if all((self.shared / f"done.{r}").exists() for r in self.ranks):
            shutil.rmtree(self.shared, ignore_errors=True)

    def _await_lines(self) -> None:
        """Until every other watcher of the host that still runs is done (`done.R`: its line written), for at most
        `HELD` s; a rank without a watcher (`watcher.R`), or whose watcher was killed, is not waited for."""
        deadline = time.monotonic() + HELD
        while time.monotonic() < deadline and self.shared.is_dir():
            if not any(self._watching(r) for r in self.ranks if r != self.me):
                return
            time.sleep(POLL)

    def _watching(self, rank: int) -> bool:
        """Whether rank `rank`'s watcher runs and has not written its line yet."""
        if (self.shared / f"done.{rank}").exists():
            return False
        try:
            return processes.alive(int((self.shared / f"watcher.{rank}").read_text()))
        except (OSError, ValueError):
            return False

    # ------------------------------------------------------------------ acting
    def _hold_parent(self) -> None:
        """Stop this rank (SIGSTOP: it writes and exits nothing more) until the host's lines are out (`_finish`);
        `held.R` first, so that no watcher takes the stop for a `kill -STOP` (a hang's evidence, `Evidence.mark`)."""
        self.evidence.share(f"held.{self.me}", "")
        self.held = True
        with contextlib.suppress(OSError):
            os.kill(self.parent, signal.SIGSTOP)

    def _stop_parent(self) -> None:
        deadline = time.monotonic() + self.grace
        while processes.alive(self.parent) and time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                os.kill(self.parent, signal.SIGKILL)
            time.sleep(0.02)

    read_held = staticmethod(read_held)  # (for `departure.follow`, which cannot import this module: a circle)

    def _drain(self, pipe: int, log: int | None) -> None:
        if log is not None:
            os.write(log, read_held(pipe))
