"""A node lost after the nodes met at MASTER but before its ranks joined the process group (`distributed.launcher.
joining`): the other nodes' ranks waited in Paddle's own join with no limit, and nothing was said. Each launcher now
beats at MASTER's store until its ranks have joined; a node that left, stopped beating, or whose MASTER stopped
answering is named in one line once this node's ranks wait in the join, they are killed, and the launcher ends with
the class of the first cause (a node that left says how its launch.sh ends it: a usage error, 2, stops every node; a
failed join, 75, has every node join again with new ports; else 1; a node that vanished without a word, 75 too). A
node alive whose ranks never reach the join is named after the run's start-up allowance (124), and ends too.

Two nodes on this machine (scripts/paddle_launch.py twice on loopback, one process each; the watch's reading of the
beats on its own, no processes: tests/unit/test_join_watch.py), the node that waits running the product's join
(`distributed.setup.init_process_group`): the other node's rank fails before its join (its launcher says it left, and
how it ends: exit 3; a usage error; a rank that died inside the join), that node, which serves MASTER, is killed with
SIGKILL (its store goes silent), or its rank stalls before the join (`PCLI_FAULT=join_stall`)."""
import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from test_rendezvous import LAUNCH, nodes_on

from pretrain_cli.distributed.launcher import job, joining
from pretrain_cli.distributed.launcher.ports import reserve

REPO = Path(__file__).resolve().parents[2]

JOINS = """
import os, sys
open(sys.argv[1], "w").write(str(os.getpid()))
import paddle
paddle.set_device("cpu")
from pretrain_cli.distributed.launcher import progress
from pretrain_cli.distributed.setup import init_process_group
from pretrain_cli.run_config import Loop
from pretrain_cli.run_layout import ParallelConfig
hang = os.environ.get("TEST_HANG_TIMEOUT")  # the run's hang_timeout: how long the others' ranks may take to come
if hang:
    progress.START = 0.0  # (the test's allowance alone: the product's is at least 600 s)
world, rank = int(os.environ["PADDLE_TRAINERS_NUM"]), int(os.environ["PADDLE_TRAINER_ID"])
init_process_group(ParallelConfig(world_size=world, rank=rank, dp_degree=world),
                   loop=Loop(hang_timeout=float(hang) if hang else None))
open(sys.argv[2], "w").close()
"""
# the lost node's rank: fails before its join, or sleeps until the test kills its node
FAILS = "import sys; sys.exit(3)\n"
SLEEPS = "import os, sys, time\nopen(sys.argv[1], 'w').write(str(os.getpid()))\ntime.sleep(300)\n"
# ... or ends with a usage error (the product's own: an unknown key), or dies inside the join (gloo's store asserting)
USAGE = ("import runpy, sys\nsys.argv = ['run_pretrain.py', sys.argv[1]]\n"
         f"runpy.run_path({str(REPO / 'scripts' / 'run_pretrain.py')!r}, run_name='__main__')\n")
DIES_JOINING = """
import os, signal
from pretrain_cli.distributed.launcher import job
rank = int(os.environ["PADDLE_TRAINER_ID"])
job.record(rank, 75, "joining", "died while joining the process group")  # as distributed.setup before its join
job.joined(rank, False, 600.0)
os.kill(os.getpid(), signal.SIGABRT)
"""
FAULTS = REPO / "tests" / "robustness" / "fault_inject"
SHORT = ("import runpy, sys\nfrom pretrain_cli.distributed.launcher import joining\njoining.SILENCE = 3.0\n"
         "sys.argv = sys.argv[1:]\nrunpy.run_path(sys.argv[0], run_name='__main__')\n")


