"""The nodes' meeting at MASTER, with a limit: Paddle's launcher (its HTTP master, `--master ip:port`) waits for the
other nodes forever and says nothing while it waits (its `Waiting peer start...` is an INFO line, below launch.sh's
WARNING level). A second node never started, or started with another MASTER port (on the master's own host it then
hosts a master of its own, elsewhere it polls a port nothing answers), left every node waiting silently, for ever.

`guard(timeout)` (scripts/paddle_launch.py, in the launcher's own process, before it runs) wraps the master's
`sync_peers`, the one call in which a node waits for the others: after `NOTICE` s one line says what this node waits
for, and after `timeout` s (`RENDEZVOUS_TIMEOUT`, default `DEFAULT`; 0: no limit) one line says how far the meeting
got (nothing answered at MASTER, or k of n nodes joined) and what to do, and the launcher exits `EXIT` (75,
EX_TEMPFAIL: no rank has started, so nothing was written; launch.sh restarts it under MAX_RESTART). What the line
reports is what the launcher's own KV client saw: whether MASTER answered, and how many nodes had registered.

Each node also registers the number of nodes it was started for (NNODES): a node that sees another number ends at
once, exit 2 (with NNODES 2 and 3 the first node started its ranks with the second, whose launcher waited for a third
node: its ranks waited in the join of a process group whose other half never started). It registers its NODE_RANK,
host name and whether it serves MASTER's store too, for the watch of the join that follows the meeting
(`distributed.launcher.joining`: a node lost before the ranks joined, or whose ranks never come, is named, and the
waiting nodes end); and the code the launcher exits with goes to that watch first (`_note_ends`), so that a node
leaving before the join tells the others how it ends.
"""
from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path

from pretrain_cli.distributed.launcher import job, joining, leaving

TIMEOUT_ENV = "RENDEZVOUS_TIMEOUT"
DEFAULT = 600.0  # seconds: time to start the other nodes by hand, far below "for ever"
NOTICE = 10.0  # a wait longer than this is said once, so a silent console is explained
EXIT = 75  # EX_TEMPFAIL, as a failed join of the process group: nothing has run
USAGE = 2  # the nodes were started with different NNODES: a usage error, never retried
NODES_KEY = "pretrain_cli_nnodes"
LINGER = 5.0  # s the node hosting MASTER's store keeps it up after a disagreement: the others poll it every 0.5 s


def timeout_seconds() -> float:
    """`RENDEZVOUS_TIMEOUT` in seconds (0: wait for ever); a value that is not a number >= 0 is the default."""
    try:
        value = float(os.environ.get(TIMEOUT_ENV, DEFAULT))
    except ValueError:
        return DEFAULT
    return value if value >= 0 and value == value else DEFAULT


class Meeting:
    """What this node's launcher saw of the meeting: whether MASTER answered, how many nodes had registered."""

    def __init__(self, master: str, nodes: int):
        self.master, self.nodes = master, nodes
        self.answered, self.joined = False, 0
        self.hosting = False  # this launcher serves MASTER's store (it ends with it)

    def waiting(self, seconds: float) -> str:
        node = os.environ.get("NODE_RANK")
        who = f"node {node}" if node else "this node"
        so_far = (f"{self.joined} of {self.nodes} nodes have joined" if self.answered
                  else "nothing answers there yet")
        until = f"it gives up after {seconds:.0f} s" if seconds else "it waits with no limit"
        return f"launch.sh: {who} waits for the other nodes at MASTER {self.master} ({so_far}); {until} ({TIMEOUT_ENV})"

    def other_count(self, registrations) -> int | None:
        """Another number of nodes a registered node was started for (its NNODES), or None."""
        for value in registrations:
            try:
                nodes = json.loads(value).get(NODES_KEY)
            except (ValueError, AttributeError):
                continue
            if isinstance(nodes, int) and nodes != self.nodes:
                return nodes
        return None

    def disagree(self, other: int) -> str:
        node = os.environ.get("NODE_RANK")
        who = f"node {node}" if node else "this node"
        return (f"launch.sh: {who}: the nodes at MASTER {self.master} were started with different NNODES (this node "
                f"{self.nodes}, another {other}); start every node with the same NNODES")

    def failed(self, seconds: float) -> str:
        node = os.environ.get("NODE_RANK")
        who = f"node {node}" if node else "this node"
        if not self.answered:
            return (f"launch.sh: {who}: nothing answered at MASTER {self.master} for {seconds:.0f} s; start the "
                    f"node that hosts it (NODE_RANK=0, on that address) and give every node the same MASTER "
                    f"ip:port ({TIMEOUT_ENV} sets this wait, 0: no limit)")
        return (f"launch.sh: {who}: only {self.joined} of {self.nodes} nodes joined at MASTER {self.master} in "
                f"{seconds:.0f} s; start the other node(s) with the same MASTER and NNODES={self.nodes} (a node given "
                f"another MASTER port waits there alone) ({TIMEOUT_ENV} sets this wait, 0: no limit)")


