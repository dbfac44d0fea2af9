"""A rank's watcher SIGKILLed mid-run under scripts/launch.sh (2 processes): the rank says once, in its workerlog,
that its watcher is gone and training goes on unwatched, and the run ends as it would have, exit 0
(`distributed.launcher.watchdog._gone`); its output goes to its workerlog directly from then on, not into a pipe
nobody reads.

Rank 1 is held as it enters step 3 until the test has killed its watcher (a sitecustomize.py on PYTHONPATH, as in
test_rank_error_end): the kill lands mid-run however fast the machine runs the 40 steps."""
import os
import signal

from launch_helpers import child_env, watcher_pid, write_config
from launched_jobs import launch_sh, read_log, wait_until

INJECT = r'''
import os
import time
from pathlib import Path

if os.environ.get("PADDLE_TRAINER_ID") == "1":
    from pretrain_cli.distributed.launcher import progress

    _mark, _hold = progress.mark, Path(os.environ["PCLI_TEST_HOLD"])

    def mark(phase, step):
        if phase == "data" and step == 3 and not (_hold / "go").exists():  # steps 1 and 2 done: held here
            (_hold / "held").write_text("")
            while not (_hold / "go").exists():
                time.sleep(0.01)
        return _mark(phase, step)

    progress.mark = mark
'''


def test_a_killed_watcher_is_said_once_and_the_run_ends_0(corpus, tmp_path):
    hold = tmp_path / "inject"
    hold.mkdir()
    (hold / "sitecustomize.py").write_text(INJECT)
    out, logs = tmp_path / "out", tmp_path / "log"
    cfg = write_config(tmp_path / "cfg.json", corpus, out, max_steps=40, logging_steps=1, save_steps=1000)
    path = f"{hold}:{child_env()['PYTHONPATH']}"
    with launch_sh(cfg, tmp_path, NPROC="2", LOG_DIR=str(logs), PYTHONPATH=path, PCLI_TEST_HOLD=str(hold)) as job:
        wait_until([job], (hold / "held").exists, 240, lambda: "rank 1 never reached step 3", poll=0.05)
        victim = watcher_pid(job.marker, 1)
        assert victim is not None, job.pids()
        os.kill(victim, signal.SIGKILL)
        (hold / "go").write_text("")
        console, err = job.proc.communicate(timeout=240)
    log0, log1 = (read_log(logs / f"workerlog.{n}") for n in (0, 1))
    everything = f"{err[-3000:]}\n--- workerlog.0\n{log0[-3000:]}\n--- workerlog.1\n{log1[-3000:]}"
    assert job.proc.returncode == 0, everything  # a healthy run is not ended for its watcher
    warning = f"[pretrain-cli] rank 1: its watcher (pid {victim}) ended: killed by SIGKILL; training goes on unwatched"
    assert log1.count(warning) == 1, everything
    assert "global_step: 2," in log0 and "global_step: 40," in log0, everything  # killed mid-run; trained to its end
    for log in (log0, log1):
        assert "died" not in log and "Traceback" not in log, everything
