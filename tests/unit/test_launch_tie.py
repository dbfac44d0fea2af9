"""distributed/launcher/launch.end_with_launcher: a launched rank dies with its launcher. Paddle's launcher starts each
rank in a session of its own, so a launcher killed with its process group left its ranks running with PPID 1 (the
whole launch: tests/distributed/test_launch_signals.py). Plain processes here: a stand-in launcher and its rank."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"

# The rank: ties itself to its launcher as `train` does, says so, then waits.
RANK = """import os, sys, time
from pretrain_cli.distributed.launcher import launch
launch.end_with_launcher()
open(sys.argv[1], "w").write(str(os.getpid()))
time.sleep(120)
"""
# The launcher: marks itself in its ranks' environment as scripts/paddle_launch.py does, starts the rank in a session
# of its own as Paddle's launcher does, then waits.
LAUNCHER = """import os, subprocess, sys, time
from pretrain_cli.distributed.launcher import launch
os.environ[launch.LAUNCHER] = launch.launcher_mark()
subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2]], start_new_session=True)
time.sleep(120)
"""


def _env(**extra) -> dict:
    return {**os.environ, "PYTHONPATH": str(SRC), "PADDLE_TRAINER_ID": "0", **extra}


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return True
    return state in ("Z", "X")


def test_a_rank_dies_when_its_launcher_is_killed(tmp_path):
    mark = tmp_path / "rank.pid"
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER, RANK, str(mark)], env=_env(),
                                start_new_session=True)
    rank = None
    try:
        deadline = time.monotonic() + 60
        while not mark.exists() or not mark.read_text():
            assert launcher.poll() is None and time.monotonic() < deadline
            time.sleep(0.02)
        rank = int(mark.read_text())
        assert not _gone(rank)
        os.killpg(launcher.pid, signal.SIGKILL)  # the launcher's group: the rank, in its own session, is not in it
        launcher.wait()
        deadline = time.monotonic() + 30  # (the kernel's signal is at once: a bound, not a measurement)
        while not _gone(rank) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert _gone(rank)
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
            launcher.wait()
        if rank is not None and not _gone(rank):
            os.kill(rank, signal.SIGKILL)


def test_a_rank_whose_launcher_died_before_it_tied_itself_ends_at_once(tmp_path):
    # the launcher's pid now belongs to another process (this one: another start time); the launcher is gone
    env = _env(PRETRAIN_CLI_LAUNCHER=f"{os.getpid()}:0")
    rank = subprocess.run([sys.executable, "-c", RANK, str(tmp_path / "rank.pid")], env=env, timeout=60)
    assert rank.returncode == -signal.SIGKILL and not (tmp_path / "rank.pid").exists()


def test_a_process_not_launched_is_left_alone(tmp_path):
    env = {k: v for k, v in _env(PRETRAIN_CLI_LAUNCHER="1:0").items() if k != "PADDLE_TRAINER_ID"}
    rank = subprocess.run([sys.executable, "-c", RANK.replace("time.sleep(120)", ""), str(tmp_path / "rank.pid")],
                          env=env, timeout=60)
    assert rank.returncode == 0 and (tmp_path / "rank.pid").exists()
