#!/usr/bin/env python
"""`python -m paddle.distributed.launch` as launch.sh runs it: the same launcher, with the HTTP client's INFO
lines (`HTTP Request: GET …/healthy`, one per poll while a node waits for the others, at Paddle's INFO logging)
kept out of the console; the launcher's own lines follow `--log_level` as before.

Its exit code on a signal, too: Paddle's launcher stops its ranks and exits with the signal's number (2 for
SIGINT, 15 for SIGTERM), which collides with a usage error (2) and reads as a failure to retry (15); here it
becomes the shell's 130 / 143, which `job.py decide` stops on. A Ctrl-C while Paddle is still being imported (which
Paddle re-raises as an ImportError from the KeyboardInterrupt, or swallows in part of the import:
`start_signals.interrupt_kept`) is `error: interrupted`, 130, as the CLI's own, not a traceback.

One stop per signal, however it arrives (`Stops`). launch.sh passes on a SIGTERM / SIGINT it receives as SIGUSR1 /
SIGUSR2: it cannot tell whether the launcher got the signal too (a terminal's Ctrl-C and a scheduler signalling the
job's process group, or every process of the job, reach both; a container's PID 1 signalled, or `kill` of launch.sh,
only launch.sh). The first request of either kind stops the job (Paddle's handler: SIGTERM to every rank, which
finish their step and save); launch.sh's copy of a signal the launcher had itself is dropped, and so is the
launcher's own copy of one whose copy came first (Python runs pending handlers by signal number: SIGUSR1 before
SIGTERM). A further signal is Paddle's second one, which ends the ranks 10 s later. A hang-up (SIGHUP: the terminal
closed) is a SIGTERM stop, unless ignored from the start (nohup); its default action would kill the launcher, whose
ranks then stop as at its death (below).

Several nodes (`--master ip:port --nnodes N`): the wait for the other nodes is limited to RENDEZVOUS_TIMEOUT seconds
(default 600) and said after 10 s (`distributed/launcher/rendezvous.py`); Paddle's own waits for ever, silently.

A stop gives the ranks STOP_TIMEOUT seconds (default 900; 0: no limit) to finish their step and save before they are
killed, where Paddle's launcher gave them 30 s (`distributed/launcher/stopping.py`). And its ranks stop when it dies,
as at its SIGTERM, ending STOP_TIMEOUT s later at the latest (900 if 0): Paddle starts each in a session of its own, so
this process killed with its group left them running (`distributed/launcher/launch.py`: `end_with_launcher`, told
this process by `PRETRAIN_CLI_LAUNCHER`). Its join
directory (several nodes) is removed when it ends, stopped by a signal too, and what a launch killed with SIGKILL left
in TMPDIR is removed when the next one starts (`distributed/launcher/tempdirs.py`)."""
import os
import signal
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))

PASSED_ON = {signal.SIGUSR1: signal.SIGTERM, signal.SIGUSR2: signal.SIGINT}  # launch.sh's copies of a signal


def end(code) -> None:
    """Exit now with `code` (the shell's 128 + n for the signal n), the streams flushed, this launcher's join directory
    removed (`os._exit` skips the exit functions that would: a stop by signal left it in TMPDIR)."""
    import logging

    from pretrain_cli.distributed.launcher import tempdirs

    tempdirs.remove_own()
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code if isinstance(code, int) else 1)


