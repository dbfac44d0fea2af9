"""The nodes' join after their meeting at MASTER, watched by each node's launcher (scripts/paddle_launch.py): a node
lost between the meeting and the join of the process group is named, and this node's ranks stopped, instead of
waiting in Paddle's own join (its TCP store, then gloo's rendezvous through it) without a word: a rank there was still
waiting after 17 minutes when it was stopped.

After the meeting (`rendezvous.guard`) every launcher beats at MASTER's store: a counter under
`/<job id>/pretrain_cli_alive/<node>` every `BEAT` s, `joined` once its ranks have all joined (then it stops),
`left` when it exits before that (its ranks failed at start-up, or it was stopped). Until its own ranks have joined
it reads the others': a node that left, whose beat has not changed for `SILENCE` s (killed, its host down, the
network cut), or whose MASTER has not answered for `SILENCE` s (the node serving MASTER's store is gone: the store is
a thread of its launcher) is lost. Silence is counted in this launcher's own reads, each at most `CAP` s: a launcher
that was itself not scheduled for a while counts no one silent for it.

A lost node is acted on once every rank of this node waits in the join: each rank marks `joining.R` (its pid) and
`joined.R` in the directory `JOIN_ENV` names (`job.record` / `job.clear`, around `distributed.setup`'s join). A rank
of this node still starting up may yet fail on its own (the same bad key on every node), and a rank that died is
its own failure: both are the launcher's to report, as before. Then one line names the lost node, this node's ranks
are killed and the launcher exits `LOST` (1, as a rank lost on another host: restarted under MAX_RESTART).
Plain HTTP with a timeout (`Store`): Paddle's own client waits for ever on a host that is gone.
"""
from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

from pretrain_cli.distributed.launcher import job

BEAT = 1.0  # s between beats (and reads)
SILENCE = 30.0  # s without a beat, or without an answer from MASTER: the node is lost
CAP = 3.0  # the most one read adds to a silence (this launcher's own stall is nobody's silence)
LOST = 1  # the exit code: a rank failed elsewhere (`watcher.LOST`)
ALIVE = "pretrain_cli_alive"
NODE_KEY, HOST_KEY, SERVES_KEY = "pretrain_cli_node", "pretrain_cli_host", "pretrain_cli_serves"


class Store:
    """MASTER's key-value store (Paddle's HTTP KV server), each request limited to `timeout` s."""

    def __init__(self, endpoint: str, timeout: float = 3.0):
        import urllib.request

        self.url = endpoint if endpoint.startswith("http://") else f"http://{endpoint}"
        self.timeout = timeout
        self.opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def put(self, key: str, value: str) -> bool:
        import urllib.request

        try:
            self.opener.open(urllib.request.Request(self.url + key, value.encode()), timeout=self.timeout).close()
        except OSError:
            return False
        return True

    def get_prefix(self, key: str) -> dict | None:
        """{key: value} of the keys under `key` ({} when none), or None when MASTER did not answer."""
        import urllib.error

        try:
            with self.opener.open(self.url + key, timeout=self.timeout) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError as e:
            return {} if e.code == 404 else None
        except (OSError, ValueError):
            return None


def nodes_of(peers: list) -> list[dict]:
    """Each node of the meeting (Paddle's registrations, in its node order, tagged by `rendezvous._tagged`): its
    NODE_RANK and host name where it said them, its address, its first global rank and number of ranks, whether it
    serves MASTER's store."""
    out, first = [], 0
    for value in peers:
        try:
            data = json.loads(value)
        except (TypeError, ValueError):
            data = {}
        count = int(data.get("replicas", 1))
        out.append({"node": data.get(NODE_KEY), "host": data.get(HOST_KEY), "serves": bool(data.get(SERVES_KEY)),
                    "ip": str(data.get("candidate", "?")).rsplit(":", 1)[0], "first": first, "count": count})
        first += count
    return out


def describe(node: dict) -> str:
    """`node 1 (host b, 10.0.0.2; rank 1)`: how the user started it, where it is, which ranks it runs."""
    name = f"node {node['node']}" if node["node"] not in (None, "") else "the node"
    where = ", ".join(str(x) for x in (f"host {node['host']}" if node["host"] else None, node["ip"]) if x)
    last = node["first"] + node["count"] - 1
    ranks = f"rank {last}" if node["count"] == 1 else f"ranks {node['first']}-{last}"
    return f"{name} ({where}; {ranks})"


