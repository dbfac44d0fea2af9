"""The words of the lines a rank's watcher writes: its one line for the host's verdict (`line`: a death, a hang, the
loss of a rank elsewhere; `distributed.launcher.verdict`), the ranks that verdict names (`named`: also the death
notice a dead rank's watcher pays for its part of a save, `watcher.Watcher._pay`), a straggler's line (`straggler`),
and a death's one line (`died`), which the launcher of a rank alone, without a watcher, writes too
(`failure_report._record_alone`). Apart from `watcher`, which watches the ranks and decides when to write, so that
what a line says can be read (and tested) apart from the loop. What a line says is read from the watcher (`w`: its
rank `me`, the host's `ranks` and `host`, its watch directory `shared`, the job's ranks elsewhere `remote`, the run's
`output` settings) and from what is on disk when it is written (the background checkpoint writes, `unsaved`; where a
re-run starts, `rerun`). Plain os calls only, as the forked watcher needs. `w` is taken, not imported: `watcher`
imports this module.
"""
from __future__ import annotations

import signal
import time
from pathlib import Path

from pretrain_cli import processes
from pretrain_cli.distributed.launcher import progress, rank_log, rerun, unsaved


def died(rank: int, pid: int, host: str, status: int | None, notes: Path | None) -> str:
    """`rank R (pid P on H) died: killed by SIGKILL`; for a rank SIGKILLed once its stop had begun (its note
    `stopping.R` in `notes`, `watchdog.stop_began`), how far into the stop, doing what (its progress record there),
    most likely whose limit, and how to give a stop longer (`stopping.killed`). One line for a watcher's verdict and
    for the launcher of a rank alone without one (`failure_report._record_alone`; its notes in launch.sh's verdict
    directory), which said the stop cut off as any death (often the OOM killer's)."""
    from pretrain_cli.distributed.launcher import stopping

    said = f"rank {rank} (pid {pid} on {host}) died: {processes.describe_status(status)}"
    if notes is None or status is None or status & 0x7F != signal.SIGKILL:
        return said
    try:
        mark = (Path(notes) / f"stopping.{rank}").read_text()
    except OSError:
        return said
    record = progress.read(Path(notes), [rank]).get(rank, {})
    return said + stopping.killed(mark, time.time(), record.get("phase", "?"), record.get("step", 0))


def straggler(w, rank: int, ratio: float) -> str:
    """The line naming rank `rank` of `w`'s host a straggler (`progress.stragglers`: `ratio` x the others' work)."""
    who = "" if rank == w.me else f"rank {w.me}: "
    return (f"[pretrain-cli] {who}rank {rank} (pid {w.ranks[rank]} on {w.host}) is a straggler: "
            f"its own work per step (data and forward, the median of the last {progress.WINDOW} "
            f"steps) takes {ratio:.1f}x the other ranks'; training goes on\n")


def _elsewhere(remote: dict) -> str:
    elsewhere = ", ".join(f"rank {r} on {h}" for r, h in sorted(remote.items())[:4])
    return elsewhere + (", …" if len(remote) > 4 else "")


def named(w, cause: dict, seen: tuple | None = None) -> str:
    """The ranks `cause` names and what became of them: `rank R (pid P on H) died: killed by SIGKILL`; then the
    background checkpoint writes the stop leaves unsaved (`unsaved.clause`, by `seen`: `line`'s one look)."""
    causes, statuses, elsewhere = cause["ranks"], cause["statuses"], _elsewhere(w.remote)
    # (the loss of a rank elsewhere names no rank of this host as its cause: any write here is one cut short)
    lost = unsaved.clause(cause.get("writing"), [] if cause["kind"] == "lost" else causes, w.output[0],
                          w.ranks, seen)
    if cause["kind"] == "lost":
        said = ", ".join(f"rank {r} (pid {w.ranks[r]} on {w.host}) "
                         + ("was aborted by the collective library" if (st or 0) & 0x7F == signal.SIGABRT
                            else "stopped") + f" ({processes.describe_status(st)})"
                         for r, st in zip(causes, statuses))
        said += (f": it lost a rank on another host ({elsewhere}), which died, failed or stopped answering; "
                 f"that node's workerlog (scripts/launch.sh: output_dir/log/node-N) names it")
    elif cause["kind"] == "hung":
        r = causes[0]
        said = (f"rank {r} (pid {w.ranks[r]} on {w.host}) made no progress for {cause['seconds']:.0f} s "
                f"while in {cause['phase']} at step {cause['step']}")
        if cause["phase"] in progress.WAITING and w.remote:  # every rank here waits: for a rank elsewhere
            said += f", waiting for a rank on another host ({elsewhere}), which that node's workerlog names"
    else:
        said = ", ".join(died(r, w.ranks[r], w.host, st, w.shared) for r, st in zip(causes, statuses))
    return said + lost


def line(w, cause: dict, own: bool = False) -> str:
    """The watcher `w`'s line for `cause` (the host's one verdict) in its rank's log, and for launch.sh's record: what
    happened to whom (`named`), and what to do (fix a usage error; else re-run, saying where the same command
    starts). `own`: the line of a rank that is the cause itself, for its own record."""
    writing = cause.get("writing")
    # the writes' state looked at once for the line: asked twice, rank 0 dying in between made `named` say "not
    # saved" and the advice "if rank 0 publishes it"
    seen = unsaved.states(writing, w.output[0], w.ranks) if writing else None
    causes, statuses, said = cause["ranks"], cause["statuses"], named(w, cause, seen)
    # where rank 0 may still publish a write (`named` says so), the re-run takes it if it does: both named
    both = unsaved.resume_advice(writing, w.ranks, *w.output, seen=seen)
    to = f": {both}" if both else f" to {rerun.resumes(*w.output)}"  # (as output_dir holds it now)
    if cause["kind"] == "lost":  # the cause is elsewhere: its node's log, not this host's, says what it was
        lead, stop = ("", "") if w.me in causes or own else (f"rank {w.me}: ", "; this rank stops too")
        return (f"\n{rank_log.PREFIX}{lead}{said}{stop}. Re-run the same command (or launch with "
                f"MAX_RESTART){to}.\n")
    usage = any(processes.exit_code(st) == 2 for st in statuses)  # a usage error: resuming would repeat it
    if w.me in causes or own:
        todo = ("Fix the error above, then re-run" if usage else
                f"Re-run the same command (or launch with MAX_RESTART){to}")
        return f"\n{rank_log.PREFIX}{said}; the other ranks stop too. {todo}.\n"
    todo = "for its error" if usage else f"for its cause; re-run{' the same command' if both else ''}{to}"
    return f"\n{rank_log.PREFIX}rank {w.me}: {said}; this rank stops too. See that rank's workerlog {todo}.\n"
