"""scripts/paddle_launch.py, the launcher scripts/launch.sh runs, on a stop's signal: its exit code is the shell's,
a stop inside Paddle's import ends it before any rank, its ranks get STOP_TIMEOUT seconds to save. (The command
launch.sh builds and its restarts: test_launch_script.py.)"""
import os
import subprocess
from pathlib import Path

import pytest

LAUNCHER = Path(__file__).resolve().parents[2] / "scripts" / "paddle_launch.py"


def _paddle_launch(tmp_path):
    """scripts/paddle_launch.py over one process of a script that only sleeps (no rank of ours: no records)."""
    import sys

    (tmp_path / "sleep.py").write_text("import time\ntime.sleep(60)\n")
    return subprocess.Popen([sys.executable, str(LAUNCHER), "--nproc_per_node", "1",
                             "--log_dir", str(tmp_path / "log"), str(tmp_path / "sleep.py")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)


def _wait(condition, proc, seconds=60):
    import time

    deadline = time.monotonic() + seconds
    while not condition():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)


def test_the_launchers_exit_on_a_signal_is_the_shells_not_the_signals_number(tmp_path):
    """Paddle's launcher exits with the signal's number (15 here: job.py decide would retry it; 2 for SIGINT: a
    usage error's code); paddle_launch.py makes it 143 / 130, which decide stops on."""
    import signal

    proc = _paddle_launch(tmp_path)

    def rank_running():  # the launcher's child runs sleep.py (its log file exists a moment before, mid-deploy)
        for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
            try:
                args = cmdline.read_bytes().split(b"\0")
                parent = (cmdline.parent / "stat").read_text().split(") ", 1)[1].split()[1]
            except (OSError, IndexError):
                continue
            exec_d = not any(a.endswith(b"paddle_launch.py") for a in args)  # the child itself, not a fork of its parent
            if exec_d and any(a.endswith(b"sleep.py") for a in args) and parent == str(proc.pid):
                return True
        return False

    _wait(rank_running, proc)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143 and "Traceback" not in err, err


def test_a_ctrl_c_while_paddle_is_imported_is_error_interrupted_130(tmp_path):
    """Interrupted inside Paddle's import (the launcher not started): one line, 130. A stand-in `paddle` raises what
    Paddle's import raises then (an ImportError from the KeyboardInterrupt): a real signal's timing under load made
    this flaky (the part of the import that swallows one: the next test)."""
    import sys

    from test_interrupted_import import interrupted_paddle

    (tmp_path / "sleep.py").write_text("import time\ntime.sleep(60)\n")
    proc = subprocess.run([sys.executable, str(LAUNCHER), "--nproc_per_node", "1",
                           "--log_dir", str(tmp_path / "log"), str(tmp_path / "sleep.py")], capture_output=True,
                          text=True, cwd=tmp_path, env=interrupted_paddle(tmp_path), timeout=60)
    assert proc.returncode == 130 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == "error: interrupted", proc.stderr


@pytest.mark.parametrize("sig, code, line", [
    ("SIGINT", 130, "error: interrupted"),  # Ctrl-C: the job's process group
    ("SIGTERM", 143, None),  # a scheduler's SIGTERM to the group (Paddle's own handler answered it with a report)
    ("SIGUSR1", 143, None),  # launch.sh passing on a SIGTERM it had alone
])
def test_a_stop_in_the_part_of_paddles_import_that_swallows_it_ends_the_launcher_before_any_rank(tmp_path, sig, code,
                                                                                                line):
    """Paddle's import asks `which nvcc` under a bare `except:`: a Ctrl-C then was swallowed and the launcher went on
    to start its ranks. The signal lands there for sure: a stand-in `which` says it started and waits."""
    import signal
    import sys

    from test_interrupted_import import STAND_IN

    (tmp_path / "sleep.py").write_text("import time\ntime.sleep(60)\n")
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "which").write_text(STAND_IN)
    (tmp_path / "bin" / "which").chmod(0o755)
    mark = tmp_path / "stalled"
    env = {**os.environ, "STALL": "which nvcc", "STALL_MARK": str(mark), "REAL_PATH": os.environ["PATH"],
           "PATH": f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}"}
    proc = subprocess.Popen([sys.executable, str(LAUNCHER), "--nproc_per_node", "1",
                             "--log_dir", str(tmp_path / "log"), str(tmp_path / "sleep.py")], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                            start_new_session=True)
    try:
        _wait(mark.exists, proc)
        (os.kill if sig == "SIGUSR1" else os.killpg)(proc.pid, getattr(signal, sig))
        (tmp_path / "stalled.go").touch()  # (a SIGTERM is held back during the import: `which` too has it blocked)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == code and "Traceback" not in err and "Termination signal" not in err, err[-3000:]
    if line:
        assert err.strip().splitlines()[-1] == line, err
    assert not (tmp_path / "log").exists()  # no rank started


