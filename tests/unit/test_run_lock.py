"""One run per output_dir: a second run is refused with one line naming the holder; a dead run's lock is not."""
import json
import os
import socket
import subprocess
import sys

import pytest

from pretrain_cli.errors import UserError
from pretrain_cli import processes
from pretrain_cli.training import run_lock


def _holder(path, pid, host=None, start_ticks=None):
    path.write_text(json.dumps({"host": host or socket.gethostname(), "pid": pid, "start_ticks": start_ticks,
                                "started": "2026-01-01 00:00:00"}))


def test_second_run_is_refused_and_a_dead_runs_lock_is_taken_over(tmp_path):
    out = tmp_path / "out"
    lock = run_lock.acquire(out)
    with pytest.raises(UserError) as e:  # a second run in this process's directory (this pid is alive)
        run_lock.acquire(out)
    [line] = e.value.lines
    assert f"pid {os.getpid()} on this host" in line and str(out) in line and "choose another output_dir" in line
    lock.release()
    assert not out.exists()  # it created the directory and wrote nothing else: nothing is left behind

    out.mkdir()
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        _holder(out / run_lock.LOCK_FILE, other.pid, start_ticks=processes.start_ticks(other.pid))
        with pytest.raises(UserError, match=f"pid {other.pid} on this host"):
            run_lock.acquire(out)
    finally:
        other.kill()
        other.wait()
    run_lock.acquire(out).release()  # the holder died (kill -9 leaves its lock): stale, taken over
    assert sorted(p.name for p in out.iterdir()) == []  # and the candidate file is gone too
    _holder(out / run_lock.LOCK_FILE, os.getppid(), start_ticks="1")  # a live pid reused by another process
    run_lock.acquire(out).release()


def test_a_lock_from_another_host_is_refused_with_the_file_to_remove(tmp_path):
    _holder(tmp_path / run_lock.LOCK_FILE, 4242, host="node-7")
    with pytest.raises(UserError) as e:
        run_lock.acquire(tmp_path)
    [line] = e.value.lines
    assert "pid 4242 on host node-7" in line and f"delete {tmp_path / run_lock.LOCK_FILE}" in line
    assert (tmp_path / run_lock.LOCK_FILE).exists()  # never removed behind another host's back
