"""The nodes' beats at MASTER's store while their ranks run, after the join (`joining` watches the join itself): a
node whose launcher vanished mid-run is named at this node's end, which is then no success. Why: the launcher of node 1
killed with its process group (kill -9) at step 30 sends its ranks SIGTERM (`launch.end_with_launcher`), every rank
stops as at a signal and saves, and node 0's ranks, told to stop by the ranks' agreement, ended 0 with only
`stopped at step 32 and saved`: a scheduler recorded success, and nothing said node 1 was gone.

So once its ranks have joined, each launcher beats on (`joined <n>`, every BEAT s: `joining`) and reads the others'
beats (`Beats.read`); at its end (`end`, from `leaving.note_end`, before Paddle stops MASTER's store) it says
`ended <code>`. A node whose ranks stopped and saved (their `stopped` records, with no signal of its own: the ranks'
agreement stops every node's ranks when one node's launcher dies) looks at the others for a while more, counted as
`joining` counts silence (up to `joining.SILENCE` s, in its own reads, each at most `joining.CAP` s: this launcher's
own stall is nobody's): a node that neither says `ended` nor beats again (its own counter past the one read as this
node's end began) is lost (killed, its host down, the network cut; for the node serving MASTER's store, MASTER not
answering): one line (launch.sh's account, from the records this writes in place of its ranks' `stopped` ones:
`job.decide` then says `LOST`, 1, restarted under MAX_RESTART), the node's own saved step kept in it, and the
launcher's code is `LOST` (`leaving.forced`). A node still beating ends the wait at its next beat. A run that ended
as done (its final export written, no `stopped` record) is never a loss: another node's launcher stalled past it
(frozen 12 s at the final export) had node 0 say `lost node 1` and exit 1 after 5 s, and a relaunch would have
waited for a node that had finished. A node serving MASTER's store keeps it up until every other node has said
`ended` (at most `joining.LINGER` s): on a signal only once Paddle has stopped its ranks (`keep_up`, from
`rendezvous`), so that the signal reaches them at once (it reached them 5.3-5.6 s late, the ranks training on).
Where the lost node's ranks live on to agree the stop (its launcher killed), they say their launcher's death themselves
and this node's ranks end 1 naming it (`training.node_loss`), which needs no launcher of ours: this look is then
skipped (no success); it remains for a launcher lost after the ranks had agreed their stop, too late for its ranks to
say it.
"""
from __future__ import annotations

import os
import sys
import time

from pretrain_cli.distributed.launcher import job, leaving

ENDED = "ended"


def ended(value) -> bool:
    return str(value).split()[:1] == [ENDED]


class Beats:
    """What this node's launcher last read of the others' beats after the join (each node's value: `joined <n>`, its
    own counter, or `ended <code>`); `lost`: those found lost at its end."""

    def __init__(self, others):
        self.values = dict.fromkeys(others)
        self.lost: list[int] = []

    def read(self, watch) -> bool:
        """Read the others' beats; False when MASTER did not answer (nobody's beat changed)."""
        seen = watch.store.get_prefix(watch.key(watch.me).rsplit("/", 1)[0] + "/")
        if seen is None:
            return False
        for j in self.values:
            value = seen.get(watch.key(j))
            if value is not None:
                self.values[j] = value
        return True


def beat_on(watch, every: float) -> None:
    """Beat and read every `every` s until the launcher's end (`watch.gone`)."""
    while not watch.gone:
        watch.beat()
        watch.beats.read(watch)
        time.sleep(every)


def end(watch, code: int, success: bool, describe, linger: float, silence: float, cap: float,
        poll: float = 0.25) -> None:
    """This node's end after the join (its launcher's code `code`; `success`: launch.sh will read it as one): said at
    MASTER, and, on a success of ranks that stopped and saved, the nodes lost meanwhile named (`lost`; `describe`:
    `joining.describe`; a node lost after `silence` s counted in reads of at most `cap` s each: `joining.SILENCE`,
    `joining.CAP`); a node serving MASTER's store keeps it up for at most `linger` s (0 on a signal: `keep_up` then,
    after its ranks are stopped), until the others have said theirs."""
    with watch.lock:
        watch.store.put(watch.key(watch.me), f"{ENDED} {code}")
        watch.gone = True
    if success and _stopped():
        missing = lost(watch, silence, cap, poll)
        if missing:
            _named(watch, missing, describe)
    keep_up(watch, linger, poll)


def keep_up(watch, linger: float, poll: float = 0.25) -> None:
    """On the node serving MASTER's store: keep it up until every other node has said `ended` (or was found lost), at
    most `linger` s; the others read this node's `ended` from it."""
    if not watch.nodes[watch.me]["serves"] or linger <= 0:
        return
    began = time.monotonic()
    while time.monotonic() < began + linger:
        watch.beats.read(watch)
        if all(ended(v) or j in watch.beats.lost for j, v in watch.beats.values.items()):
            break
        time.sleep(poll)


def _stopped() -> bool:
    """Whether this node's ranks stopped and saved (a `stopped` record): an end another node's loss may have caused.
    A run that ended done (its final export written) is complete whatever became of the others."""
    return any(r.get("kind") == "stopped" for r in job.read_records(job.verdict_dir()))


def lost(watch, grace: float, cap: float, poll: float) -> list[int]:
    """The other nodes that neither said `ended` nor beat again (past the value read as this node's end began) while
    `grace` s of silence were counted in this node's own reads, each read adding at most `cap` s."""
    beats = watch.beats
    beats.read(watch)
    began = dict(beats.values)  # each node's own counter as this end began: a beat read later but made before is none
    silence, last = 0.0, time.monotonic()
    while True:
        waiting = [j for j, v in beats.values.items() if not ended(v) and v == began[j]]
        if not waiting or silence >= grace:
            beats.lost = waiting
            return waiting
        time.sleep(poll)
        beats.read(watch)
        now = time.monotonic()
        silence, last = silence + min(max(now - last, 0.0), cap), now


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
