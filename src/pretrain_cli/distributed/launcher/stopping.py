"""How long Paddle's launcher lets its ranks stop: `STOP_TIMEOUT` seconds, patched in by scripts/paddle_launch.py.

Why: at its first SIGINT/SIGTERM Paddle's launcher (3.3.1: `ControllerBase.stop` in
paddle/distributed/launch/controllers/controller.py) sends SIGTERM to every rank and calls `pod.stop(timeout=30)`,
which SIGKILLs every rank still running 30 s later (`Container.terminate(force=True)`). A rank stopped by a signal
finishes its step and saves (`training.stop_signals`): a save longer than that was killed half-way and its checkpoint
lost, however long the scheduler would have waited. `install` replaces that one call: the ranks get `STOP_TIMEOUT`
seconds in all from the launcher's signal (`DEFAULT`; 0: no limit, while a launcher's death still gives them
`DEFAULT`, which its start says: `unlimited`), and a stop that outlasts them is said in one line before they are
killed. Paddle's second signal, its force quit (`pod.stop(timeout=10)`), is left as it is: whoever sends a second
signal means it.

Launcher side: no Paddle at import (`install` imports the launcher's controller module when it is called).

Rank side, for every launch form (a bare `python -m paddle.distributed.launch` too, whose 30 s nothing here can
lengthen: SIGTERM three times 0.2 s apart to each rank in turn, 30 s, three more, then SIGKILL to the rank's pid, so a
rank is killed 30 + 0.6 x (ranks on the node + 1) s after its first SIGTERM: measured 31.8 s on both of 2 ranks, the
launcher's exit 15 at 33.2 s): a rank knows the time its launcher gives a stop (`rank_limit`: `LIMIT_ENV`, which
scripts/paddle_launch.py sets, else Paddle's `PADDLE` when launched); its stop's start is noted (`began`, through
`watchdog.stop_began` from `training.stop_signals`) for its watcher, which names a SIGKILL during the stop as the
launcher's limit and says how to give a stop longer (`killed`); and when this run's last save took longer than the stop
has left, the stop says so before it saves (`short`). Paddle's launcher echoes rank 0's log only from its watch loop,
which its signal handler holds for the whole stop: under a bare launch these lines reach the workerlogs, not the
console.
"""
from __future__ import annotations

import os
import sys
import time

ENV = "STOP_TIMEOUT"
# seconds: the step under way and a save, as long as the ranks' own watchers allow them with the default
# hang_timeout (300 s a step, 600 s a save: distributed.launcher.progress.allowance) before they call a rank hung
DEFAULT = 900
LIMIT_ENV = "PRETRAIN_CLI_STOP_LIMIT"  # the seconds scripts/paddle_launch.py gives its ranks' stop (0: no limit)
SAID_ENV = "PRETRAIN_CLI_STOP_NOTE_SAID"  # set by launch.sh once its job's first launcher has started (`start_note`)
PADDLE = 30  # Paddle 3.3.1's launcher run directly: `pod.stop(timeout=30)`, then SIGKILL
_BEGAN: list = []  # when this rank's stop began (wall time), once `began`


def timeout_seconds(environ=os.environ) -> int:
    """`STOP_TIMEOUT` in whole seconds (0: no limit); anything else raises ValueError with the line to print."""
    raw = environ.get(ENV, "").strip()
    if not raw:
        return DEFAULT
    if not raw.isdigit():
        raise ValueError(f"launch.sh: {ENV}={raw!r}: give the seconds the ranks get to finish their step and save "
                         f"after a stop's signal as a whole number (default {DEFAULT}; 0: no limit)")
    return int(raw)


def unlimited(limit: int) -> str | None:
    """The line the launcher says at its start when a stop has no limit (`limit` 0), else None. Why: its ranks'
    deadline after its own death stays `DEFAULT` s (`launch.deadline_seconds`): then nothing is left to wait for them
    or to kill them, and a rank stuck in a collective (its peer gone, `hang_timeout: 0`) would outlive the job for
    ever; 0 reads as no limit at all, so the deadline in force is said."""
    if limit:
        return None
    return (f"launch.sh: {ENV}=0: a stop by signal waits for the ranks however long they take to save; should the "
            f"launcher die (launch.sh killed with its process group, a hang-up), each rank still ends itself "
            f"{DEFAULT} s after that, saved or not: give {ENV} the seconds to set both")


