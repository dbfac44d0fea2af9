"""The nodes' beats at MASTER's store while their ranks run, after the join (`joining` watches the join itself): a
node whose launcher vanished mid-run is named at this node's end, which is then no success. Why: the launcher of node 1
killed with its process group (kill -9) at step 30 sends its ranks SIGTERM (`launch.end_with_launcher`), every rank
stops as at a signal and saves, and node 0's ranks, told to stop by the ranks' agreement, ended 0 with only
`stopped at step 32 and saved`: a scheduler recorded success, and nothing said node 1 was gone.

So once its ranks have joined, each launcher beats on (`joined <n>`, every BEAT s: `joining`) and reads the others'
beats (`Beats.read`); at its end (`end`, from `leaving.note_end`, before Paddle stops MASTER's store) it says
`ended <code>`. A node ending as a success (its ranks' records: done, or stopped and saved, with no signal of its own)
looks at the others for `GONE` s more: one that has neither said `ended` nor beaten since this node's end began
(killed, its host down, the network cut; for the node serving MASTER's store, MASTER not answering) is lost: one line
(launch.sh's account, from the records this writes in place of its ranks' `stopped` ones: `job.decide` then says
`LOST`, 1, restarted under MAX_RESTART), the node's own saved step kept in it, and the launcher's code is `LOST`
(`leaving.forced`). A node serving MASTER's store keeps it up until every other node has said `ended` (at most
LINGER s: `joining`), so that none of them takes the store's end for its loss.
"""
from __future__ import annotations

import os
import sys
import time

from pretrain_cli.distributed.launcher import job, leaving

GONE = 5.0  # s a node may stay silent at this node's end before it is lost (a live launcher beats every second)
ENDED = "ended"


def ended(value) -> bool:
    return str(value).split()[:1] == [ENDED]


class Beats:
    """What this node's launcher last read of the others' beats after the join, and when each last changed; `lost`:
    those found lost at its end."""

    def __init__(self, others):
        now = time.monotonic()
        self.values = dict.fromkeys(others)
        self.changed = dict.fromkeys(others, now)
        self.lost: list[int] = []

    def read(self, watch) -> None:
        seen = watch.store.get_prefix(watch.key(watch.me).rsplit("/", 1)[0] + "/")
        if seen is None:  # MASTER did not answer: nobody's beat changed
            return
        now = time.monotonic()
        for j in self.values:
            value = seen.get(watch.key(j))
            if value is not None and value != self.values[j]:
                self.values[j], self.changed[j] = value, now


def beat_on(watch, every: float) -> None:
    """Beat and read every `every` s until the launcher's end (`watch.gone`)."""
    while not watch.gone:
        watch.beat()
        watch.beats.read(watch)
        time.sleep(every)


def end(watch, code: int, success: bool, describe, linger: float, grace: float = GONE, poll: float = 0.25) -> None:
    """This node's end after the join (its launcher's code `code`; `success`: launch.sh will read it as one): said at
    MASTER, and, on a success, the nodes lost meanwhile named (`lost`; `describe`: `joining.describe`); a node serving
    MASTER's store keeps it up for at most `linger` s, until the others have said theirs."""
    with watch.lock:
        watch.store.put(watch.key(watch.me), f"{ENDED} {code}")
        watch.gone = True
    began = time.monotonic()
    if success:
        missing = lost(watch, began, grace, poll)
        if missing:
            _named(watch, missing, describe)
    if watch.nodes[watch.me]["serves"]:  # the others read `ended` from this store: up until they have said theirs
        while time.monotonic() < began + linger:
            watch.beats.read(watch)
            if all(ended(v) or j in watch.beats.lost for j, v in watch.beats.values.items()):
                break
            time.sleep(poll)


def lost(watch, began: float, grace: float, poll: float) -> list[int]:
    """The other nodes that, within `grace` s of `began`, neither said `ended` nor beat."""
    beats = watch.beats
    while True:
        beats.read(watch)
        waiting = [j for j, v in beats.values.items() if not ended(v) and beats.changed[j] <= began]
        if not waiting or time.monotonic() >= began + grace:
            beats.lost = waiting
            return waiting
        time.sleep(poll)


def _named(watch, missing: list[int], describe) -> None:
    """One line naming the first lost node, left as this node's ranks' records for launch.sh's account (said here
    without launch.sh); the launcher's code becomes `LOST`."""
    node = os.environ.get("NODE_RANK")
    who = f"node {node}" if node else "this node"
    first, more = missing[0], (f" and {len(missing) - 1} more node(s)" if len(missing) > 1 else "")
    serves = watch.nodes[first]["serves"]
    how = (f"MASTER {watch.master}, which it serves, stopped answering" if serves else
           "it stopped beating at MASTER") + " and it never said how it ended (its launcher killed, or its host down " \
                                             "or unreachable)"
    records = job.read_records(job.verdict_dir())
    saved = next((str(r["line"]).removeprefix("[pretrain-cli] ").rstrip(".") for r in records
                  if r.get("kind") == "stopped" and r.get("line")), "")
    mine = watch.local_ranks()
    ranks = f"rank {mine[0]}" if len(mine) == 1 else f"ranks {mine[0]}-{mine[-1]}"
    ours = f"this node's {ranks} stopped too: {saved}" if saved else f"this node's {ranks} ended too"
    line = (f"{who}: lost {describe(watch.nodes[first])}{more} while the ranks ran: {how}; {ours}. Exit "
            f"{leaving.LOST}: start that node again and re-run on every node (MAX_RESTART restarts this one)")
    if job.verdict_dir() is None:
        print(f"launch.sh: {line}", file=sys.stderr, flush=True)
    for r in mine:
        job.record(r, leaving.LOST, "lost", line)
    leaving.force(leaving.LOST)
