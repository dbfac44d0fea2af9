"""The nodes' meeting at MASTER has a limit (scripts/paddle_launch.py, `distributed.launcher.rendezvous`): a node whose
peers never come, or that was given another MASTER port, ends with one line saying how far the meeting got and what
to do, exit 75, instead of Paddle's launcher waiting silently for ever. No rank is started."""
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import pytest

from pretrain_cli.distributed.launcher import rendezvous
from pretrain_cli.distributed.launcher.ports import reserve

LAUNCH = Path(__file__).resolve().parents[2] / "scripts" / "paddle_launch.py"


def launcher(master: str, nodes: str, log_dir: Path, script: Path, job: str) -> list[str]:
    """paddle_launch.py as a node of `nodes` at `master`, with a job id of the test's own: the launcher's store keys
    are /<job id>/..., so a node of another test (or another session) left polling the same port is never counted."""
    return [sys.executable, str(LAUNCH), "--job_id", job, "--master", master, "--nnodes", nodes, "--nproc_per_node",
            "1", "--log_dir", str(log_dir), str(script)]


@contextlib.contextmanager
def nodes_on(held, cmds, **popen):
    """Start each of `cmds` holding the port block `held` itself (its lock's descriptors inherited: the block stays
    reserved while any of them lives, whatever the test does with its own hold), each in its own session; on the way
    out every one still running is killed with every process it started (its ranks, each in a session of its own:
    `process_tree.kill_tree`) and reaped before the block is released. A block released while a node of it still
    polled its port once handed that port to the next test: its stray node (NNODES 3) registered there."""
    from process_tree import kill_tree

    procs = []
    try:
        for cmd in cmds:
            procs.append(subprocess.Popen(cmd, pass_fds=held.fds, start_new_session=True, **popen))
        yield procs
    finally:
        kill_tree([p.pid for p in procs if p.poll() is None])
        for p in procs:
            p.wait()
        held.release()


def _stray(port: int, stop: threading.Event) -> None:
    """A node of another test left polling this port (what failed the lone test once): it registers itself, started
    for NNODES 3, under the launcher's default job id at whatever master answers there."""
    import urllib.request

    body = json.dumps({"name": "stray", "replicas": 1, rendezvous.NODES_KEY: 3}).encode()
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    while not stop.wait(0.2):
        with contextlib.suppress(OSError):
            opener.open(urllib.request.Request(f"http://127.0.0.1:{port}/default/info/stray/-1", body), timeout=1)


def _alone(tmp_path, host: str, seconds: int, **env):
    """paddle_launch.py as node 1 of 2 at MASTER host:<a port held for this test>, RENDEZVOUS_TIMEOUT `seconds`,
    with a stray node of another test registering at that port all along."""
    held = reserve()
    (tmp_path / "rank.py").write_text("open('started', 'w').close()\n")
    e = {k: v for k, v in os.environ.items() if k not in (rendezvous.TIMEOUT_ENV, "NODE_RANK")}
    e.update({rendezvous.TIMEOUT_ENV: str(seconds), "NODE_RANK": "1", **env})
    master = f"{host}:{held.base}"  # the block's first port: no launcher of this host takes it
    stop = threading.Event()
    stray = threading.Thread(target=_stray, args=(held.base, stop), daemon=True)
    stray.start()
    try:
        with nodes_on(held, [launcher(master, "2", tmp_path / "log", tmp_path / "rank.py", uuid.uuid4().hex)], env=e,
                      stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, cwd=tmp_path) as (node,):
            err = node.communicate(timeout=120)[1]
    finally:
        stop.set()
        stray.join()
    assert node.returncode == rendezvous.EXIT and "Traceback" not in err, err
    assert not (tmp_path / "started").exists()  # no rank ran
    return master, [line for line in err.splitlines() if line.startswith("launch.sh:")]


def test_a_node_whose_peers_never_come_ends_with_one_line(tmp_path):
    # MASTER on this host: this launcher hosts the master itself, and no other node joins it (a stray node of another
    # job registering there is not one of its nodes)
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
    held = reserve()
    (tmp_path / "rank.py").write_text("open('started', 'w').close()\n")
    env = {k: v for k, v in os.environ.items() if k != "NODE_RANK"}
    env[rendezvous.TIMEOUT_ENV] = "120"  # (what ends them is the disagreement, long before this)
    job = uuid.uuid4().hex
    cmds = [launcher(f"127.0.0.1:{held.base}", n, tmp_path / f"log{n}", tmp_path / "rank.py", job) for n in "23"]
    with nodes_on(held, cmds, env=env, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                  stdout=subprocess.DEVNULL) as nodes:
        ends = [(p.wait(timeout=100), p.stderr.read()) for p in nodes]
    for (code, err), (mine, other) in zip(ends, ((2, 3), (3, 2))):
        assert code == rendezvous.USAGE and "Traceback" not in err, err
        assert (f"launch.sh: this node: the nodes at MASTER 127.0.0.1:{held.base} were started with different NNODES "
                f"(this node {mine}, another {other}); start every node with the same NNODES") in err, err
    assert not (tmp_path / "started").exists()


def test_a_block_stays_reserved_while_a_node_started_on_it_lives():
    """The lock of a test's port block is held by the nodes the test starts too: a test that gives its hold up (it
    timed out waiting for them) leaves the block taken until they are gone, so no other test is handed that port."""
    from pretrain_cli.distributed.launcher import ports

    held = reserve()
    unit = ports.lock_dir() / f"{held.base}.lock"
    with nodes_on(held, [[sys.executable, "-c", "import time; time.sleep(120)"]]) as (node,):
        held.release()  # the test's own hold, given up
        assert ports._lock(unit) is None  # the node still holds the block
        os.killpg(node.pid, signal.SIGKILL)
        node.wait()
    fd = ports._lock(unit)
    assert fd is not None  # the last holder gone: the block is free again
    os.close(fd)


def test_a_registration_carries_the_nodes_it_was_started_for(monkeypatch):
    import socket

    from pretrain_cli.distributed.launcher import joining

    monkeypatch.setenv("NODE_RANK", "1")
    tagged = rendezvous._tagged('{"name": "a", "replicas": 1}', 2, True)
    assert json.loads(tagged) == {"name": "a", "replicas": 1, rendezvous.NODES_KEY: 2, joining.NODE_KEY: "1",
                                  joining.HOST_KEY: socket.gethostname(), joining.SERVES_KEY: True}
    assert rendezvous._tagged("not json", 2) == "not json"
    m = rendezvous.Meeting("m:1", 3)
    assert m.other_count([tagged]) == 2 and m.other_count(['{"name": "b"}', "x"]) is None
