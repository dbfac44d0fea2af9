"""A rank's failure under scripts/launch.sh (2 processes) is said once on the console, on stderr: which rank ended the
job and how (a SIGKILL with the kernel's OOM killer as its likely sender), its error line when it has one (a disk full
naming the file), and where its full log is; no `LAUNCH ERROR ... Container failed` report, no copy of a log's tail,
nothing of it on stdout (`distributed.launcher.failure_report`). Paddle's launcher named the lowest rank it saw stop
(`Container rank 0 status failed ... code -6` when rank 1 was killed), copied rank 0's last 3000 bytes again, and a
disk full reached the console three times (rank 0's `error:` line on stdout, the tail, launch.sh's line).

The faults come from tests/robustness/fault_inject (`PCLI_FAULT`, only in the rank `PCLI_FAULT_RANK`): SIGKILL as the
rank enters its 6th forward, as the OOM killer would end it mid-step; ENOSPC half-way through rank 0's optimizer file
of the first checkpoint."""
from __future__ import annotations

import os
import re

import pytest

from launch_helpers import REPO, child_env, write_config
from launched_jobs import launch_sh, read_log

FAULTS = REPO / "tests" / "robustness" / "fault_inject"
KILLED = ("killed by SIGKILL (often the kernel's OOM killer: see dmesg); the other ranks stop too. Re-run the same "
          "command (or launch with MAX_RESTART) to resume from the newest complete checkpoint-N.")


@pytest.mark.parametrize("fault, rank", [("forward:6", 1), ("forward:6", 0), ("enospc:1", 0)])
def test_a_ranks_failure_is_said_once_on_stderr_with_how_its_line_and_its_log(corpus, tmp_path, fault, rank):
    out, log_dir = tmp_path / "out", tmp_path / "log"
    cfg = write_config(tmp_path / "cfg.json", corpus, out, max_steps=12, save_steps=3)
    with launch_sh(cfg, tmp_path, NPROC="2", LOG_DIR=str(log_dir), PCLI_FAULT=fault, PCLI_FAULT_RANK=str(rank),
                   PYTHONPATH=f"{FAULTS}{os.pathsep}{child_env()['PYTHONPATH']}") as job:
        console, err = job.proc.communicate(timeout=300)
    logs = [read_log(log_dir / f"workerlog.{n}") for n in (0, 1)]
    everything = f"{err[-3000:]}\n--- stdout\n{console[-2000:]}\n--- workerlog.0\n{logs[0][-2000:]}"
    where = f" Its full log: {log_dir}/workerlog.{rank}"
    said = [x for x in err.splitlines() if x.startswith("launch.sh:")]
    if fault.startswith("forward"):
        assert job.proc.returncode == 137, everything  # the signal's code, as documented
        assert len(said) == 1 and re.fullmatch(rf"launch\.sh: rank {rank} ended the job: rank {rank} \(pid \d+ on "
                                               rf"\S+\) died: {re.escape(KILLED + where)}", said[0]), everything
        assert (console + err).count("killed by SIGKILL") == 1, everything
    else:
        assert job.proc.returncode == 1, everything
        full = (f"{out}/checkpoint-3.tmp/optimizer-00001-of-00002.safetensors: No space left on device; free disk "
                f"space (or point output_dir elsewhere) and re-run the same command; training resumes from the last "
                f"complete checkpoint")
        assert said == [f"launch.sh: rank 0 ended the job (exit 1): {full}.{where}"], everything
        assert (console + err).count("No space left on device") == 1 and f"error: {full}" in logs[0], everything
    assert err.strip() == said[0], everything  # nothing else on stderr: no Paddle report
    assert "LAUNCH" not in console + err and "Container" not in console + err, everything
    assert "[pretrain-cli]" not in console and "error:" not in console, everything  # stdout: the run's lines only
    assert "global_step: 2," in console, everything