class Stops:
    """The launcher's SIGINT/SIGTERM handlers, run behind `direct`; launch.sh's copies (`PASSED_ON`): `passed_on`."""

    def __init__(self):
        self.install = signal.signal
        self.handlers = {}  # SIGINT / SIGTERM -> the launcher's own handler, once it installs one
        self.received = set()  # the signals handed to those handlers: the launcher's exit code names one (128 + n)
        self.began = None  # how the stop began: "direct" or "passed on"
        self.dropped = False  # the launcher's own copy of a signal launch.sh passed on first: dropped, once
        self.early = None  # a stop requested before the launcher's handlers: the signal
        # a hang-up (the terminal closed) is a SIGTERM stop, unless ignored from the start (nohup): left so
        self.hangup = signal.getsignal(signal.SIGHUP) == signal.SIG_DFL
        self.ttys = [fd for fd in (1, 2) if os.isatty(fd)]  # (a gone terminal is no tty)
        self.hung_up = False

    def start(self) -> None:
        for num in (signal.SIGINT, signal.SIGTERM):
            self.install(num, self.direct)
        if self.hangup:
            self.install(signal.SIGHUP, self.hang_up)
        for num in PASSED_ON:
            self.install(num, self.passed_on)
        signal.signal = self.replacing

    def replacing(self, signum, handler):
        """`signal.signal` for the launcher: its SIGINT/SIGTERM handlers are kept, to run behind `direct`."""
        if signum in (signal.SIGINT, signal.SIGTERM) and callable(handler):
            previous, self.handlers[signum] = self.handlers.get(signum, self.direct), handler
            return previous
        return self.install(signum, handler)

    def direct(self, signum, frame):
        if self.began == "passed on" and not self.dropped:  # the same stop: launch.sh's copy was handled first
            self.dropped = True
            return None
        self.began = self.began or "direct"
        return self._stop(signum, frame)

    def hang_up(self, signum, frame):
        """The terminal went: its stdout/stderr to /dev/null (a write to it fails: EIO), then one SIGTERM stop. A
        further SIGHUP (bash's copy to its jobs, the kernel's to the foreground group) is no second signal, which
        would have Paddle kill the ranks 10 s later."""
        if self.hung_up:
            return None
        self.hung_up = True
        null = os.open(os.devnull, os.O_WRONLY)
        for fd in self.ttys:
            os.dup2(null, fd)
        os.close(null)
        return self.direct(signal.SIGTERM, frame)

    def passed_on(self, signum, frame):
        if self.began is None:  # else the launcher had the signal itself: the stop is under way
            self.began = "passed on"
            return self._stop(PASSED_ON[signum], frame)
        return None

    def _stop(self, signum, frame):
        handler = self.handlers.get(signum)
        if handler is not None:
            self.received.add(signum)
            try:
                return handler(signum, frame)
            except SystemExit as e:  # (Paddle's stop is done: the ranks stopped, or killed by its second signal)
                # Ended here: raised on, a bare `except:` of Paddle's swallows it (its KV client's requests while a
                # node waits for the others at MASTER: the wait went on until RENDEZVOUS_TIMEOUT).
                end(128 + e.code if e.code in self.received else e.code)
        if self.early is None:  # no rank started yet: the launcher ends here
            self.early = signum
            self.again()
        return None

    def again(self) -> None:
        """Raise the early stop (again, where Paddle's import swallowed it: a bare `except:` catches both)."""
        if self.early == signal.SIGINT:
            raise KeyboardInterrupt
        if self.early is not None:
            raise SystemExit(128 + self.early)


if __name__ == "__main__":
    try:
        import logging
        import runpy

        from pretrain_cli.distributed.launcher import launch, stopping, tempdirs

        tempdirs.sweep()  # what launches on this host killed with SIGKILL left in TMPDIR
        try:
            stop_limit = stopping.timeout_seconds()
        except ValueError as e:
            print(e, file=sys.stderr)
            sys.exit(2)
        note = stopping.start_note(stop_limit)  # (0: the deadline at this launcher's death is said, once a job)
        if note:
            print(note, file=sys.stderr, flush=True)
        stops = Stops()
        held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
        stops.start()
        try:
            import paddle  # noqa: F401  (here, where a stop it swallows is raised again)
        finally:
            stops.start()  # over the SIGTERM handler Paddle's import installs (a C++ report, then death)
            signal.pthread_sigmask(signal.SIG_SETMASK, held)  # a SIGTERM held back meanwhile arrives here
            stops.again()
        stopping.install(stop_limit)  # Paddle's 30 s for a stop: a longer save was killed, its checkpoint lost
        os.environ[launch.LAUNCHER] = launch.launcher_mark()  # the ranks' environment is copied from this one
        os.environ[stopping.LIMIT_ENV] = str(stop_limit)  # (a rank knows its stop's time: not Paddle's 30 s)
        logging.getLogger("httpx").setLevel(logging.WARNING)  # paddle/distributed/launch/utils/kv_client.py polls
        sys.argv[0] = "paddle.distributed.launch"
        from pretrain_cli.distributed.launcher import failure_report, rendezvous

        rendezvous.guard()
        failure_report.install()  # under launch.sh a rank's end is said once, by launch.sh: not in Paddle's report
        runpy.run_module("paddle.distributed.launch", run_name="__main__", alter_sys=True)
    except Exception as e:  # Paddle's import turns a KeyboardInterrupt into an ImportError raised from it
        cause = e
        while cause is not None and not isinstance(cause, KeyboardInterrupt):
            cause = cause.__cause__ or cause.__context__
        if cause is None:
            raise
        print("error: interrupted", file=sys.stderr)
        sys.exit(130)
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        sys.exit(130)