class Watch:
    """This launcher's side: node `me` of `nodes` (`nodes_of`), beating and reading under `prefix` at `store`;
    `join_dir`: where its ranks mark their join."""

    def __init__(self, store: Store, prefix: str, me: int, nodes: list[dict], join_dir: Path, master: str):
        self.store, self.prefix, self.me, self.nodes, self.join_dir = store, prefix, me, nodes, Path(join_dir)
        self.master, self.count, self.done, self.gone = master, 0, False, False
        self.lock = threading.Lock()  # a beat of the thread never lands after `leave` (it would undo it)
        self.quiet = {j: 0.0 for j in range(len(nodes)) if j != me}  # each other node's silence so far
        self.values: dict = {j: None for j in self.quiet}
        self.unanswered, self.last = 0.0, time.monotonic()

    def key(self, node: int) -> str:
        return f"{self.prefix}/{ALIVE}/{node}"

    def beat(self) -> None:
        with self.lock:
            self.count += 1
            if not self.gone:
                self.store.put(self.key(self.me), "joined" if self.done else str(self.count))

    def leave(self) -> None:
        """At the launcher's exit: a node whose ranks never joined says so (`left`): the others stop waiting now."""
        with self.lock:
            if not self.done and not self.gone:
                self.store.put(self.key(self.me), "left")
            self.gone = True

    def observe(self, now: float, seen: dict | None) -> list[tuple[int, str]]:
        """The nodes lost by now, each with why (`left`, `silent`, `master`), from one read of the beats (`seen`,
        None: MASTER did not answer)."""
        step, self.last = min(max(now - self.last, 0.0), CAP), now
        if seen is None:
            self.unanswered += step
            serving = [j for j, n in enumerate(self.nodes) if n["serves"] and j != self.me]
            return [(serving[0], "master")] if serving and self.unanswered >= SILENCE else []
        self.unanswered, lost = 0.0, []
        for j in list(self.quiet):
            value = seen.get(self.key(j))
            if value == "joined":  # its ranks joined: all of this node's are in the join too, or about to be
                del self.quiet[j]
            elif value == "left":
                lost.append((j, "left"))
            elif value != self.values[j]:
                self.values[j], self.quiet[j] = value, 0.0
            else:
                self.quiet[j] += step
                if self.quiet[j] >= SILENCE:
                    lost.append((j, "silent"))
        return lost

    def local_ranks(self) -> range:
        mine = self.nodes[self.me]
        return range(mine["first"], mine["first"] + mine["count"])

    def waiting(self) -> list[int] | None:
        """The pids of this node's ranks when every one of them is alive inside the join, else None; marks the watch
        done once they have all joined."""
        from pretrain_cli import processes

        if all((self.join_dir / f"joined.{r}").exists() for r in self.local_ranks()):
            self.done = True
            return None
        pids = []
        for r in self.local_ranks():
            try:
                pids.append(int((self.join_dir / f"joining.{r}").read_text()))
            except (OSError, ValueError):
                return None  # still starting up: it may fail on its own yet
            if (self.join_dir / f"joined.{r}").exists() or not processes.alive(pids[-1]):
                return None
        return pids

    def line(self, lost: list[tuple[int, str]]) -> str:
        node = os.environ.get("NODE_RANK")
        who = f"node {node}" if node else "this node"
        j, why = lost[0]
        how = {"left": "it left (its launcher ended: its console says why)",
               "silent": f"it has not beaten at MASTER for {SILENCE:.0f} s (killed, or its host down or unreachable)",
               "master": f"MASTER {self.master}, which it serves, has not answered for {SILENCE:.0f} s (killed, or its "
                         f"host down or unreachable)"}[why]
        more = f" and {len(lost) - 1} more node(s)" if len(lost) > 1 else ""
        mine = self.local_ranks()
        ranks = f"rank {mine[0]} stops" if len(mine) == 1 else f"ranks {mine[0]}-{mine[-1]} stop"
        return (f"launch.sh: {who}: lost {describe(self.nodes[j])}{more} before the ranks joined the process group: "
                f"{how}; this node's {ranks} too. Start that node again and re-run on every node (MAX_RESTART "
                f"restarts this one)")

    def run(self, end=os._exit) -> None:
        """Beat and read every BEAT s until this node's ranks have joined; end the launcher (`end(LOST)`) once a lost
        node leaves them waiting in the join."""
        while True:
            self.beat()
            if self.done:
                return
            lost = self.observe(time.monotonic(), self.store.get_prefix(f"{self.prefix}/{ALIVE}/"))
            pids = self.waiting()
            if self.done:
                self.beat()  # `joined`: the others stop counting this node's silence
                return
            if lost and pids:
                print(self.line(lost), file=sys.stderr, flush=True)
                for pid in pids:
                    with contextlib.suppress(OSError):
                        os.kill(pid, signal.SIGKILL)
                for r in self.local_ranks():  # not a failed join to retry with new ports (`job.decide`)
                    job.forget(r)
                self.leave()  # the others learn it now, not after SILENCE (this launcher may serve MASTER)
                sys.stdout.flush()
                end(LOST)
                return
            time.sleep(BEAT)


def start(store: Store, prefix: str, me: int, peers: list, join_dir: Path, master: str) -> Watch:
    """Watch the join of node `me` of the meeting's `peers` (a daemon thread of the launcher); `leave` at its exit."""
    import atexit

    watch = Watch(store, prefix, me, nodes_of(peers), join_dir, master)
    atexit.register(watch.leave)
    threading.Thread(target=watch.run, daemon=True, name="pretrain-cli-join-watch").start()
    return watch