def start_note(limit: int, environ=os.environ) -> str | None:
    """`unlimited`'s line at the launcher's start, unless an earlier launcher of the same launch.sh said it: launch.sh
    starts one again after a failed rendezvous (up to 3 times) and for each MAX_RESTART restart, with `SAID_ENV` set;
    the line, the same each time, is said once a job."""
    return None if environ.get(SAID_ENV) else unlimited(limit)


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
    rank its whole timeout in turn); the ranks still running then are said, marked as killed by the launcher (for
    launch.sh's line: `account.killed_here`; a rank stuck in a native call never noted its stop) and SIGKILLed. True:
    all ended in time."""
    for c in containers:
        c.terminate()
    deadline = clock() + limit if limit else None
    if all(c.wait(None if deadline is None else max(0.0, deadline - clock())) for c in containers):
        return True
    print(f"launch.sh: the ranks had not finished their stop {limit} s after the signal ({ENV}); killing them: the "
          f"checkpoint they were saving is lost (a re-run resumes from the newest complete one). Give a stop more "
          f"time with {ENV} (and the scheduler's grace period before its SIGKILL)", file=sys.stderr, flush=True)
    from pretrain_cli.distributed.launcher import account

    for c in [c for c in containers if not c.wait(0)]:  # every kill below is ours, not the OOM killer's: marked first
        popen = getattr(getattr(c, "_proc", None), "_proc", None)  # (Paddle's ProcessContext's Popen: the rank)
        account.killed_here(c.env.get("PADDLE_TRAINER_ID", "?"), f"by the launcher, {limit} s into the stop ({ENV})",
                            getattr(popen, "pid", 0), stop=True)
    for c in containers:
        c.terminate(force=True)
    return False


# ------------------------------------------------------------------ the rank's side
def rank_limit(environ=os.environ) -> tuple[int | None, str]:
    """(seconds this rank's launcher gives a stop before it kills the rank, None: no limit known; who sets it:
    "STOP_TIMEOUT" (scripts/paddle_launch.py), "paddle" (Paddle's launcher run directly), "" (not launched))."""
    raw = environ.get(LIMIT_ENV, "").strip()
    if raw.isdigit():
        return int(raw) or None, ENV
    if environ.get("PADDLE_TRAINER_ID", "").strip():
        return PADDLE, "paddle"
    return None, ""


def began(clock=None) -> str | None:
    """This rank's stop begins (its signal, or the ranks' agreement on another rank's): noted once, for the time it
    has left (`short`); the first time, the note for its watcher (`watchdog.stop_began` leaves it: a SIGKILL from here
    on is the stop cut off, `killed`), else None."""
    if _BEGAN:
        return None
    _BEGAN.append((clock or time.time)())
    limit, source = rank_limit()
    return f"{_BEGAN[0]} {limit or 0} {source or '-'}"


def short(step: int, last_save: float | None, clock=None) -> str | None:
    """One line when this run's last save (`last_save` s: `progress.last_save`) took longer than the stop has left
    before the launcher's SIGKILL: the save of `step` will likely be cut off and lost, and how to give a stop longer;
    else None (no limit, no save measured yet, or time enough)."""
    limit, source = rank_limit()
    if not _BEGAN or limit is None or last_save is None:
        return None
    left = limit - ((clock or time.time)() - _BEGAN[0])
    if last_save <= left:
        return None
    return (f"stopping: this run's last save took {last_save:.0f} s, more than the {max(left, 0):.0f} s this stop has "
            f"left before {_who(limit, source)}: the save of step {step} will likely be cut off and its checkpoint "
            f"lost (a re-run resumes from the newest complete one); {_longer(source)}")


def killed(mark: str, now: float, phase: str, step: int) -> str:
    """The words after a rank's `killed by SIGKILL` when its stop had begun (`mark`: `began`'s note): how far into the
    stop, what it was doing, whose limit that most likely was, what was lost and how to give a stop longer."""
    try:
        at, limit, source = mark.split()
        at, limit = float(at), int(limit) or None
    except ValueError:
        return ""
    doing = f"while saving checkpoint-{step}" if phase.startswith("save") else f"in {phase} at step {step}"
    who = _who(limit, source) if limit else "whatever sent it (a scheduler after its grace period, the OOM killer)"
    return (f", {max(now - at, 0):.0f} s into its stop after a signal, {doing}: most likely {who}; that checkpoint is "
            f"lost (a re-run resumes from the newest complete one), {_longer(source)}")


def _who(limit: int, source: str) -> str:
    if source == "paddle":
        return (f"Paddle's launcher, run directly (python -m paddle.distributed.launch), kills the ranks {limit} s "
                f"after its signal")
    return f"the launcher kills the ranks {ENV}={limit} s after its signal (scripts/launch.sh)"


def _longer(source: str) -> str:
    if source == "paddle":
        return (f"launch with scripts/launch.sh, which gives a stop {ENV} s (default {DEFAULT}), and give the "
                f"scheduler's grace period as long")
    if source == ENV:
        return f"give a stop more time with {ENV} (and the scheduler's grace period before its SIGKILL)"
    return "give a stop more time where the SIGKILL came from (a scheduler's grace period)"
