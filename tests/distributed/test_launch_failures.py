"""A rank's failure under scripts/launch.sh (2 processes) is said once on the console, on stderr: which rank ended the
job and how (a SIGKILL with the kernel's OOM killer as its likely sender), its error line when it has one (a disk full
naming the file), and where its full log is; no `LAUNCH ERROR ... Container failed` report, no copy of a log's tail,
nothing of it on stdout (`distributed.launcher.failure_report`). Paddle's launcher named the lowest rank it saw stop
(`Container rank 0 status failed ... code -6` when rank 1 was killed), copied rank 0's last 3000 bytes again, and a
disk full reached the console three times (rank 0's `error:` line on stdout, the tail, launch.sh's line).

The faults come from tests/robustness/fault_inject (`PCLI_FAULT`, only in the rank `PCLI_FAULT_RANK`): SIGKILL as the
rank enters its 6th forward, as the OOM killer would end it mid-step; ENOSPC half-way through rank 0's optimizer file
of the first checkpoint. The others from a sitecustomize.py of this file's (`STUCK`, `CRASH`) on PYTHONPATH: ranks stuck
where their stop handler cannot run, killed by the launcher after STOP_TIMEOUT (said as its kill, not the OOM
killer's, and once); a rank's uncaught exception or SIGSEGV (the end of its traceback or stack quoted below launch.sh's
line)."""
from __future__ import annotations

import os
import re
import signal

import pytest

from launch_helpers import REPO, child_env, write_config
from launched_jobs import launch_sh, read_log, wait_until

FAULTS = REPO / "tests" / "robustness" / "fault_inject"
KILLED = ("killed by SIGKILL (often the kernel's OOM killer: see dmesg); the other ranks stop too. Re-run the same "
          "command (or launch with MAX_RESTART) to resume from {out}/checkpoint-3, the newest complete checkpoint.")


@pytest.mark.parametrize("fault, rank", [("forward:6", 1), ("forward:6", 0), ("enospc:1", 0)])
def test_a_ranks_failure_is_said_once_on_stderr_with_how_its_line_and_its_log(corpus, tmp_path, fault, rank):
    out, log_dir = tmp_path / "out", tmp_path / "log"
    # (without overwrite: the same command resumes from the newest checkpoint, which the advice names)
    cfg = write_config(tmp_path / "cfg.json", corpus, out, max_steps=12, save_steps=3, overwrite_output_dir=False)
    with launch_sh(cfg, tmp_path, NPROC="2", LOG_DIR=str(log_dir), PCLI_FAULT=fault, PCLI_FAULT_RANK=str(rank),
                   PYTHONPATH=f"{FAULTS}{os.pathsep}{child_env()['PYTHONPATH']}") as job:
        console, err = job.proc.communicate(timeout=300)
    logs = [read_log(log_dir / f"workerlog.{n}") for n in (0, 1)]
    everything = f"{err[-3000:]}\n--- stdout\n{console[-2000:]}\n--- workerlog.0\n{logs[0][-2000:]}"
    where = f" Its full log: {log_dir}/workerlog.{rank}"
    said = [x for x in err.splitlines() if x.startswith("launch.sh:")]
    if fault.startswith("forward"):
        assert job.proc.returncode == 137, everything  # the signal's code, as documented
        killed = re.escape(KILLED.format(out=out) + where)
        assert len(said) == 1 and re.fullmatch(rf"launch\.sh: rank {rank} ended the job: rank {rank} \(pid \d+ on "
                                               rf"\S+\) died: {killed}", said[0]), everything
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


STUCK = r'''
import os
import signal
import time
from pathlib import Path

if os.environ.get("PCLI_TEST_STUCK") and os.environ.get("PADDLE_TRAINER_ID"):
    from pretrain_cli.distributed.launcher import progress

    _mark = progress.mark

    def mark(phase, step):
        if phase == "data" and step == 3:  # stuck in a native call: its stop handler (Python's) never runs
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
            Path(os.environ["PCLI_TEST_STUCK"], f"stuck.{os.environ['PADDLE_TRAINER_ID']}").touch()
            time.sleep(600)
        return _mark(phase, step)

    progress.mark = mark
'''


