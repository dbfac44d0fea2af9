"""What Paddle's launcher says when its ranks end with a usage error: nothing of its own, so the error is said once.

Paddle's launcher copies the node's first rank (local rank 0) into its own stdout as it runs, and when a rank fails it
logs `LAUNCH ERROR ... Container failed !!!` with the failed rank's command, then copies again the last 3000 bytes of
the failed rank's log (`Container.tail`); launch.sh then prints the cause's line (`job.cause`). Left so, a typo'd key,
which every rank finds, would reach the console three times (rank 0's copy, the tail, launch.sh's line) under the
launcher's noise. When this node's ranks recorded a usage error (`job.decide`: exit 2, never retried, as one process
exits), the launcher's report and tail are left out (`install`). When the first rank said the error (its own `error:`
line, or its watcher's line on the rank that left with it, `departure`), its log is copied to its end once the ranks and
their watchers are done, so that the line is surely on the console, and launch.sh leaves out its line, which would
repeat it (`job.cause`). The copy goes on from where the launcher's own copy stopped: at a failure the launcher stops
the ranks (`Pod.stop`) before it finishes, and `Container.terminate` closes the log it copies from, so `install` keeps
that position and the copy reopens the log file there (`_copy_rest`). Any other failure keeps the launcher's report,
which launch.sh's line refers to.
"""
from __future__ import annotations

import contextlib
import logging
import sys

from pretrain_cli.distributed.launcher import job

FAILED = "Container failed"  # the start of the launcher's ERROR record of a failed rank (controllers/controller.py)


def usage_ended() -> bool:
    """Whether a rank of this node recorded a usage error (launch.sh's verdicts; False without launch.sh)."""
    directory = job.verdict_dir()
    return directory is not None and job.decide(directory, 1) == (job.USAGE, "stop")


class _Quiet(logging.Filter):
    """Drops the launcher's `Container failed` record after a usage error."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (str(record.msg).startswith(FAILED) and usage_ended())


def install() -> None:
    """In Paddle's launcher process, before it runs: leave its failure report out after a usage error."""
    from paddle.distributed.launch.controllers.controller import ControllerBase
    from paddle.distributed.launch.job.container import Container

    logging.getLogger("LAUNCH").addFilter(_Quiet())
    tail, finalize, terminate = Container.tail, ControllerBase.finalize, Container.terminate

    def quiet_tail(self, length=3000):
        if not usage_ended():
            return tail(self, length)
        return None

    def terminate_kept(self, force=False):
        if self._log_handler is not None:  # how far the launcher's copy got, before terminate closes the log
            with contextlib.suppress(OSError, ValueError):
                self._pretrain_cli_kept = self._log_handler.tell()
        return terminate(self, force)

    def finalize_copied(self, exit=True):
        self.pod.join()  # (finalize's own first step: the ranks are done, their logs complete)
        if usage_ended():
            job.wait_for_watchers(job.verdict_dir())  # (a watcher writes its line after its rank has ended)
            if job.said_on_console(job.verdict_dir()) and self.pod.containers:
                _copy_rest(self.pod.containers[0])
        return finalize(self, exit)

    Container.tail, Container.terminate, ControllerBase.finalize = quiet_tail, terminate_kept, finalize_copied


def _copy_rest(rank) -> None:
    """The first rank's log (`rank`, Paddle's Container), from where the launcher's copy stopped to its end, onto
    this process's stdout (the error's line, which launch.sh omits). With its log still open (the ranks ended by
    themselves) Container.logs copies it, at most 1000 lines a call, True while more may follow (Pod.logs says
    nothing); once `terminate` closed it, the file is reopened at the position `terminate_kept` saved."""
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
                sys.stdout.write(line)
    sys.stdout.flush()
