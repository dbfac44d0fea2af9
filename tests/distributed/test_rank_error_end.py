"""A user error raised on one rank only, mid-run, under scripts/launch.sh: the job ends with that rank's one line and
code, the other rank names no death, and no run lock is left (`training.rank_exit.End.ALONE`,
`distributed.launcher.departure`).

The error and the race are injected in the fresh ranks by a sitecustomize.py on PYTHONPATH: the failing rank raises a
`UserError` as it enters step 3 (the other then waits for it in that step's gradient all-reduce, where gloo aborts it
once the failing rank has gone), and rank 0, when it survives, takes 1 s longer to release its lock, as a rank slower
to leave does. Before, the failing rank stopped its own watcher and left, and the other rank's watcher took its exit for
a death: `rank 1 (...) died: exited with code 2` in workerlog.0, rank 0 SIGKILLed before its `finally`, `run.lock` left
in output_dir."""
from __future__ import annotations

import pytest

from launch_helpers import child_env, write_config
from launched_jobs import default_hangup, launch_sh, read_log

INJECT = r'''
import os
import time

if os.environ.get("PADDLE_TRAINER_ID") == os.environ.get("PCLI_TEST_FAILING"):
    from pretrain_cli.distributed.launcher import progress
    from pretrain_cli.errors import UserError

    _mark = progress.mark

    def mark(phase, step):
        if phase == "data" and step == 3:
            raise UserError(f"rank {os.environ['PADDLE_TRAINER_ID']}: injected: a file only this rank reads is missing; "
                            f"put it back and re-run")
        return _mark(phase, step)

    progress.mark = mark
elif os.environ.get("PADDLE_TRAINER_ID") == "0":  # rank 0 survives rank 1's error
    from pretrain_cli.training import run_lock

    _release = run_lock.RunLock.release

    def release(self):
        time.sleep(1.0)  # slower to leave than rank 1
        return _release(self)

    run_lock.RunLock.release = release
'''

ERROR = "rank {}: injected: a file only this rank reads is missing; put it back and re-run"


@pytest.mark.parametrize("failing", [1, 0])
def test_a_user_error_on_one_rank_ends_the_job_with_its_line_and_code_and_no_lock(corpus, tmp_path, failing):
    """`failing`: the rank whose error it is (rank 0: it leaves first and releases its lock itself; the other rank,
    waiting for it in the step, ends without naming a death)."""
    (tmp_path / "inject").mkdir()
    (tmp_path / "inject" / "sitecustomize.py").write_text(INJECT)
    out, log_dir = tmp_path / "out", tmp_path / "log"
    cfg = write_config(tmp_path / "cfg.json", corpus, out, max_steps=40, logging_steps=1, save_steps=1000)
    path = f"{tmp_path / 'inject'}:{child_env()['PYTHONPATH']}"
    with launch_sh(cfg, tmp_path, NPROC="2", LOG_DIR=str(log_dir), PYTHONPATH=path, PCLI_TEST_FAILING=str(failing),
                   preexec_fn=default_hangup) as job:
        console, err = job.proc.communicate(timeout=300)
    logs = [read_log(log_dir / f"workerlog.{n}") for n in (0, 1)]
    everything = f"{err[-3000:]}\n--- workerlog.0\n{logs[0][-3000:]}\n--- workerlog.1\n{logs[1][-3000:]}"
    error, other = ERROR.format(failing), logs[1 - failing]
    assert job.proc.returncode == 2, everything  # the failing rank's own code: a usage error, not restarted
    assert logs[failing].count(f"error: {error}") == 1, everything
    # said once on the console, on stderr, naming the rank, its code and its log (not in rank 0's copy on stdout)
    said = f"launch.sh: rank {failing} ended the job (exit 2): {error}. Its full log: {log_dir}/workerlog.{failing}"
    assert (console + err).count(error) == 1 and said in err.splitlines(), everything
    assert "LAUNCH ERROR" not in err and "Container" not in console + err, everything
    assert f"rank {1 - failing}: rank {failing} (pid" in other, everything  # the other rank says why it ends
    assert f"left with an error: {error}; this rank stops too." in other, everything
    for log in logs:
        assert "died" not in log and "Traceback" not in log and "FatalError" not in log, everything
    assert not (out / "run.lock").exists(), everything  # rank 0 ended through its `finally`