def _node(tmp_path, name: str, master: str, job_id: str, script: str, *args, short: bool = False) -> list[str]:
    (tmp_path / f"{name}.py").write_text(script)
    head = [sys.executable, "-c", SHORT] if short else [sys.executable]  # SILENCE 3 s: the test's, not 30
    (tmp_path / "tmp").mkdir(exist_ok=True)  # the launchers' TMPDIR (their join directories); the port locks' shared
    return [sys.executable, str(REPO / "scripts" / "job.py"), "ports", "--", "env", f"TMPDIR={tmp_path / 'tmp'}",
            *head, str(LAUNCH), "--job_id", job_id, "--master", master, "--nnodes", "2", "--nproc_per_node", "1",
            "--log_dir", str(tmp_path / f"log-{name}"), str(tmp_path / f"{name}.py"), *map(str, args)]


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def _two_nodes(tmp_path, first: list[str], second: list[str], held, kill=None, envs=({}, {}), killed=()):
    """Start `first` (node 0, which serves MASTER), once it does `second` (node 1), each with its `envs` too;
    `kill(procs)` once node 0's rank goes for its join; (code, stderr) of each node. No node leaves its join directory
    but those `killed` (SIGKILLed by `kill`). The ranks (each in its own session) are killed on the way out."""
    env = {k: v for k, v in os.environ.items() if k not in ("NODE_RANK", "PADDLE_TRAINER_ID")}
    env.update(PYTHONPATH=str(REPO / "src"), RENDEZVOUS_TIMEOUT="120")
    envs = [dict(env, NODE_RANK=str(n), **envs[n]) for n in (0, 1)]
    with nodes_on(held, [first], env=envs[0], stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
                  cwd=tmp_path) as procs:
        try:
            return _started(tmp_path, procs, second, held, kill, envs, killed)
        finally:  # a rank its node left behind, before the block is released
            for name in ("going", "pid", "stalls"):  # (the ranks write their pids there)
                with contextlib.suppress(OSError, ValueError):
                    os.kill(int((tmp_path / name).read_text()), signal.SIGKILL)


def _started(tmp_path, procs, second, held, kill, envs, killed):
    deadline = time.monotonic() + 120
    while not _listening(held.base):
        assert procs[0].poll() is None and time.monotonic() < deadline, procs[0].stderr.read()
        time.sleep(0.1)
    procs.append(subprocess.Popen(second, pass_fds=held.fds, start_new_session=True, env=envs[1],
                                  stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, cwd=tmp_path))
    if kill is not None:
        kill(procs)
    ends = [(p.wait(timeout=150), p.stderr.read()) for p in procs]
    left = [p.name for p in (tmp_path / "tmp").glob("pretrain-cli-join-*")]  # only a SIGKILLed node's (its pid's)
    mine = [f"pretrain-cli-join-{socket.gethostname()}-{procs[i].pid}-" for i in killed]
    assert all(n.startswith(tuple(mine)) for n in left), left
    return ends


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
                          f"the ranks joined the process group: it left (its launcher ended, exit 3: its console says "
                          f"why); this node's rank 0 stops too. Start that node again and re-run on every node "
                          f"(MAX_RESTART restarts this one)"), err
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
                      held, kill, killed=(0,))
    code, err = ends[1]
    assert code == 75 and "Traceback" not in err, err  # (tests/unit/test_vanished_node.py: launch.sh's decision)
    assert _line(err) == (f"launch.sh: node 1: lost node 0 (host {socket.gethostname()}, 127.0.0.1; rank 0) before "
                          f"the ranks joined the process group: MASTER {master}, which it serves, has not answered for "
                          f"3 s (killed, or its host down or unreachable); this node's rank 1 stops too, exit 75 "
                          f"(nothing has run: a new meeting may succeed): launch.sh tries again with new ports at "
                          f"MASTER for RENDEZVOUS_TIMEOUT s; start that node again if it does not come back by "
                          f"itself"), err
    assert not (tmp_path / "in").exists()


