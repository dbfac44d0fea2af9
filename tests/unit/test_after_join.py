"""A node lost while the ranks ran (`distributed.launcher.after_join`): the launcher of node 1 killed with its process
group at step 30, its ranks stopped by their launcher's death and saved, and node 0's ranks, told to stop by the
ranks' agreement, ended 0 with only `stopped at step 32 and saved`: a scheduler recorded success. Now each launcher
beats on at MASTER's store after the join and says `ended <code>` at its end; a node ending as a success names a node
that did neither, and ends `LOST` (1). Here two watches share a stand-in of MASTER's store (no launched processes)."""
import json
import threading
from types import SimpleNamespace

import pytest

from pretrain_cli.distributed.launcher import account, after_join, job, joining, leaving

PEERS = [json.dumps({"candidate": "10.0.0.1:1", "replicas": 1, joining.NODE_KEY: "0", joining.HOST_KEY: "a",
                     joining.SERVES_KEY: True}),
         json.dumps({"candidate": "10.0.0.2:1", "replicas": 1, joining.NODE_KEY: "1", joining.HOST_KEY: "b"})]
STOPPED = "stopped at step 32 and saved; re-run the same command to resume from checkpoint-32"


class Store(dict):
    def put(self, key, value):
        self[key] = value
        return True

    def get_prefix(self, key):
        return {k: v for k, v in self.items() if k.startswith(key)}


@pytest.fixture
def nodes(tmp_path, monkeypatch):
    monkeypatch.setattr(leaving, "_ENDED", [])
    monkeypatch.setattr(leaving, "_FORCED", [])
    monkeypatch.setattr(joining, "SILENCE", 0.6)  # (the product's 30 s, counted as `joining` counts silence)
    monkeypatch.setattr(joining, "LINGER", 0.6)
    monkeypatch.setattr(leaving, "_WATCHES", [])
    monkeypatch.setenv("NODE_RANK", "0")
    monkeypatch.setenv(job.VERDICTS_ENV, str(tmp_path))
    job.record(0, 0, "stopped", STOPPED)  # node 0's rank stopped by the ranks' agreement, and saved
    store = Store()
    watches = [joining.Watch(store, "/job", me, joining.nodes_of(PEERS), tmp_path, "10.0.0.1:8090")
               for me in (0, 1)]
    for w in watches:
        w.done = True  # their ranks have joined
        w.beat()
    for w in watches:
        w.beats.read(w)
    return store, watches


def _end(watch, code=0):
    leaving.note_end(code)  # (as Paddle's launcher decides its code: no watch registered here, so `leave` by hand)
    watch.leave()


def test_a_node_that_vanished_while_the_ranks_ran_is_named_and_this_nodes_success_is_not_one(tmp_path, nodes):
    store, (node0, _) = nodes
    _end(node0)
    assert store["/job/pretrain_cli_alive/0"] == "ended 0"
    assert leaving.forced() == leaving.LOST == 1
    line = ("node 0: lost node 1 (host b, 10.0.0.2; rank 1) while the ranks ran: it stopped beating at MASTER and it "
            "never said how it ended (its launcher killed, or its host down or unreachable); this node's rank 0 stopped "
            f"too: {STOPPED}. Exit 1: start that node again and re-run on every node (MAX_RESTART restarts this one)")
    assert job.decide(tmp_path, 1) == (1, "retry")  # launch.sh: a lost node's class, not the stop's 0
    assert account.cause(tmp_path) == f"launch.sh: {line}"


def test_a_node_that_said_its_end_or_still_beats_is_not_lost(tmp_path, nodes, monkeypatch):
    store, (node0, node1) = nodes
    monkeypatch.setattr(joining, "SILENCE", 1e9)  # (a node still beating ends the wait at its beat, not at a limit)
    beating = threading.Thread(target=after_join.beat_on, args=(node1, 0.05))  # it beats on (its end still to come)
    beating.start()
    try:
        _end(node0)
    finally:
        node1.gone = True
        beating.join()
    assert leaving.forced() is None and job.decide(tmp_path, 0) == (0, "stop")
    node0.gone, node1.gone = False, False
    after_join.end(node1, 0, True, joining.describe, 0.0, joining.SILENCE, joining.CAP)  # node 1 ended first and said so ...
    assert store["/job/pretrain_cli_alive/1"] == "ended 0"
    _end(node0)  # ... then node 0 ends: no beat since, but its end is known
    assert leaving.forced() is None


def test_after_the_join_the_beats_still_count_as_joined_for_a_node_still_joining(tmp_path, nodes):
    _, (node0, _) = nodes
    w = joining.Watch(Store(), "/job", 0, joining.nodes_of(PEERS), tmp_path, "10.0.0.1:8090")
    for value in ("joined 7", "ended 0"):
        assert w.observe(w.last + 1, {"/job/pretrain_cli_alive/1": value}) == [] and 1 in w.arrived


class Counted(Store):
    """The stand-in store counting this node's reads, `then(n)` called at each (the n-th read)."""

    def __init__(self, then=lambda n: None):
        super().__init__()
        self.reads, self.then = 0, then

    def get_prefix(self, key):
        self.reads += 1
        self.then(self.reads)
        return super().get_prefix(key)


