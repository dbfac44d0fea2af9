"""The nodes' meeting at MASTER has a limit (scripts/paddle_launch.py, `distributed.launcher.rendezvous`): a node whose
peers never come, or that was given another MASTER port, ends with one line saying how far the meeting got and what
to do, exit 75, instead of Paddle's launcher waiting silently for ever. No rank is started."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from pretrain_cli.distributed.launcher import rendezvous
from pretrain_cli.distributed.launcher.job import reserve

LAUNCH = Path(__file__).resolve().parents[2] / "scripts" / "paddle_launch.py"


def _alone(tmp_path, host: str, seconds: int, **env):
    """paddle_launch.py as node 1 of 2 at MASTER host:<a port held for this test>, RENDEZVOUS_TIMEOUT `seconds`."""
    import os

    held = reserve()
    try:
        (tmp_path / "rank.py").write_text("open('started', 'w').close()\n")
        e = {k: v for k, v in os.environ.items() if k not in (rendezvous.TIMEOUT_ENV, "NODE_RANK")}
        e.update({rendezvous.TIMEOUT_ENV: str(seconds), "NODE_RANK": "1", **env})
        master = f"{host}:{held.base}"  # the block's first port: no launcher of this host takes it
        out = subprocess.run([sys.executable, str(LAUNCH), "--master", master, "--nnodes", "2", "--nproc_per_node",
                              "1", "--log_dir", str(tmp_path / "log"), str(tmp_path / "rank.py")], env=e,
                             capture_output=True, text=True, cwd=tmp_path, timeout=120)
    finally:
        held.release()
    assert out.returncode == rendezvous.EXIT and "Traceback" not in out.stderr, out.stderr
    assert not (tmp_path / "started").exists()  # no rank ran
    return master, [line for line in out.stderr.splitlines() if line.startswith("launch.sh:")]


def test_a_node_whose_peers_never_come_ends_with_one_line(tmp_path):
    # MASTER on this host: this launcher hosts the master itself, and no other node joins it
    # (10 s: before its first registration the launcher sleeps up to 2 s and starts its master, slower under load)
    master, lines = _alone(tmp_path, "127.0.0.1", 10)
    assert lines[-1] == (f"launch.sh: node 1: only 1 of 2 nodes joined at MASTER {master} in 10 s; start the other "
                         f"node(s) with the same MASTER and NNODES=2 (a node given another MASTER port waits there "
                         f"alone) (RENDEZVOUS_TIMEOUT sets this wait, 0: no limit)")


def test_a_master_that_never_answers_is_named(tmp_path):
    # another address (a loopback one this launcher does not take for its own): nothing listens there
    master, lines = _alone(tmp_path, "127.0.0.2", 2)
    assert lines[-1].startswith(f"launch.sh: node 1: nothing answered at MASTER {master} for 2 s; start the node "
                                f"that hosts it (NODE_RANK=0"), lines


@pytest.mark.parametrize("value, seconds", [("30", 30.0), ("0", 0.0), ("soon", rendezvous.DEFAULT),
                                            ("-1", rendezvous.DEFAULT), ("nan", rendezvous.DEFAULT)])
def test_the_limit_is_read_from_the_environment(monkeypatch, value, seconds):
    monkeypatch.setenv(rendezvous.TIMEOUT_ENV, value)
    assert rendezvous.timeout_seconds() == seconds


def test_a_long_wait_is_said_once_before_the_limit():
    m = rendezvous.Meeting("10.0.0.1:8090", 2)
    assert "(nothing answers there yet); it gives up after 600 s (RENDEZVOUS_TIMEOUT)" in m.waiting(600)
    m.answered, m.joined = True, 1
    assert m.waiting(0).endswith("(1 of 2 nodes have joined); it waits with no limit (RENDEZVOUS_TIMEOUT)")


def test_nodes_started_with_different_nnodes_both_end_at_once_naming_it(tmp_path):
    """NNODES 2 on one node, 3 on the other: the first started its rank with the second, whose launcher waited for a
    third node, so that rank waited in the join of a process group whose other half never started."""
    import os

    held = reserve()
    (tmp_path / "rank.py").write_text("open('started', 'w').close()\n")
    env = {k: v for k, v in os.environ.items() if k != "NODE_RANK"}
    env[rendezvous.TIMEOUT_ENV] = "120"  # (what ends them is the disagreement, long before this)
    try:
        nodes = [subprocess.Popen([sys.executable, str(LAUNCH), "--master", f"127.0.0.1:{held.base}", "--nnodes", n,
                                   "--nproc_per_node", "1", "--log_dir", str(tmp_path / f"log{n}"),
                                   str(tmp_path / "rank.py")], env=env, stderr=subprocess.PIPE, text=True,
                                  cwd=tmp_path, stdout=subprocess.DEVNULL) for n in ("2", "3")]
        ends = [(p.wait(timeout=100), p.stderr.read()) for p in nodes]
    finally:
        held.release()
    for (code, err), (mine, other) in zip(ends, ((2, 3), (3, 2))):
        assert code == rendezvous.USAGE and "Traceback" not in err, err
        assert (f"launch.sh: this node: the nodes at MASTER 127.0.0.1:{held.base} were started with different NNODES "
                f"(this node {mine}, another {other}); start every node with the same NNODES") in err, err
    assert not (tmp_path / "started").exists()


def test_a_registration_carries_the_nodes_it_was_started_for():
    tagged = rendezvous._tagged('{"name": "a", "replicas": 1}', 2)
    assert json.loads(tagged) == {"name": "a", "replicas": 1, rendezvous.NODES_KEY: 2}
    assert rendezvous._tagged("not json", 2) == "not json"
    m = rendezvous.Meeting("m:1", 3)
    assert m.other_count([tagged]) == 2 and m.other_count(['{"name": "b"}', "x"]) is None
