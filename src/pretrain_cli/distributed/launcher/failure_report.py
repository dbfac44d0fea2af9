"""What Paddle's launcher says when its ranks end with a usage error: nothing of its own, so the error is said once.

Paddle's launcher copies the node's first rank (local rank 0) into its own stdout as it runs, and when a rank fails it
logs `LAUNCH ERROR ... Container failed !!!` with the failed rank's command, then copies again the last 3000 bytes of
the failed rank's log (`Container.tail`); launch.sh then prints the cause's line (`job.cause`). A typo'd key, which
every rank finds, reached the console three times (rank 0's copy, the tail, launch.sh's line) under the launcher's
noise. When this node's ranks recorded a usage error (`job.decide`: exit 2, never retried, as one process exits), the
launcher's report and tail are left out (`install`). When the first rank said the error (its own `error:` line, or its
watcher's line on the rank that left with it, `departure`), its log is copied to its end once the ranks and their
watchers are done, so that the line is surely on the console, and launch.sh leaves out its line, which would repeat it
(`job.cause`). Any other failure keeps the launcher's report, which launch.sh's line refers to.
"""
from __future__ import annotations

import logging

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
    tail, finalize = Container.tail, ControllerBase.finalize

    def quiet_tail(self, length=3000):
        if not usage_ended():
            return tail(self, length)
        return None

    def finalize_copied(self, exit=True):
        self.pod.join()  # (finalize's own first step: the ranks are done, their logs complete)
        if usage_ended():
            job.wait_for_watchers(job.verdict_dir())  # (a watcher writes its line after its rank has ended)
            if job.said_on_console(job.verdict_dir()) and self.pod.containers:
                # the first rank's log to its end (the error's line, which launch.sh omits): each call copies at most
                # 1000 lines and says True while more may follow (Container.logs; Pod.logs says nothing)
                while self.pod.containers[0].logs():
                    pass
        return finalize(self, exit)

    Container.tail, ControllerBase.finalize = quiet_tail, finalize_copied
