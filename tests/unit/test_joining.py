"""A node lost after the nodes met at MASTER but before its ranks joined the process group (`distributed.launcher.
joining`): the other nodes' ranks waited in Paddle's own join with no limit, and nothing was said. Each launcher now
beats at MASTER's store until its ranks have joined; a node that left, stopped beating, or whose MASTER stopped
answering is named in one line once this node's ranks wait in the join, they are killed, and the launcher exits 1.

The watch's reading of the beats is tested on its own (no processes); then two nodes on this machine
(scripts/paddle_launch.py twice on loopback, one process each), the node that waits running the product's join
(`distributed.setup.init_process_group`): the other node's rank fails before its join (its launcher says it left),
or that node, which serves MASTER, is killed with SIGKILL (its store goes silent)."""
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

from test_rendezvous import LAUNCH, nodes_on

from pretrain_cli.distributed.launcher import job, joining
from pretrain_cli.distributed.launcher.job import reserve

REPO = Path(__file__).resolve().parents[2]
PEERS = [json.dumps({"candidate": "10.0.0.1:1", "replicas": 1, joining.NODE_KEY: "0", joining.HOST_KEY: "a",
                     joining.SERVES_KEY: True}),
         json.dumps({"candidate": "10.0.0.2:1", "replicas": 2, joining.NODE_KEY: "1", joining.HOST_KEY: "b"})]


def _watch(tmp_path, me: int) -> joining.Watch:
    return joining.Watch(None, "/job", me, joining.nodes_of(PEERS), tmp_path, "10.0.0.1:8090")


def test_a_node_that_left_is_lost_at_once_and_a_silent_one_after_silence_of_this_launchers_own_reads(tmp_path):
    w = _watch(tmp_path, 0)
    assert w.observe(w.last + 1, {"/job/pretrain_cli_alive/1": "left"}) == [(1, "left")]
    w = _watch(tmp_path, 0)
    t = w.last
    assert w.observe(t + 1, {"/job/pretrain_cli_alive/1": "1"}) == []
    assert w.observe(t + 600, {"/job/pretrain_cli_alive/1": "1"}) == []  # this launcher's own stall: CAP of it
    reads = int(joining.SILENCE / joining.CAP) - 1  # ... and these reads, CAP apart, make up the silence
    for i in range(1, reads):
        assert w.observe(t + 600 + i * joining.CAP, {"/job/pretrain_cli_alive/1": "1"}) == [], i
    t += 600 + reads * joining.CAP
    assert w.observe(t, {"/job/pretrain_cli_alive/1": "1"}) == [(1, "silent")]
    assert w.observe(t + 1, {"/job/pretrain_cli_alive/1": "2"}) == []  # it beats again
    assert w.observe(t + 10 * joining.SILENCE, {"/job/pretrain_cli_alive/1": "joined"}) == []  # through the join
    assert w.observe(t + 20 * joining.SILENCE, {}) == []


def test_masters_silence_loses_the_node_that_serves_it(tmp_path):
    w = _watch(tmp_path, 1)
    t = w.last
    for i in range(1, int(joining.SILENCE / joining.CAP) + 1):
        lost = w.observe(t + i * joining.CAP, None)
    assert lost == [(0, "master")]
    assert w.observe(t + joining.SILENCE + 60, {"/job/pretrain_cli_alive/0": "7"}) == []  # answering again


def test_only_ranks_all_alive_inside_the_join_are_stopped(tmp_path):
    w = _watch(tmp_path, 1)  # node 1: ranks 1-2
    assert w.waiting() is None  # still starting up: it may fail on its own
    (tmp_path / "joining.1").write_text(str(os.getpid()))
    assert w.waiting() is None
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (tmp_path / "joining.2").write_text(str(sleeper.pid))
        assert w.waiting() == [os.getpid(), sleeper.pid]
    finally:
        sleeper.kill()
        sleeper.wait()
    assert w.waiting() is None  # one of them died: its own failure, the launcher's to report
    for r in (1, 2):
        (tmp_path / f"joined.{r}").write_text("")
    assert w.waiting() is None and w.done
    assert w.line([(0, "master")]) == (
        "launch.sh: this node: lost node 0 (host a, 10.0.0.1; rank 0) before the ranks joined the process group: "
        "MASTER 10.0.0.1:8090, which it serves, has not answered for 30 s (killed, or its host down or unreachable); "
        "this node's ranks 1-2 stop too. Start that node again and re-run on every node (MAX_RESTART restarts this "
        "one)")


def test_the_join_marks_it_reads(tmp_path, monkeypatch):
    monkeypatch.setenv(job.JOIN_ENV, str(tmp_path))
    monkeypatch.delenv(job.VERDICTS_ENV, raising=False)
    job.record(3, 75, "joining", "died while joining the process group")  # as distributed.setup, before the join
    assert (tmp_path / "joining.3").read_text() == str(os.getpid())
    job.clear(3)  # ... and once through it
    assert (tmp_path / "joined.3").is_file()


JOINS = """
import os, sys
open(sys.argv[1], "w").write(str(os.getpid()))
import paddle
paddle.set_device("cpu")
from pretrain_cli.distributed.setup import init_process_group
from pretrain_cli.run_layout import ParallelConfig
world, rank = int(os.environ["PADDLE_TRAINERS_NUM"]), int(os.environ["PADDLE_TRAINER_ID"])
init_process_group(ParallelConfig(world_size=world, rank=rank, dp_degree=world))
open(sys.argv[2], "w").close()
"""
# the lost node's rank: fails before its join, or sleeps until the test kills its node
FAILS = "import sys; sys.exit(3)\n"
SLEEPS = "import os, sys, time\nopen(sys.argv[1], 'w').write(str(os.getpid()))\ntime.sleep(300)\n"
SHORT = ("import runpy, sys\nfrom pretrain_cli.distributed.launcher import joining\njoining.SILENCE = 3.0\n"
         "sys.argv = sys.argv[1:]\nrunpy.run_path(sys.argv[0], run_name='__main__')\n")


