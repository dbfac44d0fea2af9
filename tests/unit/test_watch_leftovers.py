"""A job's watch directory (`pretrain-cli-watch-<job>-<host>` in TMPDIR: the host's progress records and the
watchers' evidence, `distributed.launcher.watchdog`) is removed by the host's last watcher to finish; when every
process of the job is SIGKILLed at once (a scheduler's kill of the job, a test's clean-up, the OOM killer), its
watchers too, nothing removed it, and the launch sweep (`distributed.launcher.tempdirs`) did not know it: each such
job left one for ever. Now every rank and its watcher hold a shared lock on its `owners.lock`, and the next launch
(or rank) on the host removes a watch directory nobody holds. A "rank" here is a plain Python process running
`watchdog.start` against a stand-in for Paddle's TCP store; the job's other rank is on another host."""
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from pretrain_cli.distributed.launcher import tempdirs

REPO = Path(__file__).resolve().parents[2]
HOST = socket.gethostname()
RANK = r"""
import os, sys, time, types
store = {"pretrain_cli/peer/1": b"otherhost:1"}  # the job's rank 1, on another host
class Store:
    def set(self, key, value): store[key] = value
    def get(self, key): return store[key]
core = types.ModuleType("paddle.base.core")
core.create_or_get_global_tcp_store = Store
base = types.ModuleType("paddle.base")
base.core = core
paddle = types.ModuleType("paddle")
paddle.base = base
sys.modules.update({"paddle": paddle, "paddle.base": base, "paddle.base.core": core})
from pretrain_cli.distributed.launcher import watchdog
from pretrain_cli.run_layout import ParallelConfig
watchdog.start(ParallelConfig(world_size=2, rank=0), hang_timeout=0)
os.write(int(sys.argv[1]), f"{watchdog._WATCHER[3]}\n".encode())
time.sleep(120)
"""


def _rank(tmp_path, name: str):
    """A rank with its watcher running, TMPDIR tmp_path/tmp: (the rank, its watcher's pid, the watch directory)."""
    verdicts = tmp_path / f"verdicts-{name}"
    verdicts.mkdir()
    read, write = os.pipe()
    env = {**os.environ, "TMPDIR": str(tmp_path / "tmp"), "PYTHONPATH": str(REPO / "src"),
           "PRETRAIN_CLI_VERDICTS": str(verdicts)}
    rank = subprocess.Popen([sys.executable, "-c", RANK, str(write)], env=env, pass_fds=[write],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    os.close(write)
    with os.fdopen(read) as f:
        shared = Path(f.readline().strip())
    assert shared.is_dir(), rank.poll()
    deadline = time.monotonic() + 60
    while not (verdicts / "watcher-0.pid").is_file() or not (verdicts / "watcher-0.pid").read_text():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    return rank, int((verdicts / "watcher-0.pid").read_text()), shared


def _killed(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while os.path.exists(f"/proc/{pid}") and "zombie" not in Path(f"/proc/{pid}/status").read_text():
        assert time.monotonic() < deadline
        time.sleep(0.02)


def test_a_watch_directory_left_by_a_sigkill_of_its_rank_and_watcher_is_removed_by_the_next_launch(tmp_path):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    kept = [tmp / f"pretrain-cli-watch-{'0' * 32}-{HOST}",  # named the older way (no owners.lock): nobody to ask
            tmp / f"pretrain-cli-watch-{'1' * 32}-other-host"]  # another host's (a TMPDIR shared between hosts)
    for path in kept:
        path.mkdir()
        (path / "progress.0").write_text("")
    (kept[1] / "owners.lock").write_text("")
    rank, watcher, shared = _rank(tmp_path, "killed")
    live, live_watcher, live_shared = _rank(tmp_path, "live")
    try:
        assert shared.parent == tmp and shared.name.startswith("pretrain-cli-watch-") and shared.name.endswith(HOST)
        assert (shared / "progress.0").is_file()
        _killed(watcher)  # the watcher first: else it names its rank's death and removes the directory itself
        assert tempdirs.sweep(tmp) == [] and shared.is_dir()  # the rank still holds it
        _killed(rank.pid)
        rank.wait()
        assert shared.is_dir()  # what that SIGKILL left
        out = subprocess.run([sys.executable, str(REPO / "scripts" / "job.py"), "verdicts", str(os.getpid())],
                             env={**os.environ, "TMPDIR": str(tmp)}, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr  # (launch.sh's first step: its verdict directory, after a sweep)
        assert not shared.exists()
        assert all(path.is_dir() for path in kept)
        assert live_shared.is_dir()  # another job's, whose rank and watcher live
    finally:
        for pid in (watcher, rank.pid, live_watcher, live.pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        rank.wait()
        live.wait()


def test_the_ranks_of_a_host_share_one_directory_held_while_any_of_them_lives(tmp_path, monkeypatch):
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    job = "ab" * 16
    first, held = tempdirs.watch_dir(job)
    again, other = tempdirs.watch_dir(job)  # another rank of the job on this host
    assert again == first and first.name == f"pretrain-cli-watch-{job}-{HOST}"
    assert sorted(p.name for p in tmp_path.iterdir()) == [first.name]  # nothing else made, nothing half-made left
    os.close(held)
    assert tempdirs.sweep(tmp_path) == [] and first.is_dir()  # the other still holds it
    os.close(other)
    assert tempdirs.sweep(tmp_path) == [first] and not first.exists()
    made, fd = tempdirs.watch_dir(job)  # a rank arriving after the sweep makes it again
    try:
        assert made == first and (made / tempdirs.OWNERS).is_file()
    finally:
        os.close(fd)


def test_a_watcher_outliving_its_rank_holds_the_directory_too(tmp_path):
    """The watcher holds its rank's lock (its fd 5), whatever descriptor the rank's was: a rank dead, its watcher still
    at work (stopped here, so it cannot finish and remove the directory itself), is no directory to sweep."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    rank, watcher, shared = _rank(tmp_path, "outlived")
    try:
        os.kill(watcher, signal.SIGSTOP)
        _killed(rank.pid)
        rank.wait()
        assert tempdirs.sweep(tmp) == [] and shared.is_dir()
    finally:
        os.kill(watcher, signal.SIGKILL)
        rank.wait()
    _killed(watcher)
    assert tempdirs.sweep(tmp) == [shared] and not shared.exists()
