"""A node lost while the ranks ran (`distributed.launcher.after_join`): the launcher of node 1 killed with its process
group at step 30, its ranks stopped by their launcher's death and saved, and node 0's ranks, told to stop by the
ranks' agreement, ended 0 with only `stopped at step 32 and saved`: a scheduler recorded success. Now each launcher
beats on at MASTER's store after the join and says `ended <code>` at its end; a node ending as a success names a node
that did neither, and ends `LOST` (1). Here two watches share a stand-in of MASTER's store (no launched processes)."""
import json

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
    monkeypatch.setattr(after_join, "GONE", 0.6)
    monkeypatch.setattr(joining, "LINGER", 0.6)
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


def test_a_node_that_said_its_end_or_still_beats_is_not_lost(tmp_path, nodes):
    store, (node0, node1) = nodes
    node1.beat()  # it beats on (its own end still to come)
    _end(node0)
    assert leaving.forced() is None and job.decide(tmp_path, 0) == (0, "stop")
    store, (node0, node1) = nodes
    node0.gone, node1.gone = False, False
    after_join.end(node1, 0, True, joining.describe, 0.0)  # node 1 ended first and said so ...
    assert store["/job/pretrain_cli_alive/1"] == "ended 0"
    _end(node0)  # ... then node 0 ends: no beat since, but its end is known
    assert leaving.forced() is None


def test_after_the_join_the_beats_still_count_as_joined_for_a_node_still_joining(tmp_path, nodes):
    _, (node0, _) = nodes
    w = joining.Watch(Store(), "/job", 0, joining.nodes_of(PEERS), tmp_path, "10.0.0.1:8090")
    for value in ("joined 7", "ended 0"):
        assert w.observe(w.last + 1, {"/job/pretrain_cli_alive/1": value}) == [] and 1 in w.arrived
