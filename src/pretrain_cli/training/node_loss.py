"""Another node lost while the ranks ran, as the ranks themselves know it: that node's launcher died.

Why here, in the ranks: Paddle's launcher run directly (`python -m paddle.distributed.launch`, the README's multi-node
line) runs none of our code, so nothing there beats at MASTER or reads the others' beats (`after_join` does that
only in scripts/paddle_launch.py, under launch.sh). A node's launcher killed while its ranks train (kill -9 of its
process group, a scheduler's kill, a hang-up of Paddle's launcher) sends its ranks the kernel's SIGTERM
(`launch.end_with_launcher`); they stop as at a signal and save, and the ranks' agreement stops every other node's
ranks at the same step: those ended 0, `stopped at step N and saved`, and a scheduler recorded success with a node
gone. But a rank knows its own launcher died (`launch.launcher_gone`), so it says so in the launcher's TCP store
before the agreement (`report`: a counter and one record each, every rank's own write, read after the agreement
completes, so in place before it is read), and each rank whose own launcher lives reads who did once the stop is
agreed (`lost`): its node stopped for a node that is gone, which `line` names, and the rank ends 1
(`training.run_end`), as launch.sh's `after_join` ends such a node. At once, not after a silence: the lost node's
ranks said it themselves. A node whose host went down with its ranks is named by gloo's end instead (its watchers:
`lost a rank on another host`).
"""
from __future__ import annotations

import json
import os
import socket

from pretrain_cli.distributed.launcher import launch

KEY = "launcher_gone"  # the store's counter of ranks whose launcher died; KEY/<n>: the n-th one's record


def report(comm, rank: int) -> bool:
    """Before the stop's agreement, on a rank that asks for a stop: when its launcher is gone, say so in the store
    (its rank, host and address) for the other ranks; True if it did (once a run is enough: the caller keeps it)."""
    if comm.world < 2 or launch.launcher_gone() is None:
        return False
    n = comm.tally(KEY, 1)
    comm.publish(f"{KEY}/{n}", json.dumps({"rank": rank, "host": socket.gethostname(), "ip": _address()}))
    return True


def lost(comm) -> list[dict]:
    """After the stop was agreed, on a rank whose own launcher lives: the ranks whose launcher died (`report`), [] when
    none (or when this rank's launcher is gone too: its own node's loss is not another node's)."""
    if comm.world < 2 or launch.launcher_gone() is not None:
        return []
    return [json.loads(comm.read(f"{KEY}/{n}")) for n in range(1, comm.tally(KEY) + 1)]


def line(rank: int, gone: list[dict], mine: list[int], saved: str) -> str:
    """The one line a rank of a surviving node ends with: the lost node (the first host named, its ranks that said
    so), this node's ranks (`mine`), the stop's own line (`saved`) and what to do."""
    host = gone[0]["host"]
    ranks = sorted(r["rank"] for r in gone if r["host"] == host)
    who = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {', '.join(map(str, ranks))}"
    where = ", ".join(x for x in (f"host {host}", gone[0].get("ip") or "") if x)
    more = len({r["host"] for r in gone}) - 1
    also = f" and {more} more node(s)" if more else ""
    ours = f"rank {mine[0]}" if len(mine) == 1 else f"ranks {mine[0]}-{mine[-1]}"
    return (f"rank {rank}: lost the node of {who} ({where}){also} while the ranks ran: its launcher died (killed, or "
            f"its terminal or session closed), and its ranks stopped at their launcher's death; this node's {ours} "
            f"stopped too: {saved.rstrip('.')}. Exit 1: start that node again and re-run on every node "
            f"(MAX_RESTART restarts this one under scripts/launch.sh)")


def _address() -> str:
    """This rank's address as the launcher gave it (`PADDLE_CURRENT_ENDPOINT`, ip:port), "" when not given."""
    return os.environ.get("PADDLE_CURRENT_ENDPOINT", "").rpartition(":")[0]
