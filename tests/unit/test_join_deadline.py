"""A rank waiting in the join of the process group where no launcher watches the join (Paddle's launcher run directly,
or one node) limits its own wait to the run's start-up allowance (`distributed.launcher.join_deadline`, armed and
disarmed around the join by `job.joined`, which `distributed.setup` calls): one line in its log, a record for launch.sh
(124, a late node's class), SIGKILL. Before, it waited in Paddle's join with no word (17 minutes and more). A thread
could not do it: Paddle's join holds the GIL (a ticking thread did not run while rank 0 waited 15 s for rank 1), so
the limit is a forked helper. A "rank" here is a plain process; its join, a sleep."""
import json
import os
import signal
import socket
import subprocess
import sys

from pretrain_cli.distributed.launcher import job

RANK = r"""
import os, sys, time
from pretrain_cli import processes
from pretrain_cli.distributed.launcher import job
job.joined(1, False, float(sys.argv[1]))  # as distributed.setup before the join
time.sleep(float(sys.argv[2]))  # the join (Paddle's holds the GIL: no thread of the rank runs meanwhile)
job.clear(1)  # ... and after it
print("joined", processes.children(os.getpid()), flush=True)
"""


def _rank(tmp_path, allowance: float, join: float):
    verdicts = tmp_path / "verdicts"
    verdicts.mkdir()
    env = {k: v for k, v in os.environ.items() if k != job.JOIN_ENV}
    env.update(PADDLE_TRAINER_ID="1", PADDLE_TRAINERS_NUM="4", **{job.VERDICTS_ENV: str(verdicts)})
    p = subprocess.run([sys.executable, "-c", RANK, str(allowance), str(join)], env=env, capture_output=True,
                       text=True, timeout=120)
    return p, verdicts


def test_a_rank_whose_peers_never_come_ends_after_the_start_up_allowance_with_one_line(tmp_path):
    p, verdicts = _rank(tmp_path, 1.0, 600.0)
    assert p.returncode == -signal.SIGKILL, p.stderr
    assert p.stderr.count("[pretrain-cli] rank 1 (pid ") == 1, p.stderr
    assert (f" on {socket.gethostname()}): the process group of 4 ranks has not formed 1 s after this rank came to "
            f"the join (hang_timeout's start-up allowance): a rank of it has not come (its start-up stalled or slower "
            f"than that, or its node lost; its workerlog says where it is); this rank stops, killed (launch.sh: exit "
            f"124). Find what holds the missing ranks and re-run on every node (several nodes under scripts/launch.sh "
            f"name the node that is missing)") in p.stderr, p.stderr
    record = json.loads((verdicts / "rank-1.json").read_text())
    assert (record["exit"], record["kind"]) == (124, "hung")
    assert job.decide(verdicts, 247) == (124, "retry")  # launch.sh: a late start-up's class, restarted under MAX_RESTART


def test_a_rank_through_the_join_in_time_goes_on_and_its_helper_is_gone(tmp_path):
    p, verdicts = _rank(tmp_path, 600.0, 0.5)
    assert p.returncode == 0 and p.stdout == "joined []\n" and p.stderr == "", p.stderr
    assert not list(verdicts.iterdir())


def test_it_is_armed_only_in_a_launched_rank_without_a_launchers_join_watch(tmp_path, monkeypatch):
    from pretrain_cli.distributed.launcher import join_deadline

    monkeypatch.delenv(job.VERDICTS_ENV, raising=False)
    monkeypatch.delenv("PADDLE_TRAINER_ID", raising=False)
    monkeypatch.delenv(job.JOIN_ENV, raising=False)
    job.joined(0, False, 1.0)  # not launched (an in-process caller that survives a failed join)
    assert join_deadline._ARMED == []
    monkeypatch.setenv("PADDLE_TRAINER_ID", "0")
    monkeypatch.setenv(job.JOIN_ENV, str(tmp_path))  # several nodes under launch.sh: the launcher's watch
    job.joined(0, False, 1.0)
    assert join_deadline._ARMED == [] and (tmp_path / "joining.0").is_file()
    monkeypatch.delenv(job.JOIN_ENV)
    job.joined(0, False, None)  # hang_timeout: 0, no limit
    assert join_deadline._ARMED == []
