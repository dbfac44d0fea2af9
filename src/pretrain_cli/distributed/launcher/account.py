"""The console's account of why a job launched by scripts/launch.sh ended: said once, on stderr, from the ranks' own
records (`job.record`), where Paddle's launcher names the lowest rank it saw stop, usually one stopped because another
died (`failure_report`). Below the first rank's line, what its log says of it since this launch began (`rank_log`).
A SIGKILL is said as often the kernel's OOM killer's, unless a stop's limit explains it or a mark of the job's own kill
names the process: `killed_here` leaves that mark before the launcher's kill after STOP_TIMEOUT or a rank's own kill
once its launcher is gone, and `killed_status` gives the watchers the status of such a death the launcher reaped first.
"""
from __future__ import annotations

import contextlib
import json
from pathlib import Path

from pretrain_cli.distributed.launcher import job, rank_log, rerun

OOM = " (often the kernel's OOM killer: see dmesg)"  # after `killed by SIGKILL`, unless a stop's limit or a kill of
# the job's own (`killed_here`) explains it


# the fatal signals that leave Python's fatal-error stack in the rank's log (faulthandler's: SIGILL, SIGABRT, SIGBUS,
# SIGFPE, SIGSEGV); a death by another (SIGTERM, SIGHUP, SIGPIPE, SIGXCPU, SIGKILL) leaves none to quote
STACKED = {128 + s for s in (4, 6, 7, 8, 11)}


def cause(directory, log_dir=None, output: tuple | None = None) -> str | None:
    """The console's account of why the job ended, from the ranks' records in `directory` (`log_dir`: the launcher's
    workerlog.N directory, named so the user finds the full log), or None when no rank recorded one: the first rank's
    own end, or where a signal stopped it and saved (rank 0's line), or the line of a rank stopped by another node.
    A usage error every rank recorded, or one found before the ranks joined (`job.record`'s `before_join`: a run-wide
    check, whatever records the other ranks left: none, or a "joining" one where the launcher killed them inside the
    join), is said as one process says it; one found later by some ranks names the first.
    Below the first rank's line, what its log says of it since this launch began (`rank_log`): its other `error:`
    lines, or the end of its traceback (an uncaught exception, or a death with an exit code: one before the CLI's
    handler ran) or of its stack (a fatal signal that leaves one). A rank the launcher killed once a stop by signal
    had outlasted STOP_TIMEOUT is named without the re-run advice: the launcher's own line has said the stop and
    what to do. `output`: the user's (output_dir, overwrite, resume_from), for the re-run advice a record made by the
    launcher leaves out (`job.record`'s `rerun`: a rank alone on its node, without a watcher to say it). A rank alone
    that died at exit after its run had finished (`finished`, recorded by its launcher) is said so, with its crash's
    end and no advice to re-run: its output is complete."""
    records = job.read_records(directory)
    own = job.own_ends(records)
    stopped = sorted((r for r in records if r.get("kind") == "stopped" and r.get("line")),
                     key=lambda r: r.get("rank", 0))
    peers = sorted((r for r in records if r.get("kind") == "peer" and r.get("line")), key=lambda r: r.get("time", 0))
    if not own and stopped:  # a signal stopped it and the ranks saved: where, and how to go on (else only in the logs)
        return f"launch.sh: {str(stopped[0]['line']).removeprefix(rank_log.PREFIX).strip()}"
    if not own and peers:  # every rank of this node stopped because a rank of another node failed: which, and how
        return f"launch.sh: {str(peers[0]['line']).removeprefix(rank_log.PREFIX).strip()}"
    finished = [r for r in records if r.get("kind") == "finished" and r.get("line")]
    if not own and finished:  # a rank alone died at exit after its run had finished: said so, with its crash's end
        log = Path(log_dir) / f"workerlog.{finished[0].get('local') or finished[0].get('rank')}" if log_dir else None
        more = rank_log.crash(rank_log.since(directory, log), fatal=True) if log is not None else []
        where = f" Its full log: {log}" if log is not None else ""
        return "\n".join([f"launch.sh: {_sentence(str(finished[0]['line']))}{where}", *more])
    if not own or not own[0].get("line"):
        return None
    first = own[0]
    line = str(first["line"]).removeprefix(rank_log.PREFIX).strip()
    if first.get("kind") == "lost":  # this node's rank was ended by another host's failure: not "ended the job"
        return f"launch.sh: {line}"
    log = Path(log_dir) / f"workerlog.{first.get('local') or first.get('rank')}" if log_dir else None
    where = f" Its full log: {log}" if log is not None else ""
    alike = first.get("kind") == "usage" and all(r.get("kind") == "usage" and r.get("line") == first["line"]
                                                 for r in (own if first.get("before_join") else records))
    if alike:  # every rank found it (a typo'd key), or it was found before the ranks joined: as one process says it
        said = rank_log.read(log, rank_log.start(directory, log)) if log is not None else ()
        return "\n".join(rank_log.errors(said, line))
    how, more, code = "", [], int(first.get("exit") or 0)
    if first.get("kind") in ("died", "hung"):  # the line says how: `died: killed by SIGKILL`, `made no progress`
        if code == 137:
            killed = _killed(directory, first.get("rank"), line)
            if killed and killed.get("stop"):  # the launcher's kill after a stop's limit: said by it already
                named = line.split("; the other ranks stop too", 1)[0]
                if "into its stop" not in named:
                    named = named.replace("killed by SIGKILL", f"killed by SIGKILL ({killed['why']})", 1)
                return f"launch.sh: {_sentence(named)}{where}"
            if "into its stop" not in line:  # (else the stop's limit is named already)
                why = f" ({killed['why']})" if killed else OOM
                line = line.replace("killed by SIGKILL", "killed by SIGKILL" + why, 1)
        if first.get("kind") == "died" and log is not None and (code in STACKED or 0 < code < 128):
            more = rank_log.crash(rank_log.since(directory, log), fatal=code in STACKED)
    else:
        how = f" (exit {first.get('exit')})"
        if first.get("kind") == "crashed" and log is not None:  # an uncaught exception: its traceback's end
            more = rank_log.crash(rank_log.since(directory, log))
        elif first.get("kind") in ("usage", "system") and log is not None:  # its other `error:` lines
            said = rank_log.read(log, rank_log.start(directory, log))
            more = [x for x in rank_log.errors(said, line) if x != f"error: {line}"]
    if first.get("rerun"):  # (a watcher's line gives it; with one rank, no "the other ranks stop too")
        line = f"{line.rstrip('.')}. {_advice(output)}"
    return "\n".join([f"launch.sh: rank {first.get('rank')} ended the job{how}: {_sentence(line)}{where}", *more])


