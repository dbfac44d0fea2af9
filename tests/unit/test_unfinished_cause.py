"""The next start after a run that left its lock says what that run recorded of its end (`run_lock.unfinished`): it
always said `it was killed (SIGKILL; the kernel's out-of-memory killer: see dmesg; ...) or crashed without a word of
its own`, also where the run had said its cause (W2, 2 processes under launch.sh: a hang its watchers named, a
read-only output_dir's error, a kill -9 mid-save its watchers named). The workerlogs launch.sh keeps in output_dir
hold those lines; the OOM hint stays for a run whose logs say nothing since it started."""
from __future__ import annotations

import os
import socket
import time

import pytest

from pretrain_cli.training import run_lock

HANG = ("[pretrain-cli] rank 1 (pid 4242 on vm) made no progress for 10 s while in collective at step 5; the other "
        "ranks stop too. Re-run the same command (or launch with MAX_RESTART) to resume from out/checkpoint-3, the "
        "newest complete checkpoint.")
READ_ONLY = ("error: out/checkpoint-6.tmp/model.safetensors: Permission denied; check the permissions, or choose "
             "another path")
OOM = "it was killed (SIGKILL; the kernel's out-of-memory killer"


@pytest.fixture
def out(tmp_path, monkeypatch):
    monkeypatch.delenv("PRETRAIN_CLI_RESTART", raising=False)
    (tmp_path / "out" / "log").mkdir(parents=True)
    return tmp_path / "out"


def _stamp(seconds_ago: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(time.time() - seconds_ago))


def _holder(started_ago: float = 60) -> dict:
    return {"host": socket.gethostname(), "pid": 999999, "started": _stamp(started_ago), "ranks": 2}


def _log(path, *lines) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:
        f.write("".join(line + "\n" for line in lines))


def _info(seconds_ago: float, text: str = "global_step: 5") -> str:
    return f"[{_stamp(seconds_ago)},123] [    INFO] - {text}"


def _start(seconds_ago: float, rank: int = 0, pid: int = 999999, pod: str = "podaa") -> str:
    """A launched rank's start line (`launch_logs.say_start`); the holder's rank 0: pid 999999, launch podaa."""
    return _info(seconds_ago, f"rank {rank} of 2 started: pid {pid} on {socket.gethostname()} (launch {pod})")


def test_a_hang_its_watchers_named_is_said_not_the_oom_killer(out):
    _log(out / "log" / "workerlog.0", _start(60), _info(30), "", "[pretrain-cli] rank 0: "
         + HANG.split("[pretrain-cli] ")[1].replace("; the other ranks stop too", "; this rank stops too"))
    _log(out / "log" / "workerlog.1", _start(60, 1, 4242), _info(30), "", HANG)
    line = run_lock.unfinished(out, _holder(), socket.gethostname())
    assert line.endswith(f"; {out}/log/workerlog.0 says: rank 1 (pid 4242 on vm) made no progress for 10 s while "
                         f"in collective at step 5"), line
    assert OOM not in line


def test_a_runs_own_error_line_is_said_under_master_too(out):
    """A read-only output_dir: its error kept rank 0 from removing its lock; two nodes' logs in log/node-N."""
    refused = f"error: output_dir: {out} is in use by another run (pid 999999 on this host, started ...); wait ..."
    _log(out / "log" / "node-0" / "workerlog.0", _start(60), _info(40), refused, _info(20), READ_ONLY)
    _log(out / "log" / "node-1" / "workerlog.0", _start(61, 1, 4343, "podbb"), _info(20),
         "error: rank 1: rank 0 failed while publishing")
    line = run_lock.unfinished(out, _holder(), socket.gethostname())
    assert line.endswith(f"; {out}/log/node-0/workerlog.0 says: {READ_ONLY.removeprefix('error: ')}"), line


def test_an_earlier_launchs_lines_in_the_same_log_are_not_this_runs(out):
    """Paddle's launcher appends to workerlog.N: a verdict written before the run started is another run's."""
    _log(out / "log" / "workerlog.0", _start(3700, pid=1111, pod="podzz"), _info(3600), HANG, _start(60),
         _info(30, "resumed from out/checkpoint-3 at step 3"))
    line = run_lock.unfinished(out, _holder(), socket.gethostname())
    assert OOM in line and "made no progress" not in line, line
    assert "with its 2 ranks: the workerlogs name the rank that ended first" in line


