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


def test_a_sigterm_during_paddles_import_in_a_tied_rank_ends_it_quietly(tmp_path):
    """A rank tied to its launcher, SIGTERMed while it imports Paddle (the launcher stops it after another rank's usage
    error): it dies of the signal with no `FatalError: Termination signal` report. The main thread holds SIGTERM back
    during the import (`runtime.import_paddle`), so the kernel gives a process's SIGTERM to a thread that takes it:
    the tie's own thread did, and ran Paddle's handler. Sent to the process, as a launcher sends it, once the import
    is well past Paddle's core, from a thread that takes no SIGTERM itself (a fresh interpreter)."""
    code = ("import os, signal, sys, threading, time\n"
            "from pretrain_cli import runtime\nfrom pretrain_cli.distributed.launcher import launch\n"
            "launch.end_with_launcher()\n"
            "assert [t for t in threading.enumerate() if t.name == 'launcher-deadline']\n"
            "def stop_it():\n"
            "    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})\n"
            "    while 'paddle.nn' not in sys.modules:\n        time.sleep(0.001)\n"
            "    os.kill(os.getpid(), signal.SIGTERM)\n"
            "threading.Thread(target=stop_it, daemon=True).start()\n"
            "runtime.import_paddle()\ntime.sleep(30)\nprint('survived')\n")
    p = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=_env(), capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == -signal.SIGTERM, p.stdout[-2000:] + p.stderr[-2000:]
    assert "FatalError" not in p.stdout + p.stderr and "survived" not in p.stdout, p.stdout[-2000:] + p.stderr[-2000:]


def test_the_tie_thread_takes_no_stop_signal(tmp_path):
    """The tie's thread blocks SIGTERM, SIGINT and SIGHUP (its mask, read from /proc), and the caller's mask is as
    it was: the stop signals go to the threads that handle them."""
    code = ("import signal, threading\nfrom pretrain_cli.distributed.launcher import launch\n"
            "launch.end_with_launcher()\n"
            "tie = [t for t in threading.enumerate() if t.name == 'launcher-deadline'][0]\n"
            "def blocked(tid):\n"
            "    line = [l for l in open(f'/proc/self/task/{tid}/status') if l.startswith('SigBlk:')][0]\n"
            "    mask = int(line.split()[1], 16)\n"
            "    return sorted(int(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP) if mask >> (s - 1) & 1)\n"
            "print(blocked(tie.native_id), blocked(threading.get_native_id()), sep=';')\n")
    p = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=_env(), capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0, p.stderr[-2000:]
    tie, caller = p.stdout.strip().split(";")
    assert tie == str(sorted([int(signal.SIGTERM), int(signal.SIGINT), int(signal.SIGHUP)])) and caller == "[]", p.stdout
