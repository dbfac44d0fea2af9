"""A user error raised on one rank only, mid-run, under scripts/launch.sh: the job ends with that rank's one line and
code, the other rank names no death, and rank 0 releases the run lock (`training.rank_exit.ALONE`,
`distributed.launcher.departure`).

The error and the race are injected in the fresh ranks by a sitecustomize.py on PYTHONPATH: rank 1 raises a
`UserError` as it enters step 3 (rank 0 then waits for it in that step's gradient all-reduce), and rank 0 takes 1 s
longer to release its lock, as a rank slower to leave does. Before, rank 1 stopped its own watcher and left, and rank
0's watcher took its exit for a death: `rank 1 (...) died: exited with code 2` in workerlog.0, rank 0 SIGKILLed before
its `finally`, `run.lock` left in output_dir."""
from __future__ import annotations

from launch_helpers import child_env, write_config
from launched_jobs import default_hangup, launch_sh, read_log

INJECT = r'''
import os
import time

if os.environ.get("PADDLE_TRAINER_ID") == "1":
    from pretrain_cli.distributed.launcher import progress
    from pretrain_cli.errors import UserError

    _mark = progress.mark

    def mark(phase, step):
        if phase == "data" and step == 3:
            raise UserError("rank 1: injected: a file only this rank reads is missing; put it back and re-run")
        return _mark(phase, step)

    progress.mark = mark
elif os.environ.get("PADDLE_TRAINER_ID") == "0":
    from pretrain_cli.training import run_lock

    _release = run_lock.RunLock.release

    def release(self):
        time.sleep(1.0)  # slower to leave than rank 1
        return _release(self)

    run_lock.RunLock.release = release
'''

ERROR = "rank 1: injected: a file only this rank reads is missing; put it back and re-run"


def test_a_user_error_on_one_rank_ends_the_job_with_its_line_and_code_and_no_lock(corpus, tmp_path):
    (tmp_path / "inject").mkdir()
    (tmp_path / "inject" / "sitecustomize.py").write_text(INJECT)
    out, logs = tmp_path / "out", tmp_path / "log"
    cfg = write_config(tmp_path / "cfg.json", corpus, out, max_steps=40, logging_steps=1, save_steps=1000)
    path = f"{tmp_path / 'inject'}:{child_env()['PYTHONPATH']}"
    with launch_sh(cfg, tmp_path, NPROC="2", LOG_DIR=str(logs), PYTHONPATH=path, preexec_fn=default_hangup) as job:
        _, err = job.proc.communicate(timeout=300)
    log0, log1 = read_log(logs / "workerlog.0"), read_log(logs / "workerlog.1")
    everything = f"{err[-3000:]}\n--- workerlog.0\n{log0[-3000:]}\n--- workerlog.1\n{log1[-3000:]}"
    assert job.proc.returncode == 2, everything  # rank 1's own code: a usage error, not restarted
    assert log1.count(f"error: {ERROR}") == 1, everything
    assert f"launch.sh: rank 1 ended the job: {ERROR}" in err, everything
    assert f"left with an error: {ERROR}; this rank stops too." in log0, everything  # rank 0 says why it ends
    for log in (log0, log1):
        assert "died" not in log and "Traceback" not in log and "FatalError" not in log, everything
    assert not (out / "run.lock").exists(), everything  # rank 0 ended through its `finally`