def _advice(output: tuple | None) -> str:
    """What to do after a rank's death, as its watcher's line says it: re-run, to where the same command starts
    (`rerun`: from the user's own settings, a MAX_RESTART restart's not, `rerun.as_set`; as output_dir holds it now)."""
    starts = rerun.resumes(*rerun.as_set(*(output or (None, False, None))))
    return f"Re-run the same command (or launch with MAX_RESTART) to {starts}"


def _sentence(line: str) -> str:
    """`line` ended as a sentence: its own `?` or `!` kept (a did-you-mean question), else one full stop."""
    line = line.rstrip()
    return line if line.endswith(("?", "!")) else line.rstrip(".") + "."


def killed_here(rank, why: str, pid: int, stop: bool = False) -> None:
    """Before a SIGKILL of rank `rank` (process `pid`) by this job itself (the launcher once a stop's STOP_TIMEOUT has
    passed, `stop`: `stopping.stop_ranks`; the rank on its own once its launcher is gone, `launch.end_with_launcher`):
    `why`, left in launch.sh's verdict directory (`killed-R`), so that `cause` names that and not the kernel's OOM
    killer (the rank's own note of its stop, `into its stop`, is missing when its handler never ran: stuck in a native
    call). `cause` believes it only for a record naming that pid: a rank that kills itself long after its launcher
    died may leave it in the verdict directory of launch.sh's next launch. Best effort: without launch.sh, nothing."""
    directory = job.verdict_dir()
    if directory is not None:
        with contextlib.suppress(OSError):
            (directory / f"killed-{rank}").write_text(json.dumps({"pid": int(pid), "why": why, "stop": stop}))


def _killed(directory, rank, line: str) -> dict | None:
    """`killed_here`'s mark for rank `rank`, when the record's `line` names its process."""
    try:
        mark = json.loads((Path(directory) / f"killed-{rank}").read_text())
        return mark if f"(pid {int(mark['pid'])} on " in line and mark.get("why") else None
    except (OSError, TypeError, ValueError, KeyError):
        return None


def killed_status(rank, pid: int) -> int | None:
    """SIGKILL's wait status when this job's own kill of rank `rank` (`killed_here`) was of process `pid`, else None:
    for a watcher whose read of that death's status lost to the launcher's reap (Paddle's reaps once a second), so
    the death is named and recorded as the SIGKILL it was, not as `exit status unknown` without a record."""
    directory = job.verdict_dir()
    with contextlib.suppress(OSError, TypeError, ValueError, KeyError):
        if directory is not None and int(json.loads((directory / f"killed-{rank}").read_text())["pid"]) == pid:
            return 9  # (as waitpid reports a death by signal 9)
    return None
