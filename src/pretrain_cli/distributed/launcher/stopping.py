"""How long Paddle's launcher lets its ranks stop: `STOP_TIMEOUT` seconds, patched in by scripts/paddle_launch.py.

Why: at its first SIGINT/SIGTERM Paddle's launcher (3.3.1: `ControllerBase.stop` in
paddle/distributed/launch/controllers/controller.py) sends SIGTERM to every rank and calls `pod.stop(timeout=30)`,
which SIGKILLs every rank still running 30 s later (`Container.terminate(force=True)`). A rank stopped by a signal
finishes its step and saves (`training.stop_signals`): a save longer than that was killed half-way and its checkpoint
lost, however long the scheduler would have waited. `install` replaces that one call: the ranks get `STOP_TIMEOUT`
seconds in all from the launcher's signal (`DEFAULT`; 0: no limit), and a stop that outlasts them is said in one
line before they are killed. Paddle's second signal, its force quit (`pod.stop(timeout=10)`), is left as it is:
whoever sends a second signal means it.

Launcher side: no Paddle at import (`install` imports the launcher's controller module when it is called).
"""
from __future__ import annotations

import os
import sys
import time

ENV = "STOP_TIMEOUT"
# seconds: the step under way and a save, as long as the ranks' own watchers allow them with the default
# hang_timeout (300 s a step, 600 s a save: distributed.launcher.progress.allowance) before they call a rank hung
DEFAULT = 900


def timeout_seconds(environ=os.environ) -> int:
    """`STOP_TIMEOUT` in whole seconds (0: no limit); anything else raises ValueError with the line to print."""
    raw = environ.get(ENV, "").strip()
    if not raw:
        return DEFAULT
    if not raw.isdigit():
        raise ValueError(f"launch.sh: {ENV}={raw!r}: give the seconds the ranks get to finish their step and save "
                         f"after a stop's signal as a whole number (default {DEFAULT}; 0: no limit)")
    return int(raw)


def install(limit: int) -> None:
    """Paddle's launcher stops its ranks with `limit` seconds (`stop_ranks`) in place of its 30."""
    from paddle.distributed.launch.controllers import controller

    def stop(self, sigint=None):  # Paddle 3.3.1's ControllerBase.stop, but for its `self.pod.stop(timeout=30)`
        self.ctx.logger.debug("Controller stop")
        self.watcher.stop()
        self.master.stop()
        stop_ranks(self.pod.containers, limit)

    controller.ControllerBase.stop = stop


def stop_ranks(containers, limit: int, clock=time.monotonic) -> bool:
    """SIGTERM to every rank (`Container.terminate`: to its process group, up to 3 times 0.2 s apart, as Paddle's
    `pod.stop` sends it), then wait for all of them `limit` seconds in all (0: for ever; Paddle's `pod.join` gave each
    rank its whole timeout in turn); the ranks still running then are said and SIGKILLed. True: all ended in time."""
    for c in containers:
        c.terminate()
    deadline = clock() + limit if limit else None
    if all(c.wait(None if deadline is None else max(0.0, deadline - clock())) for c in containers):
        return True
    print(f"launch.sh: the ranks had not finished their stop {limit} s after the signal ({ENV}); killing them: the "
          f"checkpoint they were saving is lost (a re-run resumes from the newest complete one). Give a stop more "
          f"time with {ENV} (and the scheduler's grace period before its SIGKILL)", file=sys.stderr, flush=True)
    for c in containers:
        c.terminate(force=True)
    return False
