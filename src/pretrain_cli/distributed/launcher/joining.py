"""The nodes' join after their meeting at MASTER, watched by each node's launcher (scripts/paddle_launch.py): a node
lost between the meeting and the join of the process group, or alive but with ranks that never come to the join, is
named and this node's ranks stopped, instead of waiting in Paddle's own join (its TCP store, then gloo's rendezvous
through it) without a word: a rank there was still waiting after 17 minutes when it was stopped.

After the meeting (`rendezvous.guard`) every launcher beats at MASTER's store: a counter under
`/<job id>/pretrain_cli_alive/<node>` every `BEAT` s (`<n> in` once every rank of its node waits in the join),
`joined <n>` once its ranks have all joined (beating on while they run, and `ended <code>` at its end: `after_join`,
which names a node lost meanwhile), and `left <code> <action>` when it ends before that: how
launch.sh ends that node (`leaving.own_end`: `job.decide` on its ranks' records and the launcher's own code), said when
Paddle's launcher has decided that code and before it stops MASTER's store (`leaving.note_end`); a node serving that
store keeps it up `LINGER` s more, for the others to read it. Until its own ranks have joined it reads the others': a
node that left, whose beat has not changed for `SILENCE` s (killed, its host down, the network cut), or whose MASTER has
not answered for `SILENCE` s (the node serving MASTER's store is gone: the store is a thread of its launcher) is lost; a
node whose ranks are not all in the join the start-up allowance after this node's ranks all were is late (alive, but a
start-up stalled there: it beats on for ever). The allowance is the run's own (`hang_timeout`, at least `progress.START`
s; 0: none), which each rank of this node marks with its join; it is counted from this node's own arrival, not from the
meeting, so a start-up that is as slow on every node is nobody's lateness. Silence and lateness are counted in this
launcher's own reads, each at most `CAP` s: a launcher that was itself not scheduled for a while counts no one silent or
late for it.

A lost or late node is acted on once every rank of this node waits in the join: each rank marks `joining.R` (its pid
and allowance) and `joined.R` in the directory `JOIN_ENV` names (`job.joined`, around `distributed.setup`'s join). A
rank of this node still starting up may yet fail on its own (the same bad key on every node), and a rank that died is
its own failure: both are the launcher's to report, as before. Then one line names the node, this node's ranks are
killed and the launcher ends with the class of the first cause, so that every node's launch.sh does the same
(`leaving.follow`): a node that left with a usage error (2) or was stopped by a signal (130, 143) ends the others so,
never restarted; one whose ranks could not join (75, which its launch.sh retries with new ports) ends them with 75 and
the records that make theirs retry too; a node that vanished without a word (silent, or MASTER gone with the node
serving it: killed, its host down, the network cut) ends them as a failed join does, 75 (`leaving.VANISHED`: nothing has
run, a new launch may succeed, so launch.sh meets the nodes at MASTER again with new ports, and a scheduler reads
EX_TEMPFAIL); any other end is `LOST` (1) and a late node `HUNG` (124), restarted under MAX_RESTART. A node whose own
ranks still start up when another left with `HUNG` is late itself (the others name every node not in the join by their
deadline): it ends too, its ranks killed, `HUNG`, where its stalled rank would otherwise hold it for ever. Plain HTTP
with a timeout (`Store`): Paddle's own client waits for ever on a host that is gone.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import sys
import threading
import time
from pathlib import Path

from pretrain_cli.distributed.launcher import after_join, job, leaving, progress

BEAT = 1.0  # s between beats (and reads)
SILENCE = 30.0  # s without a beat, or without an answer from MASTER: the node is lost
CAP = 3.0  # the most one read adds to a silence or a lateness (this launcher's own stall is nobody's)
LINGER = 5.0  # s a node serving MASTER's store keeps it up after its `left`: the others read it every BEAT s
LOST, HUNG = leaving.LOST, leaving.HUNG  # the exit codes: a rank failed elsewhere; a node's ranks never came
ALIVE = "pretrain_cli_alive"
IN = "in"  # a beat's second word once every rank of its node waits in the join
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
        self.lock = threading.RLock()  # a beat never lands after `leave` (it would undo it); RLock: a signal handler
        # may call `leave` (`leaving.note_end`) on the thread already inside it
        self.quiet = {j: 0.0 for j in range(len(nodes)) if j != me}  # each other node's silence so far
        self.values: dict = {j: None for j in self.quiet}
        self.late = dict.fromkeys(self.quiet, 0.0)  # each other node's time not all in the join while this one is
        self.arrived: set = set()  # the other nodes whose ranks all wait in the join now
        self.ends: dict = {}  # node -> (code, action) of each node that left
        self.unanswered, self.last, self.since = 0.0, time.monotonic(), 0.0  # since: the meeting, in own reads
        self.left_at = None  # when this node said `left`
        self.inside = False  # every rank of this node has marked its join
        self.allowance = progress.allowance("start-up", None, 0.0)  # (its ranks' own, once they mark it)
        self.beats = after_join.Beats(self.quiet)  # the others' beats after the join (`after_join`)

    def key(self, node: int) -> str:
        return f"{self.prefix}/{ALIVE}/{node}"

    def beat(self) -> None:
        with self.lock:
            self.count += 1
            if not self.gone:
                value = (f"joined {self.count}" if self.done else f"{self.count} {IN}" if self.inside
                         else str(self.count))
                self.store.put(self.key(self.me), value)

    def leave(self, end: tuple[int, str] | None = None) -> None:
        """At the launcher's exit: a node whose ranks never joined says so, and how it ends (`end`, else
        `leaving.own_end()`): the others stop waiting now, and end the same way (`leaving.follow`). A node serving
        MASTER's store keeps it up `LINGER` s more: the store ends with this launcher, and the others poll it. On a
        signal not here but in `keep_up`, once Paddle has told the ranks to stop: here it held the signal handler, so
        the ranks were told LINGER s late."""
        code, signalled = leaving.ended_with()  # on a signal the store is kept up after the ranks stop (`keep_up`)
        if self.done and not self.gone and end is None:  # after the join: said, and a node lost meanwhile named
            return after_join.end(self, code, not signalled and leaving.own_end()[0] == 0, describe,
                                  0.0 if signalled else LINGER, SILENCE, CAP)
        with self.lock:
            if not self.done and not self.gone:
                code, action = end or leaving.own_end()
                self.store.put(self.key(self.me), f"left {code} {action}")
                self.left_at = time.monotonic()
            self.gone = True
        if not signalled:
            self._linger()

    def keep_up(self) -> None:
        """After Paddle stopped this node's ranks on a signal, before it stops MASTER's store: the others read this
        node's `ended` (`after_join.keep_up`, at most LINGER s) or, before the join, its `left` (`_linger`)."""
        if self.done and self.left_at is None:
            after_join.keep_up(self, LINGER)
        else:
            self._linger()

    def _linger(self) -> None:
        """On the node serving MASTER's store, after this node's `left`: keep the store up until LINGER s after it."""
        if self.left_at is not None and self.nodes[self.me]["serves"]:
            time.sleep(max(0.0, self.left_at + LINGER - time.monotonic()))

    def observe(self, now: float, seen: dict | None, waiting: bool = False) -> list[tuple[int, str]]:
        """The nodes lost by now, each with why (`left`, `silent`, `master`), from one read of the beats (`seen`,
        None: MASTER did not answer); counts each other node's lateness too while this node's ranks all wait in the
        join (`waiting`; `overdue`)."""
        step, self.last = min(max(now - self.last, 0.0), CAP), now
        self.since += step
        if seen is None:  # (a node that left is gone for good: the one serving MASTER's store too)
            self.unanswered += step
            serving = [j for j, n in enumerate(self.nodes) if n["serves"] and j != self.me]
            gone = [(j, "left") for j in sorted(self.ends)]
            return gone or ([(serving[0], "master")] if serving and self.unanswered >= SILENCE else [])
        self.unanswered, lost = 0.0, []
        for j in list(self.quiet):
            value = seen.get(self.key(j))
            if str(value).split()[:1] in (["joined"], [after_join.ENDED]):  # its ranks joined: all of this node's
                # are in the join too, or about to be
                del self.quiet[j]
                self.arrived.add(j)
            elif leaving.left(value) is not None or j in self.ends:
                self.ends[j] = leaving.left(value) or self.ends[j]
                lost.append((j, "left"))
            else:
                if IN in str(value).split()[1:]:
                    self.arrived.add(j)
                else:
                    self.arrived.discard(j)
                    self.late[j] += step if waiting else 0.0
                if value != self.values[j]:
                    self.values[j], self.quiet[j] = value, 0.0
                else:
                    self.quiet[j] += step
                    if self.quiet[j] >= SILENCE:
                        lost.append((j, "silent"))
        return sorted(lost, key=lambda x: x[1] != "left")  # a node that left says how it ends: that class first

    def overdue(self) -> list[tuple[int, str]]:
        """The nodes alive whose ranks are not all in the join this node's start-up allowance after its own were."""
        if self.allowance is None:  # hang_timeout: 0, not watched
            return []
        return [(j, "late") for j in self.quiet if j not in self.arrived and self.late[j] >= self.allowance]

    def local_ranks(self) -> range:
        mine = self.nodes[self.me]
        return range(mine["first"], mine["first"] + mine["count"])

    def waiting(self) -> list[int] | None:
        """The pids of this node's ranks when every one of them is alive inside the join (their allowance noted),
        else None; marks the watch done once they have all joined."""
        from pretrain_cli import processes

        if all((self.join_dir / f"joined.{r}").exists() for r in self.local_ranks()):
            self.done = True
            return None
        marks = {}
        for r in self.local_ranks():
            with contextlib.suppress(OSError):
                marks[r] = (self.join_dir / f"joining.{r}").read_text().split()  # "<pid> <allowance s | none>"
        self.inside = len(marks) == len(self.local_ranks())
        if not self.inside:
            return None  # still starting up: it may fail on its own yet
        pids, allowances = [], []
        for r, mark in marks.items():
            try:
                pids.append(int(mark[0]))
                allowances.append(None if mark[1:2] == ["none"] else float(mark[1]) if mark[1:] else self.allowance)
            except (IndexError, ValueError):
                return None
            if (self.join_dir / f"joined.{r}").exists() or not processes.alive(pids[-1]):
                return None
        self.allowance = None if None in allowances else max(allowances)
        return pids

    def starting(self) -> list[int]:
        """This node's ranks that have not marked their join."""
        return [r for r in self.local_ranks() if not (self.join_dir / f"joining.{r}").exists()]

    def ending(self, lost: list[tuple[int, str]]) -> tuple[int, str]:
        """(code, action) this node ends with for `lost` (its first): the class of a node that left, a vanished
        node's (`leaving.VANISHED`: a failed join's) or a late one's (`HUNG`)."""
        j, why = lost[0]
        if why == "left":
            return leaving.follow(*self.ends[j])
        return (HUNG, "retry") if why == "late" else leaving.VANISHED

    def line(self, lost: list[tuple[int, str]], end: tuple[int, str] | None = None) -> str:
        """The one line naming the first of `lost` (and how many more), and how this node ends (`end`, else
        `ending(lost)`)."""
        node = os.environ.get("NODE_RANK")
        who = f"node {node}" if node else "this node"
        j, why = lost[0]
        mine = self.local_ranks()
        ranks = f"rank {mine[0]} stops" if len(mine) == 1 else f"ranks {mine[0]}-{mine[-1]} stop"
        tail = leaving.tail(*(end or self.ending(lost)), vanished=why in ("silent", "master"))
        more = f" and {len(lost) - 1} more node(s)" if len(lost) > 1 else ""
        if why == "late":
            return (f"launch.sh: {who}: {describe(self.nodes[j])}{more} has not brought its ranks to the join of the "
                    f"process group {self.late[j]:.0f} s after this node's (a start-up stalled there, or slower than "
                    f"the {self.allowance:.0f} s the run allows it: hang_timeout's start-up allowance; its workerlog "
                    f"says where its ranks are); this node's {ranks} too{tail}")
        how = leaving.how(*self.ends[j]) if why == "left" else {
            "silent": f"it has not beaten at MASTER for {SILENCE:.0f} s (killed, or its host down or unreachable)",
            "master": f"MASTER {self.master}, which it serves, has not answered for {SILENCE:.0f} s (killed, or its "
                      f"host down or unreachable)"}[why]
        return (f"launch.sh: {who}: lost {describe(self.nodes[j])}{more} before the ranks joined the process group: "
                f"{how}; this node's {ranks} too{tail}")

    def run(self, end=os._exit) -> None:
        """Beat and read every BEAT s until this node's ranks have joined; end the launcher (`end(code)`) once a lost
        or late node leaves them waiting in the join, or once this node is late itself."""
        while True:
            self.beat()
            if self.done:
                return after_join.beat_on(self, BEAT)
            pids = self.waiting()
            if self.done:  # `joined`: the others stop counting this node's silence; beats on while the ranks run
                return after_join.beat_on(self, BEAT)
            lost = self.observe(time.monotonic(), self.store.get_prefix(f"{self.prefix}/{ALIVE}/"), bool(pids))
            cause = (lost or self.overdue()) if pids else []
            if cause:
                end_as = self.ending(cause)
                return self._stop(self.line(cause, end_as), pids, end_as, end)
            gave_up = [j for j, why in lost if why == "left" and self.ends[j][0] == HUNG]
            if gave_up and not self.inside:  # a node gave up on the ranks not in the join: this node's are not
                return self._stop(self.late_line(gave_up[0]), self.children(), (HUNG, "retry"), end)
            time.sleep(BEAT)

    def late_line(self, j: int) -> str:
        node = os.environ.get("NODE_RANK")
        who = f"node {node}" if node else "this node"
        waited, mine = self.starting(), self.local_ranks()
        names = f"rank {waited[0]} has" if len(waited) == 1 else f"ranks {', '.join(map(str, waited))} have"
        ranks = f"rank {mine[0]} stops" if len(mine) == 1 else f"ranks {mine[0]}-{mine[-1]} stop"
        return (f"launch.sh: {who}: {describe(self.nodes[j])} gave up waiting for this node's ranks to join the "
                f"process group: {names} not reached the join {self.since:.0f} s after the nodes met at MASTER (a "
                f"start-up stalled here, or slower than hang_timeout's start-up allowance: this node's workerlog says "
                f"where); this node's {ranks} too{leaving.tail(HUNG, 'retry', 'them')}")

    @staticmethod
    def children() -> list[int]:
        """This launcher's ranks, by its children: a rank still starting up has marked no pid yet."""
        from pretrain_cli import processes

        return processes.children(os.getpid())

    def _stop(self, line: str, pids: list[int], end_as: tuple[int, str], end) -> None:
        """Say `line`, leave records that make launch.sh end as `end_as` (a failed join's for "rendezvous", none else:
        `job.decide` then reads the launcher's code), leave (lingering, when this node serves MASTER: its ranks wait
        on meanwhile, so Paddle's launcher does not end first), kill `pids` (this node's ranks), remove the join's
        marks, `end(code)`."""
        print(line, file=sys.stderr, flush=True)
        for r in self.local_ranks():
            if end_as[1] == "rendezvous":
                job.record(r, job.TRANSIENT, "joining", "died while joining the process group")
            else:  # not a failed join to retry with new ports (`job.decide`)
                job.forget(r)
        self.leave(end_as)  # the others learn it now, not after SILENCE
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(self.join_dir, ignore_errors=True)  # (`end` skips the launcher's exit functions, which would)
        sys.stdout.flush()
        end(end_as[0])


def start(store: Store, prefix: str, me: int, peers: list, join_dir: Path, master: str) -> Watch:
    """Watch the join of node `me` of the meeting's `peers` (a daemon thread of the launcher); `leave` at its exit."""
    import atexit

    watch = Watch(store, prefix, me, nodes_of(peers), join_dir, master)
    leaving.watch_ends(watch)
    atexit.register(watch.leave)  # (and at any other exit: `leaving.note_end` is the one before MASTER's store stops)
    threading.Thread(target=watch.run, daemon=True, name="pretrain-cli-join-watch").start()
    return watch