def _node(tmp_path, name: str, master: str, job_id: str, script: str, *args, short: bool = False) -> list[str]:
    (tmp_path / f"{name}.py").write_text(script)
    head = [sys.executable, "-c", SHORT] if short else [sys.executable]  # SILENCE 3 s: the test's, not 30
    return [sys.executable, str(REPO / "scripts" / "job.py"), "ports", "--", *head, str(LAUNCH), "--job_id", job_id,
            "--master", master, "--nnodes", "2", "--nproc_per_node", "1", "--log_dir", str(tmp_path / f"log-{name}"),
            str(tmp_path / f"{name}.py"), *map(str, args)]


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def _two_nodes(tmp_path, first: list[str], second: list[str], held, kill=None):
    """Start `first` (node 0, which serves MASTER), once it does `second` (node 1); `kill(procs)` once node 0's rank
    goes for its join; (code, stderr) of each node. The ranks (each in its own session) are killed on the way out."""
    env = {k: v for k, v in os.environ.items() if k not in ("NODE_RANK", "PADDLE_TRAINER_ID")}
    env.update(PYTHONPATH=str(REPO / "src"), RENDEZVOUS_TIMEOUT="120")
    try:
        return _started(tmp_path, first, second, held, kill, env)
    finally:
        for name in ("going", "pid"):  # (the ranks write their pids there)
            with contextlib.suppress(OSError, ValueError):
                os.kill(int((tmp_path / name).read_text()), signal.SIGKILL)


def _started(tmp_path, first, second, held, kill, env):
    with nodes_on(held, [first], env=dict(env, NODE_RANK="0"), stderr=subprocess.PIPE, stdout=subprocess.DEVNULL,
                  text=True, cwd=tmp_path) as procs:
        deadline = time.monotonic() + 120
        while not _listening(held.base):
            assert procs[0].poll() is None and time.monotonic() < deadline, procs[0].stderr.read()
            time.sleep(0.1)
        procs.append(subprocess.Popen(second, pass_fds=held.fds, start_new_session=True, env=dict(env, NODE_RANK="1"),
                                      stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, cwd=tmp_path))
        if kill is not None:
            kill(procs)
        return [(p.wait(timeout=150), p.stderr.read()) for p in procs]


def _line(err: str) -> str:
    return [x for x in err.splitlines() if x.startswith("launch.sh:")][-1]


def test_a_node_whose_ranks_fail_before_joining_ends_the_nodes_waiting_in_the_join(tmp_path):
    held, job_id = reserve(), uuid.uuid4().hex
    master = f"127.0.0.1:{held.base}"
    ends = _two_nodes(tmp_path, _node(tmp_path, "waits", master, job_id, JOINS, tmp_path / "going", tmp_path / "in"),
                      _node(tmp_path, "fails", master, job_id, FAILS), held)
    (code, err), (other, _) = ends
    assert code == joining.LOST and "Traceback" not in err, err
    assert _line(err) == (f"launch.sh: node 0: lost node 1 (host {socket.gethostname()}, 127.0.0.1; rank 1) before "
                          f"the ranks joined the process group: it left (its launcher ended: its console says why); "
                          f"this node's rank 0 stops too. Start that node again and re-run on every node (MAX_RESTART "
                          f"restarts this one)"), err
    assert (tmp_path / "going").exists() and not (tmp_path / "in").exists()  # its rank went for the join, never through
    assert other == 3


def test_a_node_serving_master_killed_before_its_ranks_join_is_named_by_the_others(tmp_path):
    held, job_id = reserve(), uuid.uuid4().hex
    master = f"127.0.0.1:{held.base}"

    def kill(procs):
        deadline = time.monotonic() + 120
        while not ((tmp_path / "going").exists() and (tmp_path / "pid").exists()):
            assert procs[1].poll() is None and time.monotonic() < deadline, procs[1].stderr.read()
            time.sleep(0.1)
        os.killpg(procs[0].pid, signal.SIGKILL)  # node 0's launcher: MASTER's store with it, nothing said
        os.kill(int((tmp_path / "pid").read_text()), signal.SIGKILL)  # and its rank (its own session)

    ends = _two_nodes(tmp_path, _node(tmp_path, "dies", master, job_id, SLEEPS, tmp_path / "pid"),
                      _node(tmp_path, "waits", master, job_id, JOINS, tmp_path / "going", tmp_path / "in", short=True),
                      held, kill)
    code, err = ends[1]
    assert code == joining.LOST and "Traceback" not in err, err
    assert _line(err) == (f"launch.sh: node 1: lost node 0 (host {socket.gethostname()}, 127.0.0.1; rank 0) before "
                          f"the ranks joined the process group: MASTER {master}, which it serves, has not answered for "
                          f"3 s (killed, or its host down or unreachable); this node's rank 1 stops too. Start that "
                          f"node again and re-run on every node (MAX_RESTART restarts this one)"), err
    assert not (tmp_path / "in").exists()


def test_no_beat_lands_after_leaving(tmp_path):
    """The thread's beat after the launcher's `left` turned it back into a counter, which then fell silent: the other
    nodes waited SILENCE s, and named a node that had left as one killed."""
    class Store:
        values = {}

        def put(self, key, value):
            self.values[key] = value
            return True

    w = joining.Watch(Store(), "/job", 1, joining.nodes_of(PEERS), tmp_path, "m:1")
    w.beat()
    w.leave()
    w.beat()
    assert Store.values == {"/job/pretrain_cli_alive/1": "left"}