def test_a_later_launchs_error_and_verdict_are_not_the_killed_runs(out):
    """R8: a 2-rank run, every process kill -9'd (its lock stays, nothing written), then a launch with a bad input_dir
    (exit 2) into the same output_dir: the next start quoted that launch's `input_dir: /nonexistent: no token files`
    as the killed run's end (every line past a stamp newer than the lock's `started` counted)."""
    for rank in (0, 1):
        _log(out / "log" / f"workerlog.{rank}", _start(60, rank, 999999 - rank), _info(50))
    _log(out / "log" / "workerlog.0", _start(20, pid=5555, pod="podbb"),
         "error: input_dir: /nonexistent: no token files (*.bin with *.idx) there; run pretrain-cli preprocess first")
    _log(out / "log" / "workerlog.1", _start(20, 1, 5556, "podbb"),
         "[pretrain-cli] rank 1 (pid 5556 on vm) left with an error: input_dir: /nonexistent: no token files")
    line = run_lock.unfinished(out, _holder(), socket.gethostname())
    assert OOM in line and "/nonexistent" not in line, line
    # the killed run's own lines still count: its watcher's verdict, written before the later launch
    (out / "log" / "workerlog.1").write_text(f"{_start(60, 1, 999998)}\n{HANG}\n{_start(20, 1, 5556, 'podbb')}\n")
    line = run_lock.unfinished(out, _holder(), socket.gethostname())
    assert line.endswith("workerlog.1 says: rank 1 (pid 4242 on vm) made no progress for 10 s while in collective "
                         "at step 5"), line


def test_a_start_line_far_before_the_logs_end_is_found(out, monkeypatch):
    """A long run's start line lies far before the end read for its verdict: found by reading backwards."""
    from pretrain_cli.training import launch_logs

    monkeypatch.setattr(launch_logs, "TAIL", 300)
    monkeypatch.setattr(launch_logs, "SCAN", 100)
    _log(out / "log" / "workerlog.0", _start(3700, pid=1111, pod="podzz"), "error: an earlier launch's", _start(60),
         *[_info(50) for _ in range(40)], "[pretrain-cli] rank 0 (pid 999999 on vm) died: killed by SIGKILL")
    line = run_lock.unfinished(out, _holder(), socket.gethostname())
    assert line.endswith("workerlog.0 says: rank 0 (pid 999999 on vm) died: killed by SIGKILL"), line
    _log(out / "log" / "workerlog.0", _start(10, pid=2222, pod="podyy"), *[_info(5) for _ in range(40)])
    assert OOM in run_lock.unfinished(out, _holder(), socket.gethostname())  # (its lines out of the end read)


def test_a_lock_that_cannot_be_removed_leaves_the_runs_own_error_the_news(tmp_path, monkeypatch, capsys):
    """W2, output_dir made read-only mid-run: `release` raised EROFS from `run`'s `finally`, so the run's line was
    `error: out/run.lock: Read-only file system` (the save's own error hidden) and the next start quoted that."""
    import errno
    import pathlib

    lock = run_lock.acquire(tmp_path / "out")
    real = pathlib.Path.unlink

    def read_only(self, missing_ok=False):
        if self.name == run_lock.LOCK_FILE:
            raise OSError(errno.EROFS, "Read-only file system", str(self))
        return real(self, missing_ok=missing_ok)

    monkeypatch.setattr(pathlib.Path, "unlink", read_only)
    lock.release()  # no error of its own over the run's
    assert capsys.readouterr().err == (f"warning: {lock.path}: could not remove the run lock (Read-only file system); "
                                       f"the next start in {lock.path.parent} takes it over\n")
    assert lock.path.exists()


def test_a_start_line_says_its_launch_for_users_and_is_read_back(monkeypatch, capsys):
    """R12: `(launcher pod enabnk)` was Paddle's internal word; the line `say_start` writes is the one `START` reads."""
    from pretrain_cli.training import launch_logs

    monkeypatch.setenv("PADDLE_TRAINER_ID", "0")
    monkeypatch.setenv("PADDLE_TRAINERS_NUM", "2")
    monkeypatch.setenv("POD_NAME", "enabnk")
    launch_logs.say_start()
    line = capsys.readouterr().out.strip()
    assert line.endswith(f"] [    INFO] - rank 0 of 2 started: pid {os.getpid()} on {socket.gethostname()} "
                         f"(launch enabnk)"), line
    assert launch_logs.START.match(line).groups()[1:] == ("0", str(os.getpid()), socket.gethostname(), "enabnk")