def test_ranks_the_launcher_kills_after_stop_timeout_are_said_killed_by_it_not_by_the_oom_killer(corpus, tmp_path):
    """SIGTERM to launch.sh while both ranks are stuck where their stop handler cannot run: STOP_TIMEOUT (2 s) later
    the launcher says so and SIGKILLs them, and launch.sh's line names that kill, not `often the kernel's OOM killer`
    (the ranks never noted their stop, so their watchers' lines have no `into its stop`)."""
    (tmp_path / "inject").mkdir()
    (tmp_path / "inject" / "sitecustomize.py").write_text(STUCK)
    log_dir = tmp_path / "log"
    cfg = write_config(tmp_path / "cfg.json", corpus, tmp_path / "out", max_steps=40, save_steps=1000)
    with launch_sh(cfg, tmp_path, NPROC="2", LOG_DIR=str(log_dir), STOP_TIMEOUT="2", PCLI_TEST_STUCK=str(tmp_path),
                   PYTHONPATH=f"{tmp_path / 'inject'}{os.pathsep}{child_env()['PYTHONPATH']}") as job:
        wait_until([job], lambda: all((tmp_path / f"stuck.{r}").exists() for r in (0, 1)), 240,
                   lambda: read_log(log_dir / "workerlog.0")[-2000:])
        os.kill(job.proc.pid, signal.SIGTERM)
        _, err = job.proc.communicate(timeout=120)
    everything = f"{err[-3000:]}\n--- workerlog.0\n{read_log(log_dir / 'workerlog.0')[-2000:]}"
    assert "had not finished their stop 2 s after the signal (STOP_TIMEOUT); killing them" in err, everything
    said = [x for x in err.splitlines() if "killed by SIGKILL" in x]
    killed = r"killed by SIGKILL \(by the launcher, 2 s into the stop \(STOP_TIMEOUT\)\)\."
    assert len(said) == 1 and re.fullmatch(rf"launch\.sh: rank (\d) \(pid \d+ on \S+\) died: {killed} Its full log: "
                                           rf"{re.escape(str(log_dir))}/workerlog\.\1", said[0]), everything
    # said once: the launcher's line says the stop and what to do; no `ended the job`, no MAX_RESTART advice
    assert "OOM" not in err and "ended the job" not in err and "MAX_RESTART" not in err, everything


CRASH = r'''
import os

if os.environ.get("PADDLE_TRAINER_ID") == "1" and os.environ.get("PCLI_TEST_CRASH"):
    from pretrain_cli.distributed.launcher import progress

    _mark = progress.mark

    def mark(phase, step):
        if phase == "data" and step == 3:
            if os.environ["PCLI_TEST_CRASH"] == "segv":
                import ctypes

                ctypes.string_at(0)
            raise RuntimeError("injected bug: rank 1 crashed")
        return _mark(phase, step)

    progress.mark = mark
'''


@pytest.mark.parametrize("crash", ["exception", "segv"])
def test_a_crashed_rank_is_said_with_the_end_of_its_traceback_or_stack(corpus, tmp_path, crash):
    """An uncaught exception (a bug) or a fatal signal on rank 1: launch.sh's line, then the end of its Python
    traceback, or Python's fatal-error line and the crashed thread's innermost frames, from this launch's part of its
    log (a launch before it crashed the same way: not quoted again), at most 20 lines."""
    (tmp_path / "inject").mkdir()
    (tmp_path / "inject" / "sitecustomize.py").write_text(CRASH)
    log_dir = tmp_path / "log"
    cfg = write_config(tmp_path / "cfg.json", corpus, tmp_path / "out", max_steps=40, save_steps=1000)
    earlier = "Traceback (most recent call last):\nRuntimeError: an earlier launch's\nFatal Python error: Aborted\n"
    log_dir.mkdir()
    (log_dir / "workerlog.1").write_text(earlier)
    with launch_sh(cfg, tmp_path, NPROC="2", LOG_DIR=str(log_dir), PCLI_TEST_CRASH=crash[:4],
                   PYTHONPATH=f"{tmp_path / 'inject'}{os.pathsep}{child_env()['PYTHONPATH']}") as job:
        _, err = job.proc.communicate(timeout=300)
    said = err.strip().splitlines()
    everything = f"{err[-3000:]}\n--- workerlog.1\n{read_log(log_dir / 'workerlog.1')[-3000:]}"
    where = f" Its full log: {log_dir}/workerlog.1"
    assert 3 <= len(said) <= 21 and "earlier launch" not in err, everything
    if crash == "exception":
        assert job.proc.returncode == 1, everything
        bug = "RuntimeError: injected bug: rank 1 crashed"
        assert said[0] == f"launch.sh: rank 1 ended the job (exit 1): {bug}.{where}", everything
        # the quote: this launch's traceback, from its header to the exception (whatever stderr says after it)
        assert said[1] == "Traceback (most recent call last):" and bug in said[2:], everything
        quote = said[1:said.index(bug, 2) + 1]
        assert quote[-2].strip() == 'raise RuntimeError("injected bug: rank 1 crashed")', everything
        assert all(x.startswith("  ") for x in quote[1:-1]), everything  # (its frames only, in between)
    else:
        assert job.proc.returncode == 139, everything
        assert re.fullmatch(rf"launch\.sh: rank 1 ended the job: rank 1 \(pid \d+ on \S+\) died: killed by SIGSEGV; "
                            rf"the other ranks stop too\. .*{re.escape(where)}", said[0]), everything
        assert said[1] == "Fatal Python error: Segmentation fault", everything
        assert said[2].startswith("Current thread 0x"), everything
        assert "in string_at" in said[3] and "in mark" in said[4], everything  # (the innermost frames first)
