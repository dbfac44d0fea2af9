"""How a node's launcher ends before its ranks joined, and how the others end after it (`distributed.launcher.joining`
watches the join; this module owns the ends): a node that leaves says how its launch.sh ends it (`left <code>
<action>` at MASTER's store): `own_end` (`job.decide` on its ranks' records and the launcher's own code), decided when
Paddle's launcher has its code and before it stops MASTER's store (`note_end`, which makes this launcher's watches
leave). A waiting node ends with the same class (`follow`), so that every node's launch.sh does the same: a usage
error (2) or a stop by a signal (130, 143) ends the others so, never restarted; a failed join (75) ends them with 75,
retried with new ports; any other end is `LOST` (1), restarted under MAX_RESTART. A node that vanished without saying
how it ends (SIGKILL, its host down, the network cut: `joining` hears no beat, or no MASTER) ends them as `VANISHED`, a
failed join's class: no rank has run, and a new meeting may succeed (its own launch.sh, when alive, joins again as its
ranks' join records say; a host back up is met again), where `LOST` restarted only under MAX_RESTART and told a
scheduler nothing. `how` and `tail` word that end in the one line a waiting node says.
"""
from __future__ import annotations

from pretrain_cli.distributed.launcher import job, watcher

LOST, HUNG = watcher.LOST, watcher.HUNG  # the exit codes: a rank failed elsewhere; a node's ranks never came
SIGNALLED = job.SIGNALLED  # a launcher stopped by SIGINT / SIGTERM (scripts/paddle_launch.py's codes)
VANISHED = (job.TRANSIENT, "rendezvous")  # how the others end after a node that vanished before the join (EX_TEMPFAIL)
_ENDED: list = []  # (code, by a signal) this launcher ends with, once Paddle's launcher has decided it (`note_end`)
_WATCHES: list = []  # the watches this launcher runs (`joining.start`, through `watch_ends`): each leaves at `note_end`
_FORCED: list = []  # the code this launcher ends with instead of its ranks' (`force`: a node lost after the join)


def note_end(code: int, signalled: bool = False) -> None:
    """Paddle's launcher is about to end with `code` (its ranks' code, or 128 + the signal that stops it: `signalled`),
    as the shell will see it (`rendezvous.guard` calls it before Paddle stops MASTER's store, which this launcher may
    serve): a node whose ranks have not joined leaves now, saying how launch.sh ends it (`Watch.leave`)."""
    _ENDED.append((code % 256, signalled))
    for watch in _WATCHES:
        watch.leave()


def keep_up() -> None:
    """Paddle has stopped this launcher's ranks on a signal and is about to stop MASTER's store (`rendezvous`): a node
    serving it keeps it up for the others to read its `ended` (`joining.Watch.keep_up`), after its ranks were told to
    stop, not before."""
    for watch in _WATCHES:
        watch.keep_up()


def ended_with() -> tuple[int, bool]:
    """(code, by a signal) this launcher ends with (`note_end`), (`LOST`, False) when not known."""
    return _ENDED[-1] if _ENDED else (LOST, False)


def force(code: int) -> None:
    """End this launcher with `code`, not its ranks' (`after_join`: a node lost while they ran, theirs a success)."""
    _FORCED.append(code)


def forced() -> int | None:
    """The code `force` set, if any (`rendezvous._note_ends`)."""
    return _FORCED[-1] if _FORCED else None


def watch_ends(watch) -> None:
    """Have `watch` (a `joining.Watch`) leave once Paddle's launcher has decided this launcher's code (`note_end`)."""
    _WATCHES.append(watch)


def own_end() -> tuple[int, str]:
    """(code, action) launch.sh will end this node's launch with: stopped by SIGINT / SIGTERM, not restarted (its ranks
    are stopped in the join, whose records would read as a failed join); else `job.decide` on its ranks' records and
    the launcher's own code (`LOST` when not known)."""
    code, signalled = ended_with()
    if signalled and code in SIGNALLED:
        return code, "stop"
    return job.decide(job.verdict_dir(), code)


def follow(code: int, action: str) -> tuple[int, str]:
    """This node's end when another node left before the join ending as (`code`, `action`): the same class, so that
    launch.sh does the same here (a usage error or a stop by signal: not restarted; a failed join: tried again with
    new ports; anything else: a rank lost elsewhere, restarted under MAX_RESTART)."""
    if action == "rendezvous":
        return job.TRANSIENT, "rendezvous"
    if action == "stop" and code in (job.USAGE, *SIGNALLED):
        return code, "stop"
    return LOST, "retry"


def left(value) -> tuple[int, str] | None:
    """How a node that left ends (`left <code> <action>`; a bare `left`: `LOST`, "retry"), or None for a beat."""
    parts = str(value).split()
    if not parts or parts[0] != "left":
        return None
    try:
        return int(parts[1]), parts[2]
    except (IndexError, ValueError):
        return LOST, "retry"


def how(code: int, action: str) -> str:
    """Why a node that left ending as (`code`, `action`) is lost, in the waiting node's line."""
    if action == "rendezvous":
        return f"its ranks could not join the process group (its launcher ended, exit {code}: its console says why)"
    if action == "stop" and code == job.USAGE:
        return f"it left with a usage error (exit {code}: its console says which)"
    if action == "stop" and code in SIGNALLED:
        return f"it was stopped (exit {code}: Ctrl-C or SIGTERM there)"
    return f"it left (its launcher ended, exit {code}: its console says why)"


def tail(code: int, action: str, whose: str = "that node's ranks", vanished: bool = False) -> str:
    """What the line of a node ending as (`code`, `action`) says it does, and what to do (`vanished`: after a node that
    said nothing)."""
    if action == "rendezvous" and vanished:
        return (f", exit {code} (nothing has run: a new meeting may succeed): launch.sh tries again with new ports at "
                f"MASTER for RENDEZVOUS_TIMEOUT s; start that node again if it does not come back by itself")
    if action == "rendezvous":
        return f", exit {code}: launch.sh tries again with new ports, as that node's does"
    if action == "stop":
        why = ": fix what that node's console names and re-run on every node" if code == job.USAGE else " (that node " \
              "was stopped)"
        return f", exit {code}, not restarted{why}"
    again = f", exit {code}. Find what holds {whose}" if code == HUNG else ". Start that node again"
    return f"{again} and re-run on every node (MAX_RESTART restarts this one)"
