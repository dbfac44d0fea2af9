"""A `train` rerun in the directory of a killed run takes its lock over (`run_lock.unfinished`: where that run ended).
That line is context, not news: printed as it was taken, a rerun that then stopped on a user error said two things,
the note first. `training.run` holds it: an error before the run gets going carries it in its one line; a run that
gets past its checks logs it as a note."""
import json
import socket
import subprocess
import sys

import pytest
from data_helpers import write_tokens

from pretrain_cli import cli, runtime
from pretrain_cli.errors import UserError
from pretrain_cli.training import run as run_mod
from pretrain_cli.planning import hardware
from pretrain_cli.training import run_lock, startup

DAMAGED = "resume_from_checkpoint: out/checkpoint-5: model.safetensors was altered; resume from another checkpoint"


@pytest.fixture
def killed(tmp_path, monkeypatch):
    """(argument file, output_dir, the lock left) of a run on this host whose process is gone, 7 steps logged."""
    monkeypatch.delenv("PRETRAIN_CLI_RESTART", raising=False)
    monkeypatch.setattr(runtime, "setup_env", lambda **k: None)  # (the suite's process keeps its threads)
    out = tmp_path / "out"
    out.mkdir()
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    holder = {"host": socket.gethostname(), "pid": int(gone.stdout), "start_ticks": None,
              "started": "2026-01-01 00:00:00", "beat": 3, "ranks": 1}
    (out / run_lock.LOCK_FILE).write_text(json.dumps(holder))
    (out / "metrics.jsonl").write_text(json.dumps({"kind": "train", "step": 7}) + "\n")
    path = tmp_path / "args.json"
    path.write_text(json.dumps({"model_name_or_path": "micro-llama", "input_dir": write_tokens(tmp_path / "data"),
                                "output_dir": str(out), "do_train": True, "max_steps": 10, "max_seq_length": 16,
                                "split": "1,1,1", "per_device_train_batch_size": 1, "save_steps": 5}))
    return path, out, holder


def _note(out, holder) -> str:
    return (f"the previous run in {out} (pid {holder['pid']}, started {holder['started']}) did not finish: last step "
            f"logged 7 (metrics.jsonl), last checkpoint none; it was killed (SIGKILL; the kernel's out-of-memory "
            f"killer: see `dmesg`; a scheduler's limit: see its log) or crashed without a word of its own")


def test_a_user_error_before_the_run_gets_going_is_one_line_carrying_the_note(killed, monkeypatch, capsys):
    path, out, holder = killed

    def damaged(spec, signals, told):
        raise UserError(DAMAGED)

    monkeypatch.setattr(run_mod, "_run", damaged)
    assert cli.main(["train", str(path)]) == 2
    captured = capsys.readouterr()
    assert captured.err.splitlines() == [f"error: {DAMAGED} — for context, {_note(out, holder)}"]
    assert "did not finish" not in captured.out
    assert not (out / run_lock.LOCK_FILE).exists()  # taken over, then released by the run's end


def test_a_run_past_its_checks_logs_the_note_and_a_later_error_is_its_own(killed, monkeypatch, capsys):
    """The real `_run` up to its first step: the note is logged (INFO) once output_dir is open; an error after that
    (here one raised where the start-up time is recorded) is one line without it."""
    path, out, holder = killed

    def fails(*a, **k):
        raise UserError("report_to: the tracker refused the run")

    monkeypatch.setattr(startup, "report", fails)
    assert cli.main(["train", str(path)]) == 2
    captured = capsys.readouterr()
    assert captured.err.splitlines() == ["error: report_to: the tracker refused the run"]
    logged = [line for line in captured.out.splitlines() if "did not finish" in line]
    assert len(logged) == 1 and logged[0].endswith(f"[    INFO] - note: {_note(out, holder)}"), logged


def test_a_crash_before_the_run_gets_going_prints_the_note_above_its_traceback(killed, monkeypatch, capsys):
    path, out, holder = killed

    def crashes(spec, signals, told):
        raise RuntimeError("a bug")

    monkeypatch.setattr(run_mod, "_run", crashes)
    with pytest.raises(RuntimeError, match="a bug"):
        cli.main(["train", str(path)])
    assert capsys.readouterr().err.splitlines() == [f"note: {_note(out, holder)}"]


def test_out_of_memory_building_the_model_is_one_line_carrying_the_note(killed, monkeypatch, capsys):
    """Not a `UserError` when it leaves `run`: `commands.train` writes its out-of-memory line, the note at its end."""
    path, out, holder = killed
    monkeypatch.setattr(hardware, "cpu_memory_gib", lambda: 2000.0)
    monkeypatch.setattr(hardware, "host_available_gib", lambda *a, **k: (2000.0, "MemAvailable"))

    def out_of_memory(*a, **k):
        raise MemoryError("(ResourceExhausted) Fail to alloc memory of 8589934592 size")

    monkeypatch.setattr(run_mod, "build_model", out_of_memory)
    assert cli.main(["train", str(path)]) == 1
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("error: out of memory before the first step (building the run)"), err
    assert err[0].endswith(f" — for context, {_note(out, holder)}") and err[0].count("did not finish") == 1, err
