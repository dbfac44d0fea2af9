"""What the console says when a rank ends a job launched by scripts/launch.sh: one account, on stderr, said once.

Paddle's launcher copies the node's first rank (local rank 0) into its own stdout as it runs, and when a rank fails it
logs `LAUNCH ERROR ... Container failed !!!` with the command of the lowest rank it saw stop (usually one stopped
because another died), then copies again the last 3000 bytes of that rank's log (`Container.tail`). Left so, a rank's
end would reach the console up to three times (its `error:` line in rank 0's copy, the tail, launch.sh's line), on
stdout, under the launcher's noise, and a death (SIGKILL) would follow a `Container rank 0 status failed` naming the
wrong rank. The ranks record how each ended (`job.record`: its own `error:` line, or its watcher's verdict), and
launch.sh says the first of them once, on stderr, after the launcher (`account.cause`: which rank ended the job and
how, its line, where its full log is; a usage error that every rank of the node found is its `error:` lines, as one
process says them). So, under launch.sh (`install`), the launcher's copy of rank 0 onto stdout leaves out the lines that
say how the job ended (`ENDING`: the CLI's `error:` lines, the rank watchers' verdicts), and its failure report and tail
are held back; once the ranks and their watchers are done (`finalize`), the rest of rank 0's log is copied (the
launcher stops copying when it stops the ranks: `Pod.stop`, whose `Container.terminate` closes the log; `install`
keeps the position), and the held report is given only when no rank recorded its end, so that something says it (its
tail of rank 0 then only the lines the copy left out: the rest is on stdout already). `install` also notes where each
rank's log begins this launch (`rank_log.mark`: Paddle appends to it), so that `account.cause` quotes this launch's
lines only. Without launch.sh (no verdict directory) Paddle's report stands: nothing else would say it.
"""
from __future__ import annotations

import contextlib
import logging
import re
import sys

from pretrain_cli.distributed.launcher import account, job, rank_log

FAILED = "Container failed"  # the start of the launcher's ERROR record of a failed rank (controllers/controller.py)
# the lines that say how the job ended, which launch.sh says once on stderr: the CLI's one-line errors, and the rank
# watchers' verdicts (`rank_log.VERDICT`), for this rank or another
ENDING = re.compile(r"error: |" + rank_log.VERDICT.pattern)
# a rank's fatal crash (`rank_log.crash_line`), which launch.sh's account names and its workerlog keeps in full: gloo's
# 30 s timeout aborting the rank waiting for a stopped peer, with every thread's stack, Paddle's C++ traceback and
# FatalError; it lasts until the rank's next line of its own log (`rank_log.LOGGED`: a crash it survived, a Paddle
# error caught and logged, ends there). A Python traceback is held until its exception line (`_Console._held`): one
# crash only where that line is gloo's (its timeout raised in a Python collective: ~50 lines) or the rank recorded
# `crashed` (an uncaught error: launch.sh's account quotes its end); else it is the rank's own (`logger.exception` of a
# failure it goes on from, a dying thread's, `--debug`'s) and stays on the console
PYTHON_STARTS = (rank_log.TRACEBACK, rank_log.GROUP.lstrip())
THREAD = "Exception in thread "  # (threading's line before a dying thread's traceback)


def _crashed(line: str, before: bool) -> bool:
    """Whether `line` is a crash's (`before`: the line before it was): a line of the rank's own log never is."""
    return not rank_log.LOGGED.match(line) and (before or rank_log.crash_line(line))


