"""A launch as scripts/launch.sh runs it: each rank's own verdict, the job's exit code and whether to restart
(the ports the job holds: `ports`; the console's account of its end: `account`; launch.sh's entry: scripts/job.py).

**Verdicts.** Paddle's launcher exits with the code of the lowest-numbered rank that failed, which is
usually a rank stopped because another one died (rank 0 killed by its watcher after rank 1's usage error:
247). So each rank records its own end in `$PRETRAIN_CLI_VERDICTS/rank-R.json` (launch.sh's own directory, named by
it: `job.py verdicts`, `tempdirs`; the CLI: the exit code of a
usage error, a system error, a failed rendezvous; the rank watcher: the signal or code of a rank that died
first), and `decide()` reads them: a usage error on any rank is exit 2 and is not retried; a failed
rendezvous (exit 75, EX_TEMPFAIL) is retried with new ports without counting as a restart; otherwise the
first rank's own code (124 for a rank that made no progress, `distributed.launcher.watcher.HUNG`; 1 for a node whose
ranks were all stopped by another node's failure), retried while MAX_RESTART allows. The rank watchers write their
records after the launcher may have exited, so `decide` first waits for them (`wait_for_watchers`), and `account.cause`
gives the console, once, on stderr, the record's line, where Paddle's launcher named the lowest rank it saw stop,
usually one stopped because another died (`failure_report`).
"""
from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path

VERDICTS_ENV = "PRETRAIN_CLI_VERDICTS"
JOIN_ENV = "PRETRAIN_CLI_JOIN_DIR"  # where the ranks mark their join for their launcher (`launcher.joining`)
USAGE, TRANSIENT = 2, 75
SIGNALLED = (130, 143)  # a launcher stopped by SIGINT / SIGTERM (scripts/paddle_launch.py's codes)
RENDEZVOUS_TRIES = 3


def verdict_dir() -> Path | None:
    value = os.environ.get(VERDICTS_ENV)
    return Path(value) if value else None


_joining = [False]  # whether this process has begun joining the process group (`joined`)


def record(rank: int, code: int | None, kind: str, line: str, directory: Path | None = None,
           overwrite: bool = True, local: str | None = None, rerun: bool = False) -> None:
    """This rank's own end (`kind`: "usage", "system", "transient", "interrupted", "peer" (stopped because
    another rank failed), "crashed" (an unexpected exception: a bug), "died", "hung", "lost" (ended by gloo after a
    rank on another host failed), "stopped" (by a signal, after saving: exit 0), "finished" (a rank alone that died at
    exit after its run had finished, recorded by its launcher: exit 0); "joining" while it joins the
    process group, cleared once joined), when launched by launch.sh; best effort, never raises. A usage error found
    before this rank began joining is marked `before_join`: a run-wide check (the argument file, the data, the
    checkpoint to resume; some made by rank 0 alone), found before any watcher runs, whose line needs no rank to be
    acted on, so `account.cause` says it as one process does whether or not the launcher stopped the other ranks
    first. `local`: the rank's local rank (its workerlog's number) when another process records for it (a waiting
    rank's join limit naming a rank that never came: `join_deadline`), else this process's. `rerun`: the line says
    how the rank ended only, and `account.cause` adds the advice to re-run, from the user's output settings (a rank
    alone on its node that died without a watcher's line, recorded by its launcher: `failure_report`)."""
    directory = directory or verdict_dir()
    if directory is None or code is None:
        return
    path = Path(directory) / f"rank-{rank}.json"
    with contextlib.suppress(OSError):
        if overwrite or not path.exists():
            from pretrain_cli import atomic

            atomic.write_json(path, {"rank": rank, "exit": int(code), "kind": kind, "line": line, "time": time.time(),
                                     "local": os.environ.get("PADDLE_LOCAL_RANK", "") if local is None else local,
                                     **({"before_join": True} if kind == "usage" and not _joining[0] else {}),
                                     **({"rerun": True} if rerun else {})})


def clear(rank: int) -> None:
    """Forget this rank's record: its join succeeded (marked for the launcher's join watch too)."""
    joined(rank, True)
    forget(rank)


def forget(rank: int) -> None:
    """Remove rank `rank`'s record, if any."""
    directory = verdict_dir()
    if directory is not None:
        with contextlib.suppress(OSError):
            (directory / f"rank-{rank}.json").unlink(missing_ok=True)


