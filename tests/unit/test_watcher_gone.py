"""A rank whose watcher is killed while it runs says so once, in its own log, and goes on (`watchdog._gone`): before,
nothing said it, and the rank's output went into a pipe nobody read. A watcher its rank stops (`watchdog.stop`) is
no such loss. A "rank" here is a plain Python process with a sleeping peer, as in test_watchdog."""
import os
import signal
import subprocess
import sys
import time

RANK = r"""
import os, subprocess, sys, time
from pathlib import Path
from pretrain_cli.distributed.launcher import watchdog, watcher
peer = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL)
shared, verdicts = Path(sys.argv[1]), Path(sys.argv[2])
watchdog._spawn(watcher.Watcher(0, {0: os.getpid(), 1: peer.pid}, "h", shared, verdicts, grace=5.0))
print("watcher", watchdog._WATCHER[0], flush=True)
while not Path(sys.argv[3]).exists():  # the test kills the watcher (or not), then says go on
    time.sleep(0.01)
time.sleep(0.2)
for step in range(3):
    print(f"step {step}", flush=True)
watchdog.stop()
print("done", flush=True)
peer.kill()
"""
WARNING = "[pretrain-cli] rank 0: its watcher (pid {}) ended: killed by SIGKILL; training goes on unwatched"


def _rank(tmp_path, kill: bool):
    shared, verdicts, go = tmp_path / "shared", tmp_path / "verdicts", tmp_path / "go"
    shared.mkdir()
    verdicts.mkdir()
    p = subprocess.Popen([sys.executable, "-c", RANK, str(shared), str(verdicts), str(go)], stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
    first = p.stdout.readline()
    assert first.startswith("watcher "), first
    pid = int(first.split()[1])
    if kill:
        os.kill(pid, signal.SIGKILL)
    go.write_text("")
    out = p.stdout.read()
    p.wait(timeout=60)
    return p.returncode, out, pid


def test_a_killed_watcher_is_said_once_by_its_rank_which_goes_on_to_exit_0(tmp_path):
    code, out, pid = _rank(tmp_path, kill=True)
    assert code == 0, out
    assert out.count(WARNING.format(pid)) == 1, out
    assert "step 0\nstep 1\nstep 2\ndone\n" in out, out  # its output reaches its log again, the rank ends by itself


def test_a_watcher_its_rank_stops_is_no_loss(tmp_path):
    code, out, pid = _rank(tmp_path, kill=False)
    assert code == 0 and "step 2\ndone\n" in out, out
    assert "its watcher" not in out, out
    deadline = time.monotonic() + 5
    while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:  # reaped by `stop`
        time.sleep(0.05)
    assert not os.path.exists(f"/proc/{pid}")