class _Console:
    """The launcher's copy of rank 0 onto stdout, without the lines of `ENDING` and the blank lines before them (a
    watcher sets its verdict apart so), nor a crash, from its first line (`rank_log.crash_line`) to the rank's next line
    of its own log (`rank_log.LOGGED`): ~60 lines of gloo's abort, stacks and tracebacks (or ~50 of a Python
    traceback ending in gloo's `TIMEOUT`) before launch.sh's one line naming the rank that hung (those left out are
    kept in
    `dropped`, the last `KEPT`); a line is judged whole
    (a part read before its writer finished it waits for its end). Paddle reads the log in text mode with universal
    newlines, so "\r\n" and a lone "\r" reach `write` as "\n" already: lines end at "\n" only here
    (`str.splitlines` would also end one at \x0c, \x1c-\x1e, \x85, \u2028, \u2029, which Paddle's readline does not:
    its parts judged apart)."""

    KEPT = 20

    def __init__(self):
        self.part, self.blank = "", ""
        self.dropped: list[str] = []
        self.crashed = False  # a crash's line was seen, and no line of the rank's own log since
        self.held: list[str] = []  # a Python traceback (and the blank lines before it), until its exception line
        self.kind = "plain"  # the held one's: "plain", "group" (an ExceptionGroup's), "thread" (its line only, yet)

    def write(self, text: str) -> None:
        *lines, self.part = (self.part + text).split("\n")
        for line in lines:
            if not line.strip():
                if self.held:
                    self.held.append(line + "\n")
                else:
                    self.blank += line + "\n"
            elif not self._held(line):
                self.crashed = _crashed(line, self.crashed)
                if self.crashed or ENDING.match(line):
                    self.dropped = [*self.dropped, line + "\n"][-self.KEPT:]
                else:
                    sys.stdout.write(self.blank + line + "\n")
                self.blank = ""

    def _held(self, line: str) -> bool:
        """Whether `line` is taken into a held Python traceback, which its exception line decides (`_decide`): its
        start (threading's `Exception in thread` line, a traceback's first line outside a crash), a frame, or that
        line. An ExceptionGroup's lines are `|`/`+`-framed: it is decided at its first line outside them."""
        start = line.lstrip().startswith(PYTHON_STARTS)
        group = line.lstrip().startswith(PYTHON_STARTS[1])
        if not self.held:
            if self.crashed or not (start or line.startswith(THREAD)):
                return False
            self.held, self.blank = [self.blank, line + "\n"], ""
            self.kind = "thread" if not start else "group" if group else "plain"
            return True
        if ENDING.match(line) or rank_log.LOGGED.match(line):  # (no exception line came: the rank's own)
            self._release()
            return False
        if self.kind == "thread":  # its traceback follows, else it was the rank's own line
            if not start:
                self._release()
                return False
            self.kind = "group" if group else "plain"
        elif self.kind == "group" and not line.lstrip().startswith(("|", "+")):
            self._decide(any(rank_log.crash_line(x) for x in self.held if not x.lstrip().startswith(PYTHON_STARTS)))
            return False
        self.held.append(line + "\n")
        if self.kind == "plain" and not (line[:1].isspace() or start):  # its exception line
            self._decide(rank_log.crash_line(line))
        return True

    def _decide(self, gloo: bool) -> None:
        """The held traceback is a crash (left out, and what follows it until the rank's next logged line) where its
        exception is gloo's or the rank recorded `crashed`; else it goes to the console."""
        if gloo or _recorded_crash():
            self.dropped = [*self.dropped, *(x for x in self.held if x.strip())][-self.KEPT:]
            self.held, self.crashed = [], True
        else:
            self._release()

    def _release(self) -> None:
        sys.stdout.write("".join(self.held))
        self.held = []

    def flush(self) -> None:
        if self.held:  # (no exception line came: the rank's own, as far as the console can tell)
            self._release()
        if self.part and self.part.lstrip().startswith(PYTHON_STARTS) and not self.crashed:
            sys.stdout.write(self.blank + self.part)
        elif self.part and (_crashed(self.part, self.crashed) or ENDING.match(self.part)):
            self.dropped = [*self.dropped, self.part][-self.KEPT:]
        else:  # (blank lines with no ending line after them are the rank's own)
            sys.stdout.write(self.blank + self.part)
        self.part = self.blank = ""
        sys.stdout.flush()


