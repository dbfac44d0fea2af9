"""Which ranks of this host have come to the join of the process group and which have not, and why not, for a rank
that waits there under its own limit (`join_deadline`). Why: a rank stopped (`kill -STOP`) before the join left the
console silent for the whole start-up allowance (600 s), and then the healthy rank 0, which had waited, was the one
named. The ranks of a host are the children of their launcher (the waiting rank's parent) that carry a
`PADDLE_TRAINER_ID`; a rank has come to the join once its `joining` record is in launch.sh's verdict directory
(`job.record`, written just before the join: unknown without launch.sh); a rank not there is stopped (state T), gone,
or still starting up. Ranks on other hosts are not seen from here. Plain os calls only: this runs in the forked
helper, without Paddle, while the rank holds the GIL in Paddle's join."""
from __future__ import annotations

import json
import socket
from pathlib import Path

from pretrain_cli import processes


def host_ranks(rank_pid: int) -> dict[int, int]:
    """{rank: pid} of the launched ranks of this host: the children of `rank_pid`'s parent that carry a rank."""
    fields = processes._stat(rank_pid)
    if fields is None or len(fields) < 2:
        return {}
    out = {}
    for pid in processes.children(int(fields[1])):
        rank = _environ(pid).get("PADDLE_TRAINER_ID", "").strip()
        if rank.isdigit():
            out[int(rank)] = pid
    return out


def _environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    pairs = (item.decode(errors="replace").partition("=") for item in raw.split(b"\0") if item)
    return {k: v for k, _, v in pairs}


def came(verdicts, ranks) -> set | None:
    """The ranks of `ranks` that have come to the join (their `joining` record), or None without a verdict directory."""
    if not verdicts:
        return None
    out = set()
    for r in ranks:
        try:
            if json.loads((Path(verdicts) / f"rank-{r}.json").read_text()).get("kind") == "joining":
                out.add(r)
        except (OSError, ValueError, AttributeError):
            continue
    return out


def absent(ranks: dict, arrived: set | None, me: int) -> list[tuple[int, int, str]]:
    """[(rank, pid, why)] of this host's ranks that hold the join up, the likeliest cause first: stopped, gone, then
    still starting up (known only with `arrived`). A rank that came (its `joining` record) and was stopped or died
    there is listed too, worded as such by `note` and `named` (`arrived`): it was said to have never come."""
    out = []
    for r, pid in sorted(ranks.items()):
        if r == me:
            continue
        came = arrived is not None and r in arrived
        if processes.stopped(pid):
            out.append((0, r, pid, "stopped (kill -STOP, a debugger, a paused job: state T)"))
        elif not processes.alive(pid):
            out.append((1, r, pid, "gone (it ended in the join)" if came else "gone (it ended before the join)"))
        elif arrived is not None and not came:
            out.append((2, r, pid, "still starting up (its workerlog says where it is)"))
    return [(r, pid, why) for _, r, pid, why in sorted(out)]


def note(me: int, pid: int, waited: float, allowance: float, world_size: int | None, ranks: dict,
         missing: list, arrived: set | None) -> str:
    """The waiting note: how long this rank has waited, who on this host has come and who has not, and when it ends."""
    who = f"the process group of {world_size} ranks" if world_size else "the process group"
    here = sorted((arrived or set()) | {me})
    have = f"rank{'s' if len(here) > 1 else ''} {', '.join(map(str, here))} came"
    gaps = "; ".join(f"rank {r} (pid {p}) " + (f"came but is {why}" if r in (arrived or ()) else f"has not: {why}")
                     for r, p, why in missing)
    if not missing:
        gaps = ("every rank of this host has" if arrived is not None or not ranks else
                "the others' arrival is not known here (no launch.sh)")
    elsewhere = (f"; the other {world_size - len(ranks)} rank(s) are on other hosts"
                 if world_size and ranks and world_size > len(ranks) else "")
    return (f"[pretrain-cli] rank {me} (pid {pid} on {socket.gethostname()}): waiting {waited:.0f} s in the join of "
            f"{who}: on this host {have}, {gaps}{elsewhere}; the join is given up {allowance:.0f} s after this rank "
            f"came (hang_timeout's start-up allowance)")


def named(me: int, culprit: tuple[int, int, str], more: int, allowance: float, world_size: int | None,
          code: int, came: bool = False) -> str:
    """The line naming the rank of this host that holds the join up (`culprit`: rank, pid, why): one that never came,
    or (`came`) one that came and was stopped or died there."""
    r, pid, why = culprit
    who = f"the process group of {world_size} ranks" if world_size else "the process group"
    others = f" (and {more} more rank(s) of this host)" if more else ""
    state = f"came to the join of {who} but is {why}," if came else f"has not come to the join of {who}"
    return (f"[pretrain-cli] rank {r} (pid {pid} on {socket.gethostname()}){others} {state} {allowance:.0f} s after "
            f"rank {me} came to it (hang_timeout's start-up allowance){'' if came else ': ' + why}; the ranks stop, "
            f"killed (launch.sh: exit {code}). Find what holds rank {r} and re-run")


def local_rank(pid: int) -> str:
    """The rank's PADDLE_LOCAL_RANK (its workerlog's number), "" when unknown."""
    return _environ(pid).get("PADDLE_LOCAL_RANK", "")