@pytest.mark.parametrize("cause", ["usage", "transient"])
def test_a_node_leaving_before_the_join_ends_the_waiting_nodes_with_its_own_class(tmp_path, cause):
    """A node's rank fails with a usage error (exit 2: never restarted; here node 0's, which serves MASTER's store: its
    `left` outlives it there for LINGER s), or dies inside the join (75: launch.sh joins again with new ports; node
    1's).
    The waiting node ended with 1 either way (restarted only under MAX_RESTART): after a usage error it restarted for
    nothing, and after a failed join it stopped while the other node joined again alone and waited at MASTER until
    RENDEZVOUS_TIMEOUT. Each node's launch.sh reads its own verdict directory."""
    held, job_id = reserve(), uuid.uuid4().hex
    master, verdicts = f"127.0.0.1:{held.base}", [tmp_path / f"verdicts-{n}" for n in (0, 1)]
    for d in verdicts:
        d.mkdir()
    (tmp_path / "bad.json").write_text(json.dumps({"model_name_or_path": "micro-qwen2", "no_such_key": 1}))
    waits = _node(tmp_path, "waits", master, job_id, JOINS, tmp_path / "going", tmp_path / "in")
    if cause == "usage":
        nodes, lost = [_node(tmp_path, "fails", master, job_id, USAGE, tmp_path / "bad.json"), waits], 0
    else:
        nodes, lost = [waits, _node(tmp_path, "fails", master, job_id, DIES_JOINING)], 1
    ends = _two_nodes(tmp_path, *nodes, held, envs=[{job.VERDICTS_ENV: str(d)} for d in verdicts])
    (other, other_err), (code, err) = ends[lost], ends[1 - lost]
    want = (2, "stop") if cause == "usage" else (75, "rendezvous")
    assert job.decide(verdicts[lost], other) == want, other_err  # how the failed node's own launch.sh ends it ...
    assert (code, job.decide(verdicts[1 - lost], code)) == (want[0], want), err  # ... and the waiting node's, the same
    how = ("it left with a usage error (exit 2: its console says which); this node's rank 1 stops too, exit 2, not "
           "restarted: fix what that node's console names and re-run on every node" if cause == "usage" else
           "its ranks could not join the process group (its launcher ended, exit 75: its console says why); this "
           "node's rank 0 stops too, exit 75: launch.sh tries again with new ports, as that node's does")
    assert _line(err) == (f"launch.sh: node {1 - lost}: lost node {lost} (host {socket.gethostname()}, 127.0.0.1; rank "
                          f"{lost}) before the ranks joined the process group: {how}"), err
    assert "Traceback" not in err and not (tmp_path / "in").exists()


def test_a_node_whose_rank_stalls_before_the_join_is_named_after_the_start_up_allowance_and_both_end(tmp_path):
    """Node 1 alive, its rank stalled before the join (`PCLI_FAULT=join_stall`): it beats on, and node 0's rank waited
    in Paddle's join for ever. Node 0 names it once the run's start-up allowance has passed since its own rank waits in
    the join (here hang_timeout 3 s), exit 124; node 1, told so, names its own rank and ends too, that rank killed."""
    from pretrain_cli import processes

    held, job_id = reserve(), uuid.uuid4().hex
    master = f"127.0.0.1:{held.base}"
    fault = {"PYTHONPATH": f"{FAULTS}{os.pathsep}{REPO / 'src'}", "PCLI_FAULT": "join_stall:1"}
    ends = _two_nodes(tmp_path, _node(tmp_path, "waits", master, job_id, JOINS, tmp_path / "going", tmp_path / "in"),
                      _node(tmp_path, "stalls", master, job_id, JOINS, tmp_path / "stalls", tmp_path / "in1"), held,
                      envs=({"TEST_HANG_TIMEOUT": "3"}, fault))
    (code, err), (other, other_err) = ends
    host = re.escape(socket.gethostname())
    assert code == joining.HUNG and "Traceback" not in err, err
    assert re.fullmatch(rf"launch\.sh: node 0: node 1 \(host {host}, 127\.0\.0\.1; rank 1\) has not brought its ranks "
                        r"to the join of the process group \d+ s after this node's \(a start-up stalled "
                        r"there, or slower than the 3 s the run allows it: hang_timeout's start-up allowance; its "
                        r"workerlog says where its ranks are\); this node's rank 0 stops too, exit 124\. Find what "
                        r"holds that node's ranks and re-run on every node \(MAX_RESTART restarts this one\)",
                        _line(err)), err
    assert other == joining.HUNG and "Traceback" not in other_err, other_err
    assert re.fullmatch(rf"launch\.sh: node 1: node 0 \(host {host}, 127\.0\.0\.1; rank 0\) gave up waiting for this "
                        r"node's ranks to join the process group: rank 1 has not reached the join \d+ s after the "
                        r"nodes met at MASTER \(.*\); this node's rank 1 stops too, exit 124\. Find what holds them "
                        r"and re-run on every node \(MAX_RESTART restarts this one\)", _line(other_err)), other_err
    assert not processes.alive(int((tmp_path / "stalls").read_text()))  # the stalled rank, killed by its node
    assert not (tmp_path / "in").exists() and not (tmp_path / "in1").exists()