def _recorded_crash() -> bool:
    """Whether the rank the console copies (local rank 0) recorded an uncaught error (`job.record`'s `crashed`,
    written before its traceback is printed): launch.sh's account quotes that traceback's end."""
    return any(r.get("kind") == "crashed" and str(r.get("local", "")) == "0"
               for r in job.read_records(job.verdict_dir()))


class _Held(logging.Filter):
    """Holds the launcher's `Container failed` record back (`held`); lets it through once `released`."""

    def __init__(self):
        super().__init__()
        self.held: list[logging.LogRecord] = []
        self.released = False

    def filter(self, record: logging.LogRecord) -> bool:
        if self.released or not str(record.msg).startswith(FAILED):
            return True
        self.held.append(record)
        return False


def install() -> None:
    """In Paddle's launcher process, before it runs: under launch.sh, its console copy without the lines launch.sh
    says, its failure report held back and given only when no rank recorded its end."""
    if job.verdict_dir() is None:
        return
    from paddle.distributed.launch.controllers.controller import ControllerBase
    from paddle.distributed.launch.job.container import Container

    held, console, tails = _Held(), _Console(), []
    launch_log = logging.getLogger("LAUNCH")
    launch_log.addFilter(held)
    logs, finalize, terminate, start = Container.logs, ControllerBase.finalize, Container.terminate, Container.start

    def start_marked(self):
        started = start(self)
        if self._out and getattr(self, "_log_start_offset", None) is not None:  # where this launch's part begins
            rank_log.mark(job.verdict_dir(), self._out, self._log_start_offset)
        return started

    def console_logs(self, fn=None, offset=0, whence=1, limit=1000):
        return logs(self, console if fn is None else fn, offset, whence, limit)

    def tail_held(self, length=3000):
        tails.append((self, length))

    def terminate_kept(self, force=False):
        if self._log_handler is not None:  # how far the launcher's copy got, before terminate closes the log
            with contextlib.suppress(OSError, ValueError):
                self._pretrain_cli_kept = self._log_handler.tell()
        return terminate(self, force)

    def finalize_said(self, exit=True):
        self.pod.join()  # (finalize's own first step: the ranks are done, their logs complete)
        if held.held or tails:  # a rank failed: the ranks' records say how, once the watchers have written them
            job.wait_for_watchers(job.verdict_dir())
            if self.pod.containers:
                _copy_rest(self.pod.containers[0], console)
            _record_alone(self.pod.containers)
            if account.cause(job.verdict_dir()) is None:  # no rank recorded its end: Paddle's report is all there is
                console.flush()
                held.released = True
                for record in held.held:
                    launch_log.handle(record)
                for rank, length in tails:  # (rank 0's log is on stdout already, but for the lines left out)
                    if self.pod.containers and rank is self.pod.containers[0]:
                        sys.stdout.write("".join(console.dropped))
                    else:
                        _tail(rank, length)
        console.flush()
        return finalize(self, exit)

    Container.logs, Container.tail, Container.terminate = console_logs, tail_held, terminate_kept
    Container.start = start_marked
    ControllerBase.finalize = finalize_said


# the last line of a run whose final model is on disk (`training.closing.finished`, `already_complete`: this layer may
# not import training; tests/unit/test_lone_rank_end.py ties them), matched at the start of a log line: after the
# logger's prefix (`training.metrics.setup_logging`: `[2026-12-07 23:55:34,057] [    INFO] - `), not anywhere in one
# (a warning or another line quoting it says nothing of this run's end)
FINISHED = re.compile(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}\] \[\s*INFO\] - "
                      r"(train: (?:done at step \d+|nothing trained now)); the final model")


