"""A second job started into a live run's output_dir (W2: two nodes on one machine under launch.sh, MASTER set, so
launch.sh's own `held` check is not asked): with another batch layout its rank 0 read the live run's checkpoint-50 and
blamed the batch (`gradient_accumulation_steps: checkpoint-50 was trained on 8 x acc 1 ...`, exit 2), where a matching
batch got the lock's `... is in use by another run (pid ...)` from `run`'s acquire. `prepare(..., lock=True)` (`train`,
`check`) judges the lock before anything reads a checkpoint there."""
from __future__ import annotations

import json
import threading

import pytest

from data_helpers import write_tokens

from pretrain_cli.errors import UserError
from pretrain_cli.orchestration import resumed
from pretrain_cli.orchestration.prepare import prepare
from pretrain_cli.run_config import Target
from pretrain_cli.training import run_lock


class Read(Exception):
    """The resume's reading of output_dir's checkpoints began."""


def _args(tmp_path, out):
    return ["--model_name_or_path", "micro-qwen2", "--input_dir", write_tokens(tmp_path / "docs"), "--output_dir",
            str(out), "--do_train", "--max_steps", "2", "--device", "cpu", "--overwrite_output_dir", "false"]


def _reading(run):
    raise Read(run.output.output_dir)


def test_a_live_runs_output_dir_is_refused_before_its_checkpoints_are_read(tmp_path, monkeypatch):
    out = tmp_path / "out"
    monkeypatch.setattr(resumed, "find_resume", _reading)
    live = run_lock.acquire(out)  # this process: a live run of this host
    try:
        with pytest.raises(UserError) as e:
            prepare(None, _args(tmp_path, out), Target("cpu", 1), lock=True)
        assert str(e.value) == run_lock.refusal(out)
        assert "is in use by another run (pid" in str(e.value)
        with pytest.raises(Read):  # `eval`, `inspect-data` (no lock asked) read as before
            prepare(None, _args(tmp_path, out), Target("cpu", 1))
    finally:
        live.release()
    with pytest.raises(Read):  # its run gone: the resume reads the checkpoints
        prepare(None, _args(tmp_path, out), Target("cpu", 1), lock=True)


def test_only_rank_0_judges_the_lock_its_own_rank_0_may_hold_already(tmp_path, monkeypatch):
    """Rank 1 of a launch reads no checkpoint before the join (rank 0's choice is taken then), and the lock it would
    find is its own rank 0's once that rank got going: not judged there."""
    out = tmp_path / "out"
    live = run_lock.acquire(out)
    try:
        spec = prepare(None, _args(tmp_path, out), Target("cpu", 2, rank=1, local_rank=1), lock=True)
        assert spec.resume is None
    finally:
        live.release()


def _other_hosts_lock(out, beat: int) -> dict:
    lock = {"host": "otherhost", "pid": 4242, "start_ticks": 1, "started": "2026-01-01 00:00:00", "beat": beat,
            "ranks": 2}
    (out / run_lock.LOCK_FILE).write_text(json.dumps(lock))
    return lock


def test_another_hosts_beating_lock_is_refused_before_its_checkpoints_are_read(tmp_path, monkeypatch, capsys):
    """R8: another host's lock, rewritten every second with its beat one higher: `refusal` left it to `acquire`, so
    prepare read the live run's checkpoints (and blamed the batch, advising overwrite_output_dir: true, which would
    wipe a live run's folder)."""
    out = tmp_path / "out"
    out.mkdir()
    monkeypatch.setattr(resumed, "find_resume", _reading)
    monkeypatch.setattr(run_lock, "STALE_SECONDS", 1.0)
    stop = threading.Event()

    def beat():
        n = 1
        while not stop.is_set():
            _other_hosts_lock(out, n)
            n += 1
            stop.wait(0.05)

    _other_hosts_lock(out, 0)  # (there before prepare starts)
    beater = threading.Thread(target=beat)
    beater.start()
    try:
        with pytest.raises(UserError) as e:
            prepare(None, _args(tmp_path, out), Target("cpu", 1), lock=True)
    finally:
        stop.set()
        beater.join()
    assert str(e.value).startswith(f"output_dir: {out} is in use by another run (pid 4242 on host otherhost"), e.value


def test_another_hosts_silent_lock_is_watched_once_then_taken_over(tmp_path, monkeypatch, capsys):
    """A lock that stopped beating: prepare's watch finds its run gone, and `acquire` takes it over without watching
    again (the wait happens once)."""
    out = tmp_path / "out"
    out.mkdir()
    monkeypatch.setattr(resumed, "find_resume", lambda run: None)
    monkeypatch.setattr(run_lock, "STALE_SECONDS", 0.5)
    _other_hosts_lock(out, 7)
    prepare(None, _args(tmp_path, out), Target("cpu", 1), lock=True)
    lock = run_lock.acquire(out, say=print)
    lock.release()
    captured = capsys.readouterr()
    assert captured.err.count("watching its heartbeat") == 1, captured.err
    assert "pid 4242 on host otherhost has not beaten for 0 s: its run is gone; taking the lock over" in captured.out


def test_check_on_a_live_runs_output_dir_describes_the_run_then_refuses(tmp_path, capsys):
    """R8: `check` on a live run's folder refused with exit 2 and printed nothing else; it describes the run (as it
    would start: the live run's checkpoints unread), then says the refusal."""
    from pretrain_cli import cli

    out = tmp_path / "out"
    live = run_lock.acquire(out)
    try:
        assert cli.main(["check", *_args(tmp_path, out)]) == 2
    finally:
        live.release()
    captured = capsys.readouterr()
    assert "model: llama from " in captured.out or "model: qwen2 from " in captured.out, captured.out
    assert "check: OK" not in captured.out
    err = captured.err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: output_dir: {out} is in use by another run (pid "), err
