"""distributed/launcher/launch.end_with_launcher: a launched rank whose launcher dies gets SIGTERM from the kernel (the
stop `training.stop_signals` handles), and one still running `deadline_seconds` after that death SIGKILLs itself.
Plain processes: an observer (a child subreaper, so that it reaps the orphaned rank and reads how it ended), a
stand-in launcher that starts the rank in a session of its own as Paddle's does, and the rank. Before, the kernel
SIGKILLed the rank at its launcher's death: a rank that stops on SIGTERM never saved. (The whole launch:
tests/distributed/test_launcher_death.py.)"""
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from pretrain_cli.distributed.launcher import launch, stopping

SRC = Path(__file__).resolve().parents[2] / "src"

# The rank: ties itself to its launcher as `train` does; at SIGTERM it notes the signal and, "stops", leaves at once
# (its stop done), or, "stuck", goes on waiting (a collective that never returns).
RANK = """import os, signal, sys, time
from pretrain_cli.distributed.launcher import launch
launch.end_with_launcher()
mark, mode = sys.argv[1], sys.argv[2]
def on_term(signum, frame):
    open(mark + ".term", "w").write(str(launch.launcher_gone()))
    if mode == "stops":
        sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
open(mark, "w").write(str(os.getpid()))
for _ in range(600):
    time.sleep(0.2)
"""
LAUNCHER = """import subprocess, sys, time
subprocess.Popen([sys.executable, "-c", *sys.argv[1:]], start_new_session=True)
time.sleep(120)
"""
# The observer: a child subreaper (PR_SET_CHILD_SUBREAPER), so the rank, orphaned by its launcher's SIGKILL, becomes
# its child; prints how the rank ended and how long after its launcher's kill.
OBSERVER = """import ctypes, json, os, signal, subprocess, sys, time
ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)
launcher = subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]])
deadline = time.monotonic() + 60
while not os.path.exists(sys.argv[3]) or not open(sys.argv[3]).read():
    assert launcher.poll() is None and time.monotonic() < deadline
    time.sleep(0.02)
rank = int(open(sys.argv[3]).read())
killed = time.monotonic()  # (before the kill: the rank's deadline counts from the death, which comes after)
launcher.kill()
launcher.wait()
_, status = os.waitpid(rank, 0)
print(json.dumps({"status": status, "after": time.monotonic() - killed}))
"""


def _observe(tmp_path: Path, mode: str, **env) -> dict:
    full_env = {**os.environ, "PYTHONPATH": str(SRC), "PADDLE_TRAINER_ID": "0", **env}
    mark = tmp_path / "rank.pid"
    out = subprocess.run([sys.executable, "-c", OBSERVER, LAUNCHER, RANK, str(mark), mode], env=full_env,
                         capture_output=True, text=True, timeout=120, start_new_session=True)
    assert out.returncode == 0, out.stderr[-2000:]
    return {**json.loads(out.stdout), "term": (tmp_path / "rank.pid.term").read_text(), "said": out.stderr}


def test_a_rank_whose_launcher_dies_gets_the_stop_signal_and_its_stop_ends_it(tmp_path):
    seen = _observe(tmp_path, "stops", PRETRAIN_CLI_STOP_LIMIT="60")
    assert os.WIFEXITED(seen["status"]) and os.WEXITSTATUS(seen["status"]) == 0, seen
    assert seen["term"] == "60"  # the rank knew its launcher was gone, and its deadline


def test_a_rank_that_does_not_stop_kills_itself_at_its_deadline(tmp_path):
    seen = _observe(tmp_path, "stuck", PRETRAIN_CLI_STOP_LIMIT="2")
    assert os.WIFSIGNALED(seen["status"]) and os.WTERMSIG(seen["status"]) == signal.SIGKILL, seen
    assert seen["term"] == "2"
    assert seen["after"] >= 2  # (not before its deadline: the thread sleeps it out from the launcher's death)
    assert ("[pretrain-cli] rank 0: its launcher died 2 s ago and this rank has not ended since (stuck in a collective, "
            "a peer gone, or a save longer than that): it ends itself now (SIGKILL)") in seen["said"], seen


@pytest.mark.parametrize("environ, seconds", [
    ({"PRETRAIN_CLI_STOP_LIMIT": "45", "PADDLE_TRAINER_ID": "0"}, 45),  # scripts/paddle_launch.py: STOP_TIMEOUT
    ({"PRETRAIN_CLI_STOP_LIMIT": "0", "PADDLE_TRAINER_ID": "0"}, stopping.DEFAULT),  # no limit: the hang allowance's
    ({"PADDLE_TRAINER_ID": "1"}, stopping.PADDLE),  # Paddle's launcher run directly: its 30 s
])
def test_the_deadline_is_the_time_the_launcher_gives_a_stop(environ, seconds):
    assert launch.deadline_seconds(environ) == seconds


def test_a_stop_without_limit_says_the_deadline_its_launchers_death_still_gives():
    assert stopping.unlimited(0) == (
        "launch.sh: STOP_TIMEOUT=0: a stop by signal waits for the ranks however long they take to save; should the "
        "launcher die (launch.sh killed with its process group, a hang-up), each rank still ends itself "
        f"{launch.deadline_seconds({'PRETRAIN_CLI_STOP_LIMIT': '0', 'PADDLE_TRAINER_ID': '0'})} s after that, saved "
        "or not: give STOP_TIMEOUT the seconds to set both")
    assert stopping.unlimited(900) is None and stopping.unlimited(1) is None


# A launcher whose main thread, which started the rank, ends before its other thread (as in a SIGKILLed launcher with a
# server thread): the kernel's SIGTERM comes while the rank's parent is still that pid.
THREADED_LAUNCHER = """import ctypes, os, subprocess, sys, threading, time
subprocess.Popen([sys.executable, "-c", *sys.argv[1:]], start_new_session=True)
while not os.path.exists(sys.argv[2]) or not open(sys.argv[2]).read():
    time.sleep(0.02)
threading.Thread(target=lambda: (time.sleep(5), os._exit(0))).start()
ctypes.CDLL(None).syscall({"x86_64": 60, "aarch64": 93}[os.uname().machine], 0)  # SYS_exit: the main thread alone
"""


def test_a_launcher_whose_main_thread_ended_first_is_gone_for_the_ranks_stop(tmp_path):
    import time

    mark = tmp_path / "rank.pid"
    env = {**os.environ, "PYTHONPATH": str(SRC), "PADDLE_TRAINER_ID": "0", "PRETRAIN_CLI_STOP_LIMIT": "60"}
    launcher = subprocess.Popen([sys.executable, "-c", THREADED_LAUNCHER, RANK, str(mark), "stops"], env=env,
                                start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "rank.pid.term").exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert (tmp_path / "rank.pid.term").read_text() == "60"  # before: "None", a plain SIGTERM's line
    finally:
        launcher.kill()
        launcher.wait()


def test_a_launcher_gone_already_starts_the_deadline_at_once():
    ended = []  # (-1 is not this process's parent: its launcher, so named, is gone)
    launch._end_after(-1, 0, end=ended.append, poll=0.01)
    assert ended == [0] and launch.launcher_gone() is None  # (this process tied itself to no launcher)
