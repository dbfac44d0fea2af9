"""A node that vanishes after the nodes met at MASTER and before the ranks joined the process group (SIGKILL, its host
down, the network cut: its beat at MASTER falls silent, or MASTER itself with the node serving it) ends the waiting
nodes as a failed join ends them: exit 75 (EX_TEMPFAIL), launch.sh meeting the nodes at MASTER again with new ports.
No rank has run, so a new meeting may succeed: the vanished node's own launch.sh, when it lives on, joins again (its
ranks' join records say so), and a host back up is met. They ended with 1, restarted only under MAX_RESTART, which told
a scheduler nothing of the class. (The two-node walk of the node serving MASTER killed: tests/unit/test_joining.py.)"""
import json
import os

import pytest

from pretrain_cli.distributed.launcher import job, joining, leaving

PEERS = [json.dumps({"candidate": "10.0.0.1:1", "replicas": 1, joining.NODE_KEY: "0", joining.HOST_KEY: "a",
                     joining.SERVES_KEY: True}),
         json.dumps({"candidate": "10.0.0.2:1", "replicas": 1, joining.NODE_KEY: "1", joining.HOST_KEY: "b"})]


class Store:
    def __init__(self):
        self.said = {}

    def put(self, key, value):
        self.said[key] = value
        return True


@pytest.mark.parametrize("me, why", [(0, "silent"), (1, "master")])
def test_a_vanished_node_ends_the_waiting_node_as_a_failed_join_which_launch_sh_tries_again(tmp_path, monkeypatch,
                                                                                              me, why):
    verdicts, joins = tmp_path / "verdicts", tmp_path / "join"
    verdicts.mkdir()
    joins.mkdir()
    monkeypatch.setenv(job.VERDICTS_ENV, str(verdicts))
    monkeypatch.setenv(job.JOIN_ENV, str(joins))
    monkeypatch.setattr(leaving, "_ENDED", [])
    monkeypatch.setattr(joining, "LINGER", 0.0)  # (the node serving MASTER keeps it up for the others' next read)
    w = joining.Watch(Store(), "/job", me, joining.nodes_of(PEERS), joins, "10.0.0.1:8090")
    lost = [(1 - me, why)]
    assert w.ending(lost) == (75, "rendezvous")
    ended = []
    w._stop(w.line(lost), [], w.ending(lost), ended.append)  # this node's rank is in the join: no pid to kill here
    assert ended == [75]
    assert job.decide(verdicts, 75) == (75, "rendezvous")  # launch.sh here: the meeting again, with new ports
    assert w.store.said == {f"/job/{joining.ALIVE}/{me}": "left 75 rendezvous"}  # and any third node follows
    assert leaving.follow(*leaving.left("left 75 rendezvous")) == (75, "rendezvous")
    assert w.line(lost).endswith(f"this node's rank {me} stops too, exit 75 (nothing has run: a new meeting may "
                                 f"succeed): launch.sh tries again with new ports at MASTER for RENDEZVOUS_TIMEOUT s; "
                                 f"start that node again if it does not come back by itself")
    assert not joins.exists() and os.environ[job.VERDICTS_ENV] == str(verdicts)
