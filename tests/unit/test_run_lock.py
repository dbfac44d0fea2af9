"""One run per output_dir: a second run is refused with one line naming the holder; a dead run's lock is not."""
import json
import os
import socket
import subprocess
import sys
import threading
import time

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


def _beating_holder(path, beat=0):
    path.write_text(json.dumps({"host": "node-7", "pid": 4242, "start_ticks": "99", "started": "2026-01-01 00:00:00",
                                "beat": beat}))


def test_another_hosts_lock_that_stops_beating_is_taken_over(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(run_lock, "STALE_SECONDS", 0.3)
    _beating_holder(tmp_path / run_lock.LOCK_FILE)
    assert run_lock.refusal(tmp_path) is None  # launch.sh's pre-check: that run is gone
    lock = run_lock.acquire(tmp_path)
    assert json.loads((tmp_path / run_lock.LOCK_FILE).read_text())["pid"] == os.getpid()
    lock.release()
    err = capsys.readouterr().err
    assert "watching its heartbeat" in err and "pid 4242 on host node-7 has not beaten for 0 s" in err
    assert not (tmp_path / run_lock.LOCK_FILE).exists()


def test_another_hosts_lock_that_beats_is_refused_without_a_file_to_delete(tmp_path, monkeypatch):
    monkeypatch.setattr(run_lock, "STALE_SECONDS", 5.0)
    path = tmp_path / run_lock.LOCK_FILE
    _beating_holder(path)
    beating = threading.Timer(0.3, _beating_holder, args=(path, 1))  # its run beats once while we watch
    beating.start()
    t0 = time.monotonic()
    with pytest.raises(UserError) as e:
        run_lock.acquire(tmp_path)
    beating.join()
    [line] = e.value.lines
    assert "pid 4242 on host node-7" in line and "delete" not in line
    assert time.monotonic() - t0 < 4  # refused at the beat, not at the end of the watch
    assert json.loads(path.read_text())["beat"] == 1  # never removed


def test_the_holder_beats_and_stops_without_saving_when_its_lock_was_taken_over(tmp_path):
    """A holder paused past another host's watch finds its lock taken over: it ends at once, without saving (two
    runs writing one output_dir broke each other's next save), and leaves the other run's lock alone."""
    script = tmp_path / "hold.py"
    script.write_text(
        "import sys, time\n"
        "from pretrain_cli.training import run_lock\n"
        "run_lock.BEAT_SECONDS = 0.05\n"
        f"lock = run_lock.acquire({str(tmp_path)!r})\n"
        "time.sleep(30)\n")
    proc = subprocess.Popen([sys.executable, str(script)], stderr=subprocess.PIPE, text=True)
    path = tmp_path / run_lock.LOCK_FILE
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if json.loads(path.read_text())["beat"] >= 2:
                break
        except (OSError, ValueError, KeyError):
            pass
        time.sleep(0.02)
    assert json.loads(path.read_text())["pid"] == proc.pid  # it beats
    _beating_holder(path, beat=7)  # taken over
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 1 and "was taken over by pid 4242 on host node-7" in err and "stops without saving" in err
    assert json.loads(path.read_text())["beat"] == 7  # the other run's lock is left alone


def test_a_failed_read_during_the_watch_is_no_verdict(tmp_path, monkeypatch):
    """On NFS a read can fail around the holder's rename (ESTALE): that is no information, not a dead holder; a
    live lock whose reads fail now and then is still refused at its next beat, never taken over."""
    monkeypatch.setattr(run_lock, "STALE_SECONDS", 5.0)
    path = tmp_path / run_lock.LOCK_FILE
    _beating_holder(path)
    real, reads = run_lock._read, []

    def flaky(p):
        reads.append(p)
        return None if len(reads) in (2, 3) else real(p)

    monkeypatch.setattr(run_lock, "_read", flaky)
    beating = threading.Timer(1.0, _beating_holder, args=(path, 1))
    beating.start()
    with pytest.raises(UserError, match="pid 4242 on host node-7"):
        run_lock.acquire(tmp_path)
    beating.join()
    assert json.loads(path.read_text())["beat"] == 1  # never removed


def test_whose_names_the_holder_without_waiting(tmp_path):
    """What `eval` says of a run's output_dir without its final model: a live process here, another host's run (not
    watched: no 30 s wait), or nobody (no lock, a dead holder's). launch.sh's pre-check does not watch either."""
    assert run_lock.whose(tmp_path) is None
    _holder(tmp_path / run_lock.LOCK_FILE, os.getpid(), start_ticks=processes.start_ticks(os.getpid()))
    assert run_lock.whose(tmp_path) == f"pid {os.getpid()}"
    _holder(tmp_path / run_lock.LOCK_FILE, 2**22 + 7)  # gone
    assert run_lock.whose(tmp_path) is None
    _beating_holder(tmp_path / run_lock.LOCK_FILE)
    t0 = time.monotonic()
    assert run_lock.whose(tmp_path) == "host node-7" and run_lock.refusal(tmp_path) is None
    assert time.monotonic() - t0 < 1  # rank 0's acquire watches it, once


_KILLED_RUN = """
import json, os, signal, sys, time
from pathlib import Path
from pretrain_cli.training import run_lock
out = Path(sys.argv[1])
lock = run_lock.acquire(out, ranks=int(sys.argv[2]))
with open(out / "metrics.jsonl", "w") as f:
    for step in range(1, 8):
        f.write(json.dumps({"kind": "train", "step": step, "loss": 1.0}) + "\\n")
    f.write(json.dumps({"kind": "checkpoint", "step": 5}) + "\\n")
    f.write('{"kind": "train", "step": 8, "lo')  # the line the kill cut
(out / "checkpoint-5").mkdir()
os.kill(os.getpid(), signal.SIGKILL)  # as the out-of-memory killer ends it: no finally, no release
"""


def _killed_run(out, ranks=1):
    proc = subprocess.run([sys.executable, "-c", _KILLED_RUN, str(out), str(ranks)], capture_output=True, text=True)
    assert proc.returncode == -9, proc.stderr
    return json.loads((out / run_lock.LOCK_FILE).read_text())


def test_the_next_start_after_a_killed_run_says_where_it_ended(tmp_path, capsys, monkeypatch):
    """A run SIGKILLed (the out-of-memory killer, a scheduler) left its lock, which the next start took over without a
    word: nothing said that the previous run did not finish. `check` (`previous_end`) and `train` (`acquire`) now say
    it in one line, with the last step logged and the last checkpoint; nothing for a run that ended cleanly, nor for
    one still alive (refused)."""
    monkeypatch.delenv("PRETRAIN_CLI_RESTART", raising=False)
    out = tmp_path / "out"
    holder = _killed_run(out)
    want = (f"note: the previous run in {out} (pid {holder['pid']}, started {holder['started']}) did not finish: last "
            f"step logged 7 (metrics.jsonl), last checkpoint checkpoint-5; it was killed (SIGKILL; the kernel's "
            f"out-of-memory killer: see `dmesg`; a scheduler's limit: see its log) or crashed without a word of its own")
    assert run_lock.previous_end(out) == want  # check's line: nothing taken
    assert (out / run_lock.LOCK_FILE).exists()
    lock = run_lock.acquire(out)
    assert capsys.readouterr().err.splitlines() == [want]
    assert run_lock.previous_end(out) is None  # alive: this run holds it (a second run is refused instead)
    lock.release()  # a clean end: the next start says nothing
    assert run_lock.previous_end(out) is None
    run_lock.acquire(out).release()
    assert capsys.readouterr().err == ""


def test_a_killed_launch_and_a_launch_sh_restart_say_it_in_their_words(tmp_path, capsys, monkeypatch):
    """A launch of several ranks points at the workerlogs (its rank 0 may have been killed by its watcher after
    another rank died); under launch.sh's restart, whose own line named the failure, only where the attempt ended."""
    monkeypatch.delenv("PRETRAIN_CLI_RESTART", raising=False)
    out = tmp_path / "out"
    _killed_run(out, ranks=2)
    assert run_lock.previous_end(out).endswith("; with its 2 ranks: the workerlogs name the rank that ended first")
    monkeypatch.setenv("PRETRAIN_CLI_RESTART", "1")
    holder = json.loads((out / run_lock.LOCK_FILE).read_text())
    run_lock.acquire(out, ranks=2).release()
    assert capsys.readouterr().err.splitlines() == [
        f"note: launch.sh's restart 1: the previous attempt in {out} (started {holder['started']}) ended at: last "
        f"step logged 7 (metrics.jsonl), last checkpoint checkpoint-5"]


def test_check_says_the_previous_run_did_not_finish(tmp_path, capsys, monkeypatch):
    from data_helpers import write_tokens
    from pretrain_cli import cli

    monkeypatch.delenv("PRETRAIN_CLI_RESTART", raising=False)
    out = tmp_path / "out"
    _killed_run(out)
    (out / "checkpoint-5").rmdir()  # (a stand-in, not a checkpoint check could resume)
    path = tmp_path / "args.json"
    path.write_text(json.dumps({"model_name_or_path": "micro-llama", "input_dir": write_tokens(tmp_path / "data"),
                                "output_dir": str(out), "do_train": True, "max_steps": 10, "max_seq_length": 16,
                                "split": "1,1,1", "per_device_train_batch_size": 1, "save_steps": 5}))
    assert cli.main(["check", str(path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert any(x.startswith(f"note: the previous run in {out} (pid ") and "did not finish: last step logged 7 (metrics.jsonl), last checkpoint none;" in x
               for x in lines), lines
    assert (out / run_lock.LOCK_FILE).exists()  # check takes nothing over
