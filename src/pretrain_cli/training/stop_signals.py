"""SIGTERM/SIGINT during a run: a request to stop after the current step and save, never an abort mid-step.

Three states, one object for the whole run (`training.run.run` makes it; a `Trainer` built without one, as the
benchmarks build it, makes its own):
- `listen()`, while the training loop runs: a signal only sets `requested` (the loop agrees on it across ranks,
  finishes the step and saves), and from then on further signals are ignored: Paddle's launcher sends its SIGTERM up
  to 3 times 0.2 s apart, and one landing in the save's store wait failed it with EINTR (`TCP receive error ...
  Interrupted system call`: rank 0 crashed after a Ctrl-C under launch.sh, its checkpoint saved but the job exit 1);
- `hold()`, once the ranks agreed to stop, before the stop's save (a rank stopped by another rank's signal gets its
  own first SIGTERM from the launcher only then, mid-save): further signals are ignored, not handled, until the run
  has written its last files and released its lock. A second signal is common (the launcher's SIGTERM after a
  terminal's Ctrl-C); its default action would kill the saves, and a Python handler would interrupt the system call
  it lands in (a store wait fails with EINTR). The launcher still kills ranks not done after its limit (STOP_TIMEOUT
  under scripts/launch.sh, 30 s under Paddle's launcher run directly): the stop's start is noted for the rank's
  watcher, which names such a kill so (`distributed.launcher.stopping`), and when this run's last save took longer
  than the stop has left, one line says so before the save (`hold(step)`);
- `finishing()`, once the loop reached max_steps (its last checkpoint saved): a signal is said and ignored while
  the run evaluates and writes its final model (a SIGTERM there killed the export and left the lock; the run
  ends at once anyway, exit 0);
- `restore()`: the handlers the process had before (idempotent), by `run` after the lock is released, or by
  the loop itself when it ended without a signal and owns this object (a `Trainer` built without `run`).
"""
from __future__ import annotations

import signal

from pretrain_cli.distributed.launcher import progress, stopping, watchdog
from pretrain_cli.training.metrics import log

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class StopSignals:
    def __init__(self):
        self.requested = False
        self._previous: dict | None = None  # the handlers before `listen`, until `restore`
        self._held = False  # `hold` said so (once: the loop holds at the agreement and again as it ends)

    def listen(self) -> None:
        def handler(signum, frame):
            self.requested = True
            for s in SIGNALS:  # one request is the stop: a further signal only interrupts what the stop waits in
                signal.signal(s, signal.SIG_IGN)
            watchdog.stop_began()  # the launcher's limit counts from its signal
            log.warning(f"received {signal.Signals(signum).name}: finishing the current step, then saving")

        previous = {s: signal.signal(s, handler) for s in SIGNALS}
        if self._previous is None:  # (a second loop of the same run keeps the process's own)
            self._previous = previous

    def finishing(self) -> None:
        def handler(signum, frame):
            log.warning(f"received {signal.Signals(signum).name} after the last step (saved): finishing the "
                        f"evaluation and the final export, then exiting")

        for s in SIGNALS:
            signal.signal(s, handler)

    def hold(self, step: int | None = None) -> None:
        self.requested = True
        for s in SIGNALS:
            signal.signal(s, signal.SIG_IGN)
        if not self._held:
            watchdog.stop_began()  # (a stop agreed on another rank's signal: the launcher's is about to come here too)
            log.info("stopping: a further SIGINT/SIGTERM is ignored until the run has written its last files")
            short = None if step is None else stopping.short(step, progress.last_save())
            if short is not None:  # the save this stop makes will likely outlast the launcher's limit: said first
                log.warning(short)
            self._held = True

    def restore(self) -> None:
        self._held = False
        if self._previous is not None:
            for s, h in self._previous.items():
                signal.signal(s, h)
            self._previous = None
