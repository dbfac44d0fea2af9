"""The forked rank's stand-in (rank_shim.py) towards a launcher: the exit status, signals, SIGKILL, an orphaned shim,
and the fallback to a fresh interpreter. A tiny script stands for the rank (no Paddle work), so each case costs a
fork; the servers are the ones every `launch` of this worker uses (forkserver.rank_servers)."""
import contextlib
import os
import signal
import subprocess
import sys
import time

import forkserver
import pytest

from launch_helpers import SHIM, child_env

RANK = '''import os, signal, sys, time
mode = sys.argv[1]
if mode == "term":  # before the pid is printed: the test signals as soon as it reads it
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(7))
print(os.getpid(), flush=True)
if mode == "exit":
    sys.exit(3)
if mode == "segv":
    os.kill(os.getpid(), signal.SIGSEGV)
if mode in ("watcher", "stays") and os.fork() == 0:  # a child in a session of its own, as the product's rank watcher
    os.setsid()
    print(os.getpid(), flush=True)
    time.sleep(5 if mode == "watcher" else 60)
    os._exit(0)
time.sleep(60)
'''


@pytest.fixture(scope="module")
def rank_script(tmp_path_factory):
    path = tmp_path_factory.mktemp("rank") / "rank.py"
    path.write_text(RANK)
    return path


def _start(script, mode, **env):
    """The shim as the launcher starts it (`python -u`, its own session, PADDLE_TRAINER_ID set), and the pid the
    rank prints."""
    full = dict(child_env(), PADDLE_TRAINER_ID="1", **env)
    # the shim starts with SIGINT at its default, as from a foreground shell, even when the suite runs as a background
    # job (whose processes inherit SIGINT ignored, and so would the shim: an ignored disposition survives exec)
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        proc = subprocess.Popen([sys.executable, "-u", str(SHIM), forkserver.rank_servers(child_env()), str(script),
                                 mode], env=full, stdout=subprocess.PIPE, text=True, start_new_session=True)
    finally:
        signal.signal(signal.SIGINT, before)
    return proc, int(proc.stdout.readline())


def _ended(proc, rank: int, within: float = 30.0):
    """The shim's exit status; if it has not ended within `within` s, fail naming what the shim and its rank were
    doing (state, kernel wait, signal masks: blocked, ignored, caught, pending), the one thing a rare hang in a full
    suite leaves to read, then kill both."""
    try:
        return proc.wait(within)
    except subprocess.TimeoutExpired:
        seen = {name: _proc_state(pid) for name, pid in (("shim", proc.pid), ("rank", rank))}
        for pid in (rank, proc.pid):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        proc.wait(10)
        pytest.fail(f"the shim had not ended {within:.0f} s after its signal: {seen}")


def _proc_state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/status") as f:
            lines = [line.strip() for line in f if line.startswith(("State", "Threads", "Sig", "ShdPnd"))]
        with open(f"/proc/{pid}/wchan") as f:
            return "; ".join([*lines, f"wchan {f.read()}"])
    except OSError as e:
        return f"gone ({e.strerror})"


