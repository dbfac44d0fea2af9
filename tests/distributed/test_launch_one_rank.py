"""A job of one rank under scripts/launch.sh (NPROC=1, its default) whose rank is SIGKILLed is said as a rank of
several is (tests/distributed/test_launch_failures.py): one line on stderr naming the rank, its signal with the OOM
killer as its likely sender, where the same command resumes and its full log; exit 137. Such a job has no rank
watcher to record the death, and the console held only Paddle's `LAUNCH ERROR ... Container failed` lines, exit 247:
the launcher now records it (`distributed.launcher.failure_report._record_alone`). The kill is tests/robustness/
fault_inject's `forward:6`: SIGKILL as the rank enters its 6th forward, as the OOM killer would end it mid-step."""
from __future__ import annotations

import os
import re

from launch_helpers import REPO, child_env, write_config
from launched_jobs import launch_sh

FAULTS = REPO / "tests" / "robustness" / "fault_inject"


def test_a_lone_ranks_sigkill_is_said_once_on_stderr_and_exits_137(corpus, tmp_path):
    out, log_dir = tmp_path / "out", tmp_path / "log"
    # (without overwrite: the same command resumes from the newest checkpoint, which the advice names)
    cfg = write_config(tmp_path / "cfg.json", corpus, out, max_steps=12, save_steps=3, overwrite_output_dir=False)
    with launch_sh(cfg, tmp_path, NPROC="1", LOG_DIR=str(log_dir), PCLI_FAULT="forward:6", PCLI_FAULT_RANK="0",
                   PYTHONPATH=f"{FAULTS}{os.pathsep}{child_env()['PYTHONPATH']}") as job:
        console, err = job.proc.communicate(timeout=300)
    everything = f"{err[-3000:]}\n--- stdout\n{console[-2000:]}"
    assert job.proc.returncode == 137, everything  # the signal's code, as documented (Paddle's launcher: 247)
    said = [x for x in err.splitlines() if x.startswith("launch.sh:")]
    killed = re.escape(f"killed by SIGKILL (often the kernel's OOM killer: see dmesg). Re-run the same command (or "
                       f"launch with MAX_RESTART) to resume from {out}/checkpoint-3, the newest complete checkpoint. "
                       f"Its full log: {log_dir}/workerlog.0")
    assert len(said) == 1 and re.fullmatch(rf"launch\.sh: rank 0 ended the job: rank 0 \(pid \d+ on \S+\) died: "
                                           rf"{killed}", said[0]), everything
    assert err.strip() == said[0], everything  # nothing else on stderr: no Paddle report
    assert "LAUNCH" not in console + err and "Container" not in console + err, everything
    assert (console + err).count("killed by SIGKILL") == 1 and "global_step: 5," in console, everything