# A rank whose stop takes 3 s: at the launcher's SIGTERM (its first; the launcher sends up to 3) it "saves", then ends.
SAVING_RANK = """import signal, sys, time
from pathlib import Path
stops = []
def stop(signum, frame):
    stops.append(signum)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
signal.signal(signal.SIGTERM, stop)
Path(sys.argv[1]).write_text("ready")
while not stops:
    time.sleep(0.05)
time.sleep(3)
Path(sys.argv[2]).write_text("saved")
"""


@pytest.mark.parametrize("limit, saved", [("1", False), ("20", True), ("0", True)])
def test_a_stop_gets_stop_timeout_seconds_to_save_not_paddles_30(tmp_path, limit, saved):
    """Paddle's launcher SIGKILLed its ranks 30 s after its stop's SIGTERM (`pod.stop(timeout=30)`): a longer save was
    lost, whatever the scheduler allowed. paddle_launch.py gives them STOP_TIMEOUT seconds (0: no limit): a 3 s save
    is kept under 20 and 0 and killed under 1, with one line saying so (the old code kept it under 1 too)."""
    import signal
    import sys

    from pretrain_cli.distributed.launcher import stopping

    (tmp_path / "rank.py").write_text(SAVING_RANK)
    ready, done = tmp_path / "ready", tmp_path / "saved"
    proc = subprocess.Popen([sys.executable, str(LAUNCHER), "--nproc_per_node", "1",
                             "--log_dir", str(tmp_path / "log"), str(tmp_path / "rank.py"), str(ready), str(done)],
                            env={**os.environ, "STOP_TIMEOUT": limit}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=tmp_path)
    try:
        _wait(ready.exists, proc)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 143 and "Traceback" not in err, err
    assert done.exists() == saved, err
    note = [x for x in err.splitlines() if x.startswith("launch.sh: STOP_TIMEOUT=0: ")]  # the deadline 0 leaves
    assert note == ([stopping.unlimited(0)] if limit == "0" else []), err
    said = [x for x in err.splitlines() if "had not finished their stop" in x]
    assert said == ([] if saved else [f"launch.sh: the ranks had not finished their stop {limit} s after the signal "
                                      f"(STOP_TIMEOUT); killing them: the checkpoint they were saving is lost (a re-run "
                                      f"resumes from the newest complete one). Give a stop more time with STOP_TIMEOUT "
                                      f"(and the scheduler's grace period before its SIGKILL)"]), err


def test_a_stop_timeout_that_is_no_whole_number_of_seconds_is_one_line_before_any_rank(tmp_path):
    import sys

    proc = subprocess.run([sys.executable, str(LAUNCHER), "--nproc_per_node", "1",
                           "--log_dir", str(tmp_path / "log"), str(tmp_path / "rank.py")],
                          env={**os.environ, "STOP_TIMEOUT": "10m"}, capture_output=True, text=True, cwd=tmp_path,
                          timeout=60)
    assert proc.returncode == 2 and proc.stderr.strip() == (
        "launch.sh: STOP_TIMEOUT='10m': give the seconds the ranks get to finish their step and save after a stop's "
        "signal as a whole number (default 900; 0: no limit)"), proc.stderr
    assert not (tmp_path / "log").exists()