def _dead(pid: int, within: float = 5.0) -> bool:
    """Whether `pid` is gone or a zombie within `within` seconds."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                if f.read().rsplit(b")", 1)[1].split()[0] in (b"Z", b"X"):
                    return True
        except OSError:
            return True
        time.sleep(0.02)
    return False


@pytest.mark.parametrize("mode, status", [("exit", 3), ("segv", -signal.SIGSEGV)])
def test_the_shim_ends_as_its_rank_did(rank_script, mode, status):
    proc, rank = _start(rank_script, mode)
    assert proc.wait(30) == status
    assert rank != proc.pid  # forked, not run by the shim itself


def test_signals_to_the_shim_reach_the_rank(rank_script):
    """The launcher's teardown (killpg SIGTERM) reaches the rank's handler; an unhandled SIGINT ends it by SIGINT."""
    proc, rank = _start(rank_script, "term")
    os.killpg(proc.pid, signal.SIGTERM)
    assert _ended(proc, rank) == 7 and _dead(rank)
    proc, rank = _start(rank_script, "sleep")
    proc.send_signal(signal.SIGINT)
    assert _ended(proc, rank) == -signal.SIGINT and _dead(rank)


def test_a_killed_shim_takes_its_rank_but_not_the_ranks_own_session(rank_script):
    """kill -9 of the shim (the launcher's last resort, a test's kill of a rank): the rank dies at once, as a fresh
    rank would; its watcher (a session of its own) lives on to tell it."""
    proc, rank = _start(rank_script, "watcher")
    watcher = int(proc.stdout.readline())
    proc.kill()
    assert proc.wait(30) == -signal.SIGKILL
    assert _dead(rank, within=2.0)
    assert not _dead(watcher, within=0.5)
    os.kill(watcher, signal.SIGKILL)


def test_an_orphaned_shim_leaves_and_its_rank_goes_with_it(rank_script):
    """The launcher killed (a test's timeout): its ranks must not run on unwatched."""
    launcher = subprocess.Popen(["bash", "-c", '"$0" -u "$1" "$2" "$3" sleep & echo $!; wait', sys.executable,
                                 str(SHIM), forkserver.rank_servers(child_env()), str(rank_script)],
                                env=dict(child_env(), PADDLE_TRAINER_ID="0"), stdout=subprocess.PIPE, text=True)
    shim, rank = int(launcher.stdout.readline()), int(launcher.stdout.readline())
    launcher.kill()
    launcher.wait()
    assert _dead(rank) and _dead(shim)


# a launcher as paddle.distributed.launch starts a rank (the shim, in a session of its own), which then waits for ever
LAUNCHER = """import os, subprocess, sys, time
with open("pids", "w") as out:
    shim = subprocess.Popen([sys.executable, "-u", *sys.argv[1:], "stays"], stdout=out, start_new_session=True,
                            env=dict(os.environ, PADDLE_TRAINER_ID="0"))
    out.write(f"{shim.pid}\\n")
time.sleep(600)
"""


def test_a_launch_timed_out_is_killed_with_its_ranks_and_their_watchers_before_its_ports_are_given_up(rank_script,
                                                                                                      tmp_path):
    """A forked launcher that outlives its timeout (launch_helpers._launched, then its port block released): only the
    launcher was killed, so its shim, the forked rank and the rank's watcher (each in a session of its own) ran on, and
    the next test handed that block could read a live rank's registrations (the flake class of 3a4a36f)."""
    from process_tree import _state

    with pytest.raises(subprocess.TimeoutExpired):
        forkserver.run(["-c", LAUNCHER, str(SHIM), forkserver.rank_servers(child_env()), str(rank_script)],
                       cwd=tmp_path, env=child_env(), timeout=10, spawns=True)
    pids = [int(x) for x in (tmp_path / "pids").read_text().split()]
    assert len(pids) == 3, pids  # the shim, the forked rank, its watcher: all there before the timeout
    assert [_state(pid) in (None, "Z", "X") for pid in pids] == [True] * 3, pids  # ... and gone when it is raised


def test_a_rank_whose_environment_paddle_reads_at_import_differs_starts_afresh(rank_script):
    """A FLAGS_ variable the server did not start with: the shim becomes the rank itself (exec, same pid)."""
    proc, rank = _start(rank_script, "exit", FLAGS_call_stack_level="2")
    assert proc.wait(30) == 3 and rank == proc.pid


def test_a_forked_run_whose_exit_functions_hang_still_ends_and_names_where(tmp_path):
    """An exit function stuck for good (as on a lock a server thread held when it forked): the forked run ends
    after forkserver.EXIT_GRACE with its own status and the stuck thread's stack on stderr, instead of hanging."""
    code = ("import atexit, threading; lock = threading.Lock(); lock.acquire(); atexit.register(lock.acquire); "
            "raise SystemExit(5)")
    start = time.monotonic()
    out = forkserver.run(["-c", code], cwd=tmp_path, timeout=60)  # the server's environment: forked
    assert out.returncode == 5 and time.monotonic() - start < forkserver.EXIT_GRACE + 20
    assert out.stderr.startswith("Timeout") and " in _exit" in out.stderr  # faulthandler's dump: stuck in _exit