def joined(rank: int, done: bool, allowance: float | None = None) -> None:
    """Mark this rank inside the join of the process group (`joining.R`: its pid, and `allowance`, the seconds its
    run lets the other nodes' ranks take to come there, `none` for no limit) or through it (`joined.R`) in the
    directory its launcher's join watch reads (`JOIN_ENV`, set by scripts/paddle_launch.py on several nodes:
    `launcher.joining`). Without one, the rank limits its own wait to `allowance` (`join_deadline`). Best effort."""
    _joining[0] = True
    value = os.environ.get(JOIN_ENV)
    if not value:
        from pretrain_cli.distributed.launcher import join_deadline

        join_deadline.disarm() if done else join_deadline.arm(rank, allowance, _world_size(), record, verdict_dir())
    if value:
        from pretrain_cli import atomic

        mark = str(os.getpid()) if done else f"{os.getpid()} {'none' if allowance is None else allowance}"
        with contextlib.suppress(OSError):
            atomic.write_text(Path(value) / f"{'joined' if done else 'joining'}.{rank}", mark)


def _world_size() -> int | None:
    value = os.environ.get("PADDLE_TRAINERS_NUM", "")
    return int(value) if value.isdigit() else None


def wait_for_watchers(directory, seconds: float = 15.0) -> None:
    """The rank watchers of this node (`watcher-R.pid` while each runs) write the job's verdict and their naming
    line after the launcher may have exited (it reaps the ranks, not them): wait for them, up to `seconds`."""
    from pretrain_cli import processes

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        pids = []
        for path in Path(directory).glob("watcher-*.pid") if directory else ():
            with contextlib.suppress(OSError, ValueError):
                pids.append(int(path.read_text()))
        if not any(processes.alive(pid) for pid in pids):
            return
        time.sleep(0.05)


def read_records(directory) -> list[dict]:
    """The ranks' records in `directory` (`record`), those that can be read."""
    records = []
    for path in sorted(Path(directory).glob("rank-*.json")) if directory else ():
        with contextlib.suppress(OSError, ValueError):
            records.append(json.loads(path.read_text(encoding="utf-8")))
    return records


def own_ends(records: list[dict]) -> list[dict]:
    """The records of ranks that ended by themselves (not stopped by another's failure, a signal, a join; nor a rank
    that died at exit after the run had finished), first first; an error that is the collective library's reaction
    to a lost peer after every other (`reaction`)."""
    return sorted((r for r in records if r.get("kind") not in ("peer", "joining", "stopped", "finished")),
                  key=lambda r: (reaction(r), r.get("time", 0)))


def reaction(record: dict) -> bool:
    """Whether a rank's recorded end is gloo's (or NCCL's) error on losing a peer, not a cause of its own: a rank
    SIGKILLed drops its connections at once, and the semi-auto engine's collectives raise that as an OSError
    (Paddle's `(External) RuntimeError: ... Connection reset by peer`), which the CLI records as a "system" end,
    often before the dead rank's watcher records the death (launch.sh then named a survivor, exit 1)."""
    from pretrain_cli.runtime import COLLECTIVE_FAILURES

    line = str(record.get("line", "")).lower()
    return record.get("kind") in ("system", "crashed") and any(m in line for m in COLLECTIVE_FAILURES)


def decide(directory, launcher_rc: int) -> tuple[int, str]:
    """(the job's exit code, "stop" / "retry" / "rendezvous") from the ranks' records and the launcher's code."""
    records = read_records(directory)
    own = own_ends(records)
    if any(r.get("exit") == USAGE and r.get("kind") == "usage" for r in own):
        return USAGE, "stop"
    if any(r.get("kind") == "interrupted" for r in own):  # Ctrl-C: the user stopped it
        return 130, "stop"
    if not own and any(r.get("kind") == "joining" for r in records):  # a rank died inside the join, nothing else
        if launcher_rc in SIGNALLED:  # killed there by its launcher's stop on SIGINT / SIGTERM: the stop, no retry
            return launcher_rc, "stop"
        return TRANSIENT, "rendezvous"
    if own and own[0].get("exit") == TRANSIENT:
        return TRANSIENT, "rendezvous"
    if own:
        return int(own[0]["exit"]), "retry"
    if any(r.get("kind") in ("stopped", "finished") for r in records):  # saved at a stop, or finished: done
        return 0, "stop"
    if any(r.get("kind") == "peer" for r in records):  # stopped because a rank of another node failed
        return 1, "retry"
    if launcher_rc in (USAGE, 130, 143):  # a usage error (the launcher's own), interrupted, terminated: not retried
        return launcher_rc, "stop"
    return launcher_rc, "retry"
