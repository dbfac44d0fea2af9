"""A usage error under scripts/launch.sh with 2 processes: the console says it once, on stderr, as one process does,
with no noise of Paddle's launcher, and exits 2 (`distributed.launcher.failure_report`). A typo'd key (which every rank
finds) could reach the console three times: rank 0's copy (on stdout), the launcher's tail of the failed rank's log
after `LAUNCH ERROR ... Container failed !!!`, and launch.sh's `rank 1 ended the job: ...`."""
import json
from pathlib import Path

import pytest

from launched_jobs import launch_sh


def _config(tmp_path, key, value):
    cfg = {"model_name_or_path": "micro-qwen2", "device": "cpu", "input_dir": "data", "output_dir": "out",
           "max_seq_length": 32, "per_device_train_batch_size": 2, "max_steps": 3, "do_train": True,
           "report_to": ["none"], key: value}
    (tmp_path / "cfg.json").write_text(json.dumps(cfg))


@pytest.mark.parametrize("key, value, line", [
    ("learnig_rate", 0.1, "error: cfg.json: unknown key `learnig_rate`; did you mean `learning_rate`?"),
    ("input_dir", "nodata", "error: input_dir: nodata: no token files"),
])
def test_a_usage_error_of_every_rank_is_one_line_on_the_console_and_exit_2(tmp_path, key, value, line):
    _config(tmp_path, key, value)
    with launch_sh(Path("cfg.json"), tmp_path, NPROC="2") as job:  # (killed with all it started, however it ends)
        out, err = job.proc.communicate(timeout=180)
    p, console = job.proc, out + err
    logs = [(tmp_path / "out" / "log" / f"workerlog.{n}").read_text() for n in (0, 1)]
    assert p.returncode == 2, console[-3000:]  # as one process exits
    assert console.count(line.removeprefix("error: ").split(";")[0]) == 1, console[-3000:]
    assert err.startswith(line) and err.count("\n") == 1, console[-3000:]  # stderr: that line alone, as one process
    assert "LAUNCH ERROR" not in console and "Container" not in console, console[-3000:]
    assert "ended the job" not in console and "Traceback" not in console, console[-3000:]
    assert all(line in log for log in logs), logs  # each rank's log keeps its own


def test_a_second_launch_says_its_own_usage_error_only(tmp_path):
    """Paddle appends to workerlog.N: the second launch into the same output_dir (its typo fixed, another made) said
    the first launch's error too. Only what this launch wrote is quoted (`distributed/launcher/rank_log.py`)."""
    errs = []
    for key in ("learnig_rate", "max_stepz"):
        _config(tmp_path, key, 1)
        with launch_sh(Path("cfg.json"), tmp_path, NPROC="2") as job:
            errs.append(job.proc.communicate(timeout=180)[1])
        assert job.proc.returncode == 2, errs[-1][-3000:]
    assert errs[1].startswith("error: cfg.json: unknown key `max_stepz`") and errs[1].count("\n") == 1, errs
    assert "learnig_rate" in (tmp_path / "out" / "log" / "workerlog.0").read_text()  # (the log holds both)
