"""A rank's watcher SIGKILLed mid-run under scripts/launch.sh (2 processes): the rank says once, in its workerlog,
that its watcher is gone and training goes on unwatched, and the run ends as it would have, exit 0
(`distributed.launcher.watchdog._gone`). Before, nothing said it, and the rank's output went into a pipe nobody read."""
import os
import signal

from launch_helpers import job_pids, rank_pid, write_config
from launched_jobs import launch_sh, read_log, wait_until


def _watcher_of(marker: str, rank: int) -> int | None:
    """The watcher of training rank `rank`: a fork of it (same command line and environment), whose parent it is."""
    parent = rank_pid(marker, rank)
    found = [pid for pid, (r, ppid, trains) in job_pids(marker).items() if r == rank and trains and ppid == parent]
    return found[0] if found else None


def test_a_killed_watcher_is_said_once_and_the_run_ends_0(corpus, tmp_path):
    out, logs = tmp_path / "out", tmp_path / "log"
    cfg = write_config(tmp_path / "cfg.json", corpus, out, max_steps=40, logging_steps=1, save_steps=1000)
    metrics = out / "metrics.jsonl"
    with launch_sh(cfg, tmp_path, NPROC="2", LOG_DIR=str(logs)) as job:
        wait_until([job], lambda: metrics.is_file() and metrics.read_text().count('"train"') >= 2, 240,
                   lambda: "no training step before the job ended", poll=0.05)
        victim = _watcher_of(job.marker, 1)
        assert victim is not None, job.pids()
        os.kill(victim, signal.SIGKILL)
        console, err = job.proc.communicate(timeout=240)
    log0, log1 = (read_log(logs / f"workerlog.{n}") for n in (0, 1))
    everything = f"{err[-3000:]}\n--- workerlog.0\n{log0[-3000:]}\n--- workerlog.1\n{log1[-3000:]}"
    assert job.proc.returncode == 0, everything  # a healthy run is not ended for its watcher
    warning = f"[pretrain-cli] rank 1: its watcher (pid {victim}) ended: killed by SIGKILL; training goes on unwatched"
    assert log1.count(warning) == 1, everything
    assert "global_step: 40," in log0, everything  # trained to its end
    for log in (log0, log1):
        assert "died" not in log and "Traceback" not in log, everything
