"""A rank waiting in the join under its own limit (`join_deadline`) says, long before the limit, which ranks of its
host have come and which have not and why (`join_wait`), and at the limit names the rank that never came, not
itself: a rank stopped (`kill -STOP`) 1 s after start left the console silent for 600 s, then the healthy rank 0 was
named. Here the "launcher" is this test process, its two "ranks" plain processes: rank 0 comes to the join (a sleep),
rank 1 is stopped before it."""
import json
import os
import signal
import socket
import subprocess
import sys
import time

from pretrain_cli import processes
from pretrain_cli.distributed.launcher import job, join_deadline, join_wait, rank_log

RANK0 = r"""
import sys, time
from pretrain_cli.distributed.launcher import job, join_deadline
join_deadline.NOTE, join_deadline.REPEAT = 1.0, 100.0  # (the forked helper's copy)
job.record(0, 75, "joining", "died while joining the process group")  # as distributed.setup before the join
job.joined(0, False, float(sys.argv[1]))
time.sleep(120)  # the join: rank 1 never comes
"""


def _env(verdicts, rank: int) -> dict:
    env = {k: v for k, v in os.environ.items() if k != job.JOIN_ENV}
    env.update(PADDLE_TRAINER_ID=str(rank), PADDLE_LOCAL_RANK=str(rank), PADDLE_TRAINERS_NUM="2",
               **{job.VERDICTS_ENV: str(verdicts)})
    return env


def test_a_stopped_rank_is_said_while_waiting_and_named_at_the_limit(tmp_path):
    verdicts = tmp_path / "verdicts"
    verdicts.mkdir()
    rank1 = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], env=_env(verdicts, 1))
    try:
        os.kill(rank1.pid, signal.SIGSTOP)
        while not processes.stopped(rank1.pid):
            pass
        rank0 = subprocess.run([sys.executable, "-c", RANK0, "4"], env=_env(verdicts, 0), capture_output=True,
                               text=True, timeout=120)
        assert rank1.wait(timeout=30) == -signal.SIGKILL  # the stopped rank is killed too: nothing holds the stop
    finally:
        rank1.kill()
        rank1.wait()
    err, host = rank0.stderr, socket.gethostname()
    assert rank0.returncode == -signal.SIGKILL, err
    note = (f"): waiting 1 s in the join of the process group of 2 ranks: on this host rank 0 came, rank 1 (pid "
            f"{rank1.pid}) has not: stopped (kill -STOP, a debugger, a paused job: state T); the join is given up 4 s "
            f"after this rank came (hang_timeout's start-up allowance)")
    assert err.count(note) == 1, err  # once: the next note is due after the limit
    named = (f"rank 1 (pid {rank1.pid} on {host}) has not come to the join of the process group of 2 ranks 4 s after "
             f"rank 0 came to it (hang_timeout's start-up allowance): stopped (kill -STOP, a debugger, a paused job: "
             f"state T); the ranks stop, killed (launch.sh: exit 124). Find what holds rank 1 and re-run")
    assert f"[pretrain-cli] {named}" in err and err.index(note) < err.index(named), err
    assert "rank 0 (pid" not in err.split(note)[1], err  # the waiting rank is not the one named
    record = json.loads((verdicts / "rank-1.json").read_text())
    assert (record["exit"], record["kind"], record["local"], record["line"]) == (124, "hung", "1", named)
    assert job.decide(verdicts, 247) == (124, "retry")
    # the console's copy of rank 0 leaves the limit's lines to launch.sh's account (said once), not the waiting note
    assert rank_log.VERDICT.match(f"[pretrain-cli] {named}")
    assert rank_log.VERDICT.match(join_deadline.line(0, 7, 600.0, 4))
    assert not rank_log.VERDICT.match(f"[pretrain-cli] rank 0 (pid 7 on h{note}")


def test_a_rank_still_starting_up_or_gone_is_told_apart_from_one_that_came(tmp_path):
    verdicts = tmp_path
    (verdicts / "rank-2.json").write_text(json.dumps({"kind": "joining"}))
    ranks = {0: os.getpid(), 1: os.getpid(), 2: os.getpid(), 3: 2 ** 22 + 7}  # 3: no such process
    arrived = join_wait.came(verdicts, ranks)
    assert arrived == {2}
    assert [(r, why.split(" ")[0]) for r, _, why in join_wait.absent(ranks, arrived, 0)] == [(3, "gone"), (1, "still")]
    assert join_wait.absent(ranks, join_wait.came(None, ranks), 0) == [(3, 2 ** 22 + 7, "gone (it ended before the "
                                                                          "join)")]  # (no launch.sh: arrival unknown)


def test_a_rank_that_came_and_was_stopped_there_is_not_said_to_have_never_come(tmp_path):
    """Its `joining` record exists: it came to the join, and was stopped (or died) after; it was reported as 'has not
    come to the join ... stopped'."""
    (tmp_path / "rank-1.json").write_text(json.dumps({"kind": "joining"}))
    held = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        os.kill(held.pid, signal.SIGSTOP)
        while not processes.stopped(held.pid):
            time.sleep(0.05)
        ranks = {0: os.getpid(), 1: held.pid}
        arrived = join_wait.came(tmp_path, ranks)
        missing = join_wait.absent(ranks, arrived, 0)
        assert missing == [(1, held.pid, "stopped (kill -STOP, a debugger, a paused job: state T)")]
        note = join_wait.note(0, 7, 60.0, 600.0, 2, ranks, missing, arrived)
        assert f"rank 1 (pid {held.pid}) came but is stopped" in note and "has not" not in note, note
        named = join_wait.named(0, missing[0], 0, 600.0, 2, 124, came=True)
        assert f"rank 1 (pid {held.pid} on {socket.gethostname()}) came to the join of the process group of 2 ranks " \
               f"but is stopped (kill -STOP, a debugger, a paused job: state T), 600 s after rank 0 came to it" in named
        assert "has not come" not in named and rank_log.VERDICT.match(named)
    finally:
        held.kill()
        held.wait()
    gone = join_wait.absent({0: os.getpid(), 1: 2 ** 22 + 7}, {1}, 0)  # came, then died in the join
    assert gone == [(1, 2 ** 22 + 7, "gone (it ended in the join)")]
