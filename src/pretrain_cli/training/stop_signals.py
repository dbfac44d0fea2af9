"""SIGTERM/SIGINT (and SIGHUP) during a run: a request to stop after the current step and save, never an abort mid-step.

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
  under scripts/launch.sh, 30 s under Paddle's launcher run directly; a rank whose launcher died, which the kernel
  sent SIGTERM, SIGKILLs itself after the same limit: `distributed.launcher.launch.end_with_launcher`): the stop's
  start is noted for the rank's watcher, which names such a kill so (`distributed.launcher.stopping`), and when this
  run's last save took longer than the stop has left, one line says so before the save (`hold(step)`);
- `finishing()`, once the loop reached max_steps (its last checkpoint saved): a signal is said and ignored while
  the run evaluates and writes its final model (a SIGTERM there killed the export and left the lock; the run
  ends at once anyway, exit 0); `ending()`, once the loop ended with an error: the same, said as that (a rank whose
  save failed was told `after the last step (saved)` of the launcher's SIGTERM);
- `restore()`: the handlers the process had before (idempotent), by `run` after the lock is released, or by
  the loop itself when it ended without a signal and owns this object (a `Trainer` built without `run`).

SIGHUP (the terminal closed, an ssh session dropped) is a stop as SIGTERM is when the process started with its
default action, which kills the run mid-step, unsaved, its lock left for the next start to blame on a SIGKILL; one
started ignoring it (`nohup`) keeps ignoring it. Once it came, writes to the terminal fail (EIO): logging and tqdm's
bar swallow that, but a `print` (an error's one line) raises, and Python's last flush of a buffered line at exit
turns exit 0 into 1 (measured in a pty whose master was closed). So stdout and stderr, where they were the terminal
at the start, are pointed at /dev/null (`_detach`); one redirected to a file or pipe is left alone. /dev/null, not a
file: nobody reads the terminal any more, and what the stop would have said there is on disk anyway (the checkpoint,
metrics.jsonl; the next start's `resumed from` line). In every state after the first signal a SIGHUP only detaches
(with SA_RESTART, so a system call it lands in goes on: no EINTR in a store wait), never ignored: the terminal can
close during the stop's save too.
"""
from __future__ import annotations

import os
import signal

from pretrain_cli.distributed.launcher import launch, progress, stopping, watchdog
from pretrain_cli.training.metrics import log

SIGNALS = (signal.SIGTERM, signal.SIGINT)
# a launched rank's SIGTERM: how Paddle's launcher stops its ranks, whatever stop it got (Ctrl-C, SIGTERM, a hang-up);
# said as the way a Ctrl-C arrives, not as the sender (a handler is not told who sent it: a `kill` of the rank too)
LAUNCHED = " (a launched rank: a Ctrl-C or SIGTERM to the job reaches each rank as SIGTERM)"


class StopSignals:
    def __init__(self):
        self.requested = False
        self._previous: dict | None = None  # the handlers before `listen`, until `restore`
        self._held = False  # `hold` said so (once: the loop holds at the agreement and again as it ends)
        # the disposition at the start decides: default, a stop; ignored (nohup), left so
        self._hangup = signal.getsignal(signal.SIGHUP) == signal.SIG_DFL
        self._signals = SIGNALS + ((signal.SIGHUP,) if self._hangup else ())
        self._ttys = [fd for fd in (1, 2) if _is_terminal(fd)] if self._hangup else []  # (after a hang-up: no tty)

    def listen(self) -> None:
        def handler(signum, frame):
            if signum == signal.SIGHUP:
                self._detach()
            self.requested = True
            for s in SIGNALS:  # one request is the stop: a further signal only interrupts what the stop waits in
                signal.signal(s, signal.SIG_IGN)
            self._detach_on_hangup()
            watchdog.stop_began()  # the launcher's limit counts from its signal
            why = " (the terminal hung up: its output goes to /dev/null)" if signum == signal.SIGHUP else ""
            if signum == signal.SIGTERM and os.environ.get("PADDLE_TRAINER_ID", "").strip():
                why = LAUNCHED  # (under launch.sh a Ctrl-C too arrives as this SIGTERM)
            gone = launch.launcher_gone() if signum == signal.SIGTERM else None
            if gone is not None:  # the kernel's signal at the launcher's death (`launch.end_with_launcher`)
                why = f" (its launcher died: this rank ends itself {gone} s after that, saved or not)"
            log.warning(f"received {signal.Signals(signum).name}{why}: finishing the current step, then saving")

        previous = {s: signal.signal(s, handler) for s in self._signals}
        if self._previous is None:  # (a second loop of the same run keeps the process's own)
            self._previous = previous

    def finishing(self) -> None:
        def handler(signum, frame):
            if signum == signal.SIGHUP:
                self._detach()
            log.warning(f"received {signal.Signals(signum).name} after the last step (saved): finishing the "
                        f"evaluation and the final export, then exiting")

        for s in self._signals:
            signal.signal(s, handler)

    def ending(self) -> None:
        """The loop ended with an error (this rank's, or a rank's it waited on): a signal (the launcher's, stopping
        the ranks once one failed) is said as what it meets and ignored, as `finishing` does, while the run leaves."""
        def handler(signum, frame):
            if signum == signal.SIGHUP:
                self._detach()
            log.warning(f"received {signal.Signals(signum).name} while this rank ends with an error: ignored")

        for s in self._signals:
            signal.signal(s, handler)

    def hold(self, step: int | None = None) -> None:
        self.requested = True
        for s in SIGNALS:
            signal.signal(s, signal.SIG_IGN)
        self._detach_on_hangup()
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

    def _detach_on_hangup(self) -> None:
        """During the stop: a SIGHUP only detaches from the terminal, and restarts the system call it lands in."""
        if self._hangup:
            signal.signal(signal.SIGHUP, lambda signum, frame: self._detach())
            signal.siginterrupt(signal.SIGHUP, False)

    def _detach(self) -> None:
        """stdout and stderr that were the terminal now go to /dev/null (the module's docstring says why); what
        Python still buffers for them goes there at its next flush."""
        if not self._ttys:
            return
        null = os.open(os.devnull, os.O_WRONLY)
        try:
            for fd in self._ttys:
                os.dup2(null, fd)
        finally:
            os.close(null)
        self._ttys = []


def _is_terminal(fd: int) -> bool:
    try:
        return os.isatty(fd)
    except OSError:
        return False