def _watches(tmp_path, store):
    watches = [joining.Watch(store, "/job", me, joining.nodes_of(PEERS), tmp_path, "10.0.0.1:8090") for me in (0, 1)]
    for w in watches:
        w.done = True
        w.beat()
    return watches


def test_a_run_that_ended_done_is_never_a_loss(tmp_path, nodes):
    """Node 1's launcher stalled past the final export (no `stopped` record here: the ranks ended done): node 0 said
    `lost node 1` and exited 1 after 5 s."""
    store, (node0, _) = nodes
    (tmp_path / "rank-0.json").unlink()  # the run ended done: no stop
    _end(node0)
    assert leaving.forced() is None and store["/job/pretrain_cli_alive/0"] == "ended 0"


def test_a_beat_made_before_the_end_began_is_none_and_one_stall_counts_at_most_cap(tmp_path, nodes, monkeypatch):
    """A beat read after this node's end began but made before is no sign of life (the old rule took the time of the
    read); the silence is counted in this node's reads, each at most CAP s (this launcher's own stall is nobody's)."""
    monkeypatch.setattr(joining, "SILENCE", 1.0)
    monkeypatch.setattr(joining, "CAP", 0.01)
    store = Counted()
    node0, node1 = _watches(tmp_path, store)
    node0.beats.read(node0)
    node1.beat()  # made before node 0's end, not yet read there
    reads = store.reads
    assert after_join.lost(node0, joining.SILENCE, joining.CAP, 0.0) == [1]
    assert store.reads - reads >= joining.SILENCE / joining.CAP  # ~100 reads, however long each took


def test_on_a_signal_the_store_is_kept_up_only_after_the_ranks_stop(tmp_path, nodes, monkeypatch):
    """On the node serving MASTER's store, `end` on SIGTERM lingered before Paddle's stop(), for others whose end came
    only after this node's ranks stopped: SIGTERM reached the ranks 5.3-5.6 s after the signal. Paddle's signal
    handler (its stop(): the store first, then the ranks) as patched by `rendezvous._note_ends`, on stand-ins."""
    from paddle.distributed.launch.controllers.controller import ControllerBase

    from pretrain_cli.distributed.launcher import rendezvous

    monkeypatch.setattr(ControllerBase, "finalize", ControllerBase.finalize)
    monkeypatch.setattr(ControllerBase, "signal_handler", ControllerBase.signal_handler)
    rendezvous._note_ends()
    said = []
    store = Counted(lambda n: said.append(("read", n)))
    node0, node1 = _watches(tmp_path, store)
    leaving.watch_ends(node0)

    def ranks_stop(timeout=None):
        said.append(("ranks stop", store.get("/job/pretrain_cli_alive/0")))
        store.put("/job/pretrain_cli_alive/1", "ended 0")  # the other node ends once these ranks stopped

    fake = SimpleNamespace(ctx=SimpleNamespace(logger=SimpleNamespace(info=print, debug=print),
                                               status=SimpleNamespace(done=lambda: None)),
                           watcher=SimpleNamespace(stop=lambda: None), pod=SimpleNamespace(stop=ranks_stop),
                           master=SimpleNamespace(stop=lambda: said.append(("store stop", None))))
    fake.stop = lambda sigint=None: ControllerBase.stop(fake, sigint)
    with pytest.raises(SystemExit) as stop:
        ControllerBase.signal_handler(fake, 15, None)
    assert stop.value.code == 15
    assert said[0] == ("ranks stop", "ended 143")  # said, and no wait (no read) before the ranks are told to stop
    assert said[-1] == ("store stop", None) and ("read", 1) in said  # kept up until node 1 said its end, then stopped
    assert leaving.forced() is None


def test_a_second_signal_while_the_store_is_kept_up_still_stops_the_store(tmp_path, nodes, monkeypatch):
    """A second Ctrl-C while the store was kept up for the other nodes (Paddle's force quit: sys.exit inside the
    keep-up) left the store, a non-daemon server thread, running: the launcher never exited (R14's review)."""
    from paddle.distributed.launch.controllers.controller import ControllerBase

    from pretrain_cli.distributed.launcher import rendezvous

    monkeypatch.setattr(ControllerBase, "finalize", ControllerBase.finalize)
    monkeypatch.setattr(ControllerBase, "signal_handler", ControllerBase.signal_handler)
    rendezvous._note_ends()
    said = []

    def read(n):
        said.append(("read", n))
        if n == 2:  # the other node has not said its end yet: the user presses Ctrl-C again
            ControllerBase.signal_handler(fake, 2, None)

    store = Counted(read)
    node0, _ = _watches(tmp_path, store)
    leaving.watch_ends(node0)
    fake = SimpleNamespace(ctx=SimpleNamespace(logger=SimpleNamespace(info=print, debug=print),
                                               status=SimpleNamespace(done=lambda: None)),
                           watcher=SimpleNamespace(stop=lambda: None),
                           pod=SimpleNamespace(stop=lambda timeout=None: said.append(("ranks stop", timeout))),
                           master=SimpleNamespace(stop=lambda: said.append(("store stop", None))))
    fake.stop = lambda sigint=None: ControllerBase.stop(fake, sigint)
    with pytest.raises(SystemExit) as stop:
        ControllerBase.signal_handler(fake, 15, None)
    assert stop.value.code == 2  # the second signal's force quit
    assert ("ranks stop", 10) in said and said[-1] == ("store stop", None), said