def guard(timeout: float | None = None, notice: float = NOTICE) -> None:
    """Limit Paddle's HTTP master's wait for the other nodes to `timeout` s (`timeout_seconds()` when None)."""
    from paddle.distributed.launch.controllers import master as masters
    from paddle.distributed.launch.utils.kv_client import KVClient

    limit = timeout_seconds() if timeout is None else timeout
    meeting: list[Meeting] = []  # the meeting under way (sync_peers runs once per launch, on the main thread)
    ready, get_prefix, sync = KVClient.wait_server_ready, KVClient.get_prefix, masters.HTTPMaster.sync_peers

    def wait_server_ready(self, timeout=3):
        ok = ready(self, timeout)
        if ok and meeting:
            meeting[-1].answered = True
        return ok

    def seen(self, key):
        found = get_prefix(self, key)
        if found and meeting:
            meeting[-1].answered, meeting[-1].joined = True, len(found)
            other = meeting[-1].other_count(found.values())
            if other is not None:  # a node started with another NNODES: the meeting can never be right
                print(meeting[-1].disagree(other), file=sys.stderr, flush=True)
                sys.stdout.flush()
                if meeting[-1].hosting:  # the others learn it from this store: up until their next polls
                    time.sleep(LINGER)
                os._exit(USAGE)
        return found

    def sync_peers(self, prefix, key, value, size, rank=-1):
        if size < 2:
            return sync(self, prefix, key, value, size, rank)
        meeting.append(Meeting(self.ctx.args.master or "?", size))
        self.lazy_init()  # (sync's first step: whether this node serves the store is known after it)
        meeting[-1].hosting = getattr(self, "server", None) is not None
        value = _tagged(value, size, meeting[-1].hosting)
        done = threading.Event()
        if limit or notice:
            threading.Thread(target=_watch, args=(meeting[-1], done, limit, notice), daemon=True).start()
        try:
            peers, me = sync(self, prefix, key, value, size, rank)
        finally:
            done.set()
        if peers:  # met: the ranks start now; their join is watched until they are through it
            self.ctx.envs[job.JOIN_ENV] = _join_dir()
            joining.start(joining.Store(self.client.endpoint), prefix.rsplit("/", 1)[0], me, peers,
                          Path(self.ctx.envs[job.JOIN_ENV]), meeting[-1].master)
        return peers, me

    KVClient.wait_server_ready, KVClient.get_prefix, masters.HTTPMaster.sync_peers = wait_server_ready, seen, sync_peers
    _note_ends()


def _note_ends() -> None:
    """Tell the join's watch the code Paddle's launcher ends with (its ranks' code once they are all done, or 128 +
    the signal that stops it) before Paddle stops MASTER's store (`finalize`, `signal_handler`: `self.master.stop()`):
    a node that leaves before its ranks joined says there how launch.sh ends it, and the other nodes end the same way
    (`leaving.note_end`, `leaving.own_end`)."""
    from paddle.distributed.launch.controllers.controller import ControllerBase

    finalize, stopped = ControllerBase.finalize, ControllerBase.signal_handler

    def finalize_noted(self, exit=True):
        self.pod.join()  # (finalize's own first step: the code is its ranks' once they are all done)
        leaving.note_end(self.pod.exit_code)
        if leaving.forced() is None:
            return finalize(self, exit)
        finalize(self, False)  # a node lost while the ranks ran (`after_join`): not their success
        if exit:
            sys.exit(leaving.forced())

    def stopped_noted(self, sigint, frame):
        leaving.note_end(128 + sigint, signalled=True)  # `ended` said at once, no wait: the ranks are stopped now
        if hasattr(self, "sigint") or getattr(self, "master", None) is None:  # a second signal: Paddle's force quit
            return stopped(self, sigint, frame)
        store_stop, self.master.stop = self.master.stop, lambda *a, **k: None  # Paddle's stop() ends the store first
        try:
            return stopped(self, sigint, frame)  # (it ends with sys.exit)
        finally:  # the ranks stopped: the store kept up for the others to read this node's end, then stopped
            try:
                leaving.keep_up()
            finally:  # a second signal meanwhile is Paddle's force quit (sys.exit inside keep_up): the store is
                # a non-daemon server thread, so left running it would hold the launcher's exit for ever
                self.master.stop = store_stop
                store_stop()

    ControllerBase.finalize, ControllerBase.signal_handler = finalize_noted, stopped_noted


def _tagged(value: str, nodes: int, serves: bool = False) -> str:
    """The node's registration (the launcher's JSON) with the number of nodes it was started for (each node checks
    the others': `Meeting.other_count`), and what the join's watch names it by (`joining.nodes_of`). The launcher
    reads its own keys of it and ignores these."""
    import socket

    try:
        data = json.loads(value)
    except ValueError:
        return value
    if not isinstance(data, dict):
        return value
    return json.dumps({**data, NODES_KEY: nodes, joining.NODE_KEY: os.environ.get("NODE_RANK"),
                       joining.HOST_KEY: socket.gethostname(), joining.SERVES_KEY: serves})


def _join_dir() -> str:
    """A directory of this launcher's own where its ranks mark their join (`job.joined`): removed at its exit, by a
    signal too; named by this launcher, so that the next launch on the host removes it after a SIGKILL (`tempdirs`)."""
    from pretrain_cli.distributed.launcher import tempdirs

    return str(tempdirs.create(tempdirs.JOIN))


def _watch(meeting: Meeting, done: threading.Event, limit: float, notice: float) -> None:
    """Say a long wait once (after `notice` s); end the launcher when the meeting has not happened within `limit` s
    (0: no limit)."""
    rest = limit
    if notice and (not limit or notice < limit):
        if done.wait(notice):
            return
        print(meeting.waiting(limit), file=sys.stderr, flush=True)
        rest = limit - notice
    if not limit or done.wait(rest):
        return
    print(meeting.failed(limit), file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(EXIT)  # no rank has started; the KV server (node 0's) is a thread of this process