def _record_alone(containers) -> None:
    """The death by a signal of a node's only rank, which left no record (`job.record`) of it: recorded from its exit
    status as a watcher records a rank's death (kind "died", `killed by SIGKILL`, with its pid and host: one line,
    `verdict_line.died`, which names a SIGKILL during a stop from the rank's notes here, `watchdog.stop_began`), for
    launch.sh's line and exit code (128 + the signal: `account.cause`, `job.decide`), which said nothing of a job of
    one process killed (`kill -9`, the OOM killer), its console only Paddle's `Container failed`, exit 247: such a job
    has no watcher (`watchdog.start`), and nothing else names a death by a signal. The re-run advice is left to
    `account.cause` (`rerun`), which launch.sh gives the user's output settings. A rank whose log says this launch
    finished the run (`FINISHED`: its final model written) died at exit (an atexit handler's or the native teardown's
    crash): kind "finished", exit 0, never retried (a re-run would train again what is done), its line the bare
    `died: <status>` (no stop clause: a stop begun after the finish lost no checkpoint), as a launched rank of
    several ends past its teardown (`runtime.end_process`) with 0. Not for an exit with a code (the CLI records its own
    errors; one without a record, 2 or 130 among them, keeps launch.sh's reading of the launcher's code: never
    retried), several ranks of a node, whose watchers decide which died first (this launcher polls its ranks once a
    second), nor a rank with a record of any kind (a `joining` one is a failed join, retried as such)."""
    directory = job.verdict_dir()
    proc = getattr(getattr(containers[0], "_proc", None), "_proc", None) if len(containers) == 1 else None
    code = getattr(proc, "returncode", None)  # (Paddle's ProcessContext's Popen: the rank; -N: killed by signal N)
    if directory is None or code is None or code >= 0 or job.read_records(directory):
        return
    import socket

    from pretrain_cli import processes
    from pretrain_cli.distributed.launcher.verdict_line import died

    env = containers[0].env
    status = -code  # (as waitpid reports a death by that signal)
    rank = int(env.get("PADDLE_TRAINER_ID") or 0)
    log = getattr(containers[0], "_out", None)
    done = [m.group(1) for m in map(FINISHED.match, rank_log.since(directory, log) if log else ()) if m]
    if done:  # (its output is complete: no advice to re-run, and no stop's clause: no checkpoint of it was lost)
        bare = died(rank, proc.pid, socket.gethostname(), status, None)
        job.record(rank, 0, "finished", f"{bare}, at exit, after the run had finished ({done[-1]}; its final model "
                   f"is written): the run's output is complete, nothing to re-run", directory,
                   local=env.get("PADDLE_LOCAL_RANK", "0"))
        return
    line = died(rank, proc.pid, socket.gethostname(), status, directory)
    job.record(rank, processes.exit_code(status), "died", line, directory, local=env.get("PADDLE_LOCAL_RANK", "0"),
               rerun=True)


def _copy_rest(rank, console: _Console) -> None:
    """The first rank's log (`rank`, Paddle's Container), from where the launcher's copy stopped to its end, onto
    `console`. With its log still open (the ranks ended by themselves) Container.logs copies it, at most 1000 lines a
    call, True while more may follow (Pod.logs says nothing); once `terminate` closed it, the file is reopened at the
    position `terminate_kept` saved."""
    if rank._log_handler is not None:
        while rank.logs():
            pass
        return
    kept = getattr(rank, "_pretrain_cli_kept", None)
    if kept is None or not rank._out:
        return
    with contextlib.suppress(OSError, ValueError, UnicodeError):
        with open(rank._out, errors="replace") as log:  # (text, as Paddle opened it: `kept` is its tell() cookie)
            log.seek(kept)
            for line in log:
                console.write(line)


def _tail(rank, length: int) -> None:
    """Paddle's `Container.tail`: the last `length` bytes of the failed rank's log onto stdout, this launch's only (as
    Paddle clamps it to `_log_start_offset`); read from the file: the launcher closed its own handle when it stopped
    the ranks."""
    begin = getattr(rank, "_log_start_offset", None) or 0
    sys.stdout.write("".join(rank_log.read(getattr(rank, "_out", None), begin, length, whole=False)))
    sys.stdout.flush()
