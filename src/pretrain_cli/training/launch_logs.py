"""Which lines of the workerlogs launch.sh keeps in output_dir are one launch's, and what that launch wrote down of its
end (`recorded_end`: the next start's word on a run that left its lock, `run_lock.unfinished`).

Why a start line: Paddle's launcher appends every launch to the same log/workerlog.N, and a line says nothing of the
launch that wrote it. Read by time alone (every line past the holder's start), a later launch's lines counted as the
killed run's: a launch that failed on its arguments after a run killed with kill -9 was quoted as that run's cause. So
every launched rank's first line (`say_start`) is stamped and names its rank, its pid and its launch (`(launch D)`: the
name Paddle's launcher gives one node's launch, POD_NAME); the run lock holds rank 0's pid. A launch's lines in a log
run from its start line to the next start line; rank 0's start line with the lock's pid finds the holder's launch, and
that launch's name its lines in the other ranks' logs of that node. Another node's logs (log/node-N/ under MASTER)
hold another launch's name: there the launch that started last by `NODE_SKEW` after rank 0's start (nodes start
together; their clocks may differ), and not before rank 0's launch before it, counts.
Lines a later launch's rank wrote before its start line (an import that failed) cannot be told apart.
"""
from __future__ import annotations

import calendar
import os
import re
import socket
import time
from pathlib import Path

TAIL = 1 << 16  # the bytes of a log's end read for its verdict and error lines
SCAN = 1 << 20  # the bytes read at a time, backwards, for the start line governing that tail
NODE_SKEW = 60.0  # seconds another node's rank may start after rank 0 and still be of its launch
LAUNCH = "launch"  # the start line's word before its launch's name: `(launch D)`, written and read by this module
# a launched rank's start line (`say_start`), in the log format of `training.metrics`
START = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)[^\]]*\] \[ *INFO\] - rank (\d+) of \d+ started: pid (\d+) on "
                   r"(\S+) \(" + re.escape(LAUNCH) + r" (\S*)\)\s*$")
_START_BYTES = b"] - rank "


def say_start() -> None:
    """Under a launcher (its rank in PADDLE_TRAINER_ID): this rank's start line, first in its workerlog."""
    rank = os.environ.get("PADDLE_TRAINER_ID")
    if rank is None:
        return
    now = time.time()
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now)) + f",{int(now % 1 * 1000):03d}"
    print(f"[{stamp}] [    INFO] - rank {rank} of {os.environ.get('PADDLE_TRAINERS_NUM', '?')} started: pid "
          f"{os.getpid()} on {socket.gethostname()} ({LAUNCH} {os.environ.get('POD_NAME', '')})", flush=True)


def _segments(log: Path) -> list[tuple[tuple | None, list[str]]]:
    """The last `TAIL` bytes of `log` as [(start, lines)]: each run of lines with the start line (stamp, rank, pid,
    host, launch's name) it follows (None: no start line before it in the whole log)."""
    try:
        with open(log, "rb") as f:
            size = f.seek(0, 2)
            at = max(0, size - TAIL)
            f.seek(at)
            data = f.read()
            head = None if at == 0 else _start_before(f, at)
    except OSError:
        return []
    lines = data.decode("utf-8", "replace").splitlines()
    if at > 0:
        lines = lines[1:]  # (the tail's first, cut line)
    segments: list[tuple[tuple | None, list[str]]] = [(head, [])]
    for line in lines:
        start = START.match(line.strip())
        if start:
            segments.append((start.groups(), []))
        else:
            segments[-1][1].append(line.strip())
    return segments


def _start_before(f, end: int) -> tuple | None:
    """The last start line in the log's bytes before `end`, read backwards `SCAN` bytes at a time."""
    while end > 0:
        begin = max(0, end - SCAN)
        f.seek(begin)
        chunk = f.read(end - begin + 512)  # (past `end`: a start line the boundary cut)
        for line in reversed(chunk.splitlines()):
            if _START_BYTES in line and (start := START.match(line.decode("utf-8", "replace").strip())):
                return start.groups()
        end = begin
    return None


def _seconds(stamp: str) -> float:
    return calendar.timegm(time.strptime(stamp, "%Y-%m-%d %H:%M:%S"))


def holders_lines(out: Path, holder: dict) -> list[tuple[Path, list[str]]]:
    """[(log, lines)]: the lines the launch of the run that left `holder` wrote to the workerlogs in `out`'s log/
    (its node's logs first, rank 0's first); [] when no log holds that run's start line."""
    logs = sorted([*out.glob("log/workerlog.*"), *out.glob("log/*/workerlog.*")],
                  key=lambda p: (p.parent.name, int(p.suffix[1:]) if p.suffix[1:].isdigit() else 1 << 30))
    segments = {log: _segments(log) for log in logs}
    mine = ("0", str(holder.get("pid")), holder.get("host"))  # (rank, pid, host) of the holder's start line
    own = [(log, s) for log, segs in segments.items() for s in segs if s[0] is not None and s[0][1:4] == mine]
    if not own:
        return []
    node, start = own[-1][0].parent, own[-1][1][0]
    rank0 = [s for s, _ in segments[own[-1][0]] if s is not None]
    before = rank0[rank0.index(start) - 1] if rank0.index(start) > 0 else None  # (rank 0's launch before it)
    found = []
    for log in sorted(logs, key=lambda p: p.parent != node):  # (stable: rank 0's log first)
        if log.parent == node:
            found += [(log, lines) for s, lines in segments[log] if s is not None and s[4] == start[4]]
        else:  # another node's: its last launch started within NODE_SKEW of rank 0's
            near = [lines for s, lines in segments[log] if s is not None and (before is None or s[0] >= before[0])
                    and _seconds(s[0]) <= _seconds(start[0]) + NODE_SKEW]
            found += [(log, near[-1])] if near else []
    return found


def recorded_end(out: Path, holder: dict) -> tuple[Path, str] | None:
    """(log, line): how the run that left `holder` ended, as its launch wrote it down in its workerlogs
    (`holders_lines`): its watchers' verdict (a rank that died, a hang they named, a rank that left with its error:
    `rank_log.VERDICT`), else a rank's own `error:` line (rank 0's first). None where none says (no launcher, another
    LOG_DIR, an end nothing wrote down): then the line names the ends that say nothing."""
    from pretrain_cli.distributed.launcher import rank_log

    verdicts, errors = [], []
    for log, lines in holders_lines(out, holder):
        said = None
        for line in lines:
            if rank_log.VERDICT.match(line):
                said = (log, line.removeprefix(rank_log.PREFIX))  # (the last a log holds)
            elif line.startswith("error: ") and "is in use by another run" not in line:
                errors.append((log, line.removeprefix("error: ")))  # (not a second job's refusal: `_refusal`)
        verdicts += [said] if said else []
    found = verdicts[:1] or errors[:1]  # (a verdict is the host's one account: every rank's log holds it)
    if not found:
        return None
    log, line = found[0]
    line = re.sub(r"^rank \d+: (?=rank \d+ \(pid)", "", line)  # (another rank's log: the rank named is the news)
    for cut in ("; the other ranks stop too", "; this rank stops too"):  # (its re-run advice is the next start's now)
        line = line.split(cut, 1)[0]
    return log, line if len(line) <= 400 else line[:399] + "…"

