"""The rank watcher: the rank that died is the one named, by itself and by its survivors, in one line with its
pid, host and signal; what a survivor writes after the death (gloo's abort) never reaches its log; the dead
rank's own end is recorded for launch.sh. A "rank" here is a plain Python process with a sleeping peer."""
import json
import os
import signal
import subprocess
import sys

from pretrain_cli.distributed import watchdog

RANK = r"""
import os, subprocess, sys, time
from pathlib import Path
from pretrain_cli import processes
from pretrain_cli.distributed import watchdog
peer = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL)
shared, verdicts = Path(sys.argv[1]), Path(sys.argv[2])
watchdog._spawn(watchdog._Watcher(0, {0: os.getpid(), 1: peer.pid}, "h", shared, verdicts, grace=5.0))
print("before", peer.pid, flush=True)
if sys.argv[3] == "peer":
    time.sleep(0.3)
    peer.kill()  # not reaped at once, as the launcher reaps only once a second
    while processes.alive(peer.pid):  # gloo reacts once the peer's sockets close, as it exits
        time.sleep(0.001)
    print("C++ Traceback: FatalError: Process abort signal", file=sys.stderr, flush=True)  # what gloo would add
time.sleep(20)  # a rank stuck in a collective (or waiting to be killed by the test)
print("still running", flush=True)
"""


def _rank(tmp_path, who: str):
    shared, verdicts = tmp_path / "shared", tmp_path / "verdicts"
    shared.mkdir()
    verdicts.mkdir()
    p = subprocess.Popen([sys.executable, "-c", RANK, str(shared), str(verdicts), who], stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
    return p, verdicts


def test_a_survivor_names_the_dead_peer_once_and_nothing_after_it(tmp_path):
    p, verdicts = _rank(tmp_path, "peer")
    out, _ = p.communicate(timeout=60)
    peer = out.split()[1]
    assert p.returncode == -signal.SIGKILL and "still running" not in out
    assert out.count(f"[pretrain-cli] rank 0: rank 1 (pid {peer} on h) died: killed by SIGKILL; this rank stops") == 1, out
    assert "C++ Traceback" not in out and "FatalError" not in out, out  # written after the death: dropped
    assert not list(verdicts.iterdir())  # a survivor's end is not its own verdict


def test_the_dead_rank_names_itself_and_records_its_end(tmp_path):
    p, verdicts = _rank(tmp_path, "self")
    line = p.stdout.readline()
    assert line.startswith("before"), line
    os.kill(p.pid, signal.SIGKILL)
    out = p.stdout.read()  # until the watcher, which holds the log, is done
    p.wait(timeout=30)
    assert out.count(f"[pretrain-cli] rank 0 (pid {p.pid} on h) died: killed by SIGKILL; the other ranks stop") == 1, out
    assert "rank 1 (pid" not in out
    record = json.loads((verdicts / "rank-0.json").read_text())
    assert record["exit"] == 137 and record["kind"] == "died"


def _watcher(tmp_path, gone, statuses=None, outlived=()):
    shared = tmp_path / "shared"
    shared.mkdir(exist_ok=True)
    for r in outlived:
        (shared / f"outlived.{r}").write_text("x")
    w = watchdog._Watcher(0, {0: 10, 1: 11}, "h", shared, None, grace=1.0)
    w.statuses = dict(statuses or {})
    w._gone = lambda: set(gone)  # noqa: E731
    return w


def test_the_cause_is_the_rank_nobody_saw_alive_after_another_death(tmp_path):
    # rank 0 killed; rank 1 was seen alive after that, then stopped: rank 0 alone is the cause
    assert _watcher(tmp_path, {0, 1}, {0: 9, 1: 9}, outlived=[1])._causes() == [0]


def test_without_sightings_gloos_abort_is_the_consequence(tmp_path):
    # both gone before any watcher looked: the rank aborted by SIGABRT followed the one killed by SIGKILL
    assert _watcher(tmp_path, {0, 1}, {0: signal.SIGABRT, 1: signal.SIGKILL})._causes() == [1]
    # nothing tells them apart: both are named
    assert _watcher(tmp_path, {0, 1})._causes() == [0, 1]


def test_a_rank_alone_on_its_host_or_alone_in_the_job_needs_no_watcher(monkeypatch):
    class P:
        world_size, rank = 1, 0

    watchdog.start(P())  # returns before touching Paddle's store
    assert watchdog._WATCHER is None


def test_a_usage_error_is_not_answered_with_resume(tmp_path):
    w = _watcher(tmp_path, {1}, {1: 2 << 8})
    assert w._causes() == [1]
    line = w._line([1])
    assert "rank 0: rank 1 (pid 11 on h) died: exited with code 2" in line and "for its error." in line
    assert "resume" not in line
    killed = _watcher(tmp_path, {1}, {1: signal.SIGKILL})._line([1])
    assert "killed by SIGKILL" in killed and "resume from the newest complete checkpoint-N" in killed
