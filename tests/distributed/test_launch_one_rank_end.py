"""A job of one rank under scripts/launch.sh (NPROC=1) whose run FINISHED (`train: done at step 4`, its final model
written) and whose process then died by a signal at exit (here an atexit handler's SIGSEGV, as a native teardown's
crash would) is said finished: exit 0, one stderr line naming the crash at exit and that the run's output is
complete, no advice to re-run (it said `... died: killed by SIGSEGV. Re-run the same command ... to start again from
step 0`, exit 139, and MAX_RESTART trained the finished run again). A launched rank of several never meets that
teardown (`runtime.end_process`) and ends with 0; the lone rank's launcher reads the finish in its log
(`distributed.launcher.failure_report._record_alone`)."""
from __future__ import annotations

import os
import re

from launch_helpers import child_env, write_config
from launched_jobs import launch_sh

TEARDOWN = r'''
import os, atexit, signal
if os.environ.get("PCLI_TEST_TEARDOWN") and os.environ.get("PADDLE_TRAINER_ID"):
    atexit.register(lambda: os.kill(os.getpid(), signal.SIGSEGV))
'''


def test_a_lone_rank_crashing_at_exit_after_finishing_ends_the_job_with_0_said_finished(corpus, tmp_path):
    (tmp_path / "inject").mkdir()
    (tmp_path / "inject" / "sitecustomize.py").write_text(TEARDOWN)
    out, log_dir = tmp_path / "out", tmp_path / "log"
    cfg = write_config(tmp_path / "cfg.json", corpus, out, max_steps=4, save_steps=2)
    with launch_sh(cfg, tmp_path, NPROC="1", LOG_DIR=str(log_dir), PCLI_TEST_TEARDOWN="1", MAX_RESTART="1",
                   PYTHONPATH=f"{tmp_path / 'inject'}{os.pathsep}{child_env()['PYTHONPATH']}") as job:
        console, err = job.proc.communicate(timeout=300)
    everything = f"{err[-3000:]}\n--- stdout\n{console[-2000:]}"
    assert job.proc.returncode == 0, everything  # (was 139, then a restart)
    said = [x for x in err.splitlines() if x.startswith("launch.sh:")]
    assert len(said) == 1 and re.fullmatch(
        r"launch\.sh: rank 0 \(pid \d+ on \S+\) died: killed by SIGSEGV, at exit, after the run had finished \(train: "
        r"done at step 4; its final model is written\): the run's output is complete, nothing to re-run\. Its full "
        rf"log: {re.escape(str(log_dir))}/workerlog\.0", said[0]), everything
    assert "Fatal Python error: Segmentation fault" in err, everything  # the crash, named below the line
    assert "restart" not in err and "Re-run" not in err and "LAUNCH" not in console + err, everything
    assert (out / "config.json").is_file() and (out / "all_results.json").is_file(), everything
