"""A rank stopped (`kill -STOP`) or killed (kill -9) while its background writer (`async_save`) writes its part of a
checkpoint: every log and the console name the rank, the phase its training thread was in (or its death), and the
checkpoint its background write left unfinished, unpublished, with the one a re-run resumes from instead.

Before, the line said only `made no progress for 10 s while in forward/backward at step 7` (or `died: killed by
SIGKILL`): the training thread's phase, true, but a user reading it took checkpoint-6, whose `checkpoint-6: stalled
0.014 s (async)` line was in the log, for saved, and found the re-run resuming from checkpoint-3.

Rank 1's background write of checkpoint-6 is held in its first file (`PCLI_FAULT=save_stall:3`, only in rank 1:
tests/robustness/fault_inject; a stalled file system) and the rank stopped or killed once it says so: its training
thread goes on meanwhile, so the signal finds it in a step, not in a save."""
import os
import re
import signal

import pytest

from launch_helpers import REPO, child_env, rank_pid, write_config
from launched_jobs import launch_sh

FAULTS = REPO / "tests" / "robustness" / "fault_inject"


@pytest.mark.parametrize("how", [signal.SIGSTOP, signal.SIGKILL], ids=["stopped", "killed"])
def test_a_rank_stopped_during_its_background_write_is_named_with_the_checkpoint_lost(corpus, tmp_path, how):
    out = tmp_path / "out"
    cfg = write_config(tmp_path / "cfg.json", corpus, out, max_steps=400, save_steps=3, async_save=True,
                       hang_timeout=10, overwrite_output_dir=False)
    log_dir = tmp_path / "log"
    with launch_sh(cfg, tmp_path, NPROC="2", LOG_DIR=str(log_dir), PCLI_FAULT="save_stall:3", PCLI_FAULT_RANK="1",
                   PYTHONPATH=f"{FAULTS}{os.pathsep}{child_env()['PYTHONPATH']}") as job:
        job.wait_for(log_dir / "workerlog.1", "save_stall: writing ", seconds=240, poll=0.02)
        victim = rank_pid(job.marker, 1)
        os.kill(victim, how)
        _, err = job.proc.communicate(timeout=240)
    logs = [(log_dir / f"workerlog.{n}").read_text(errors="replace") for n in (0, 1)]
    code = 124 if how == signal.SIGSTOP else 128 + signal.SIGKILL
    assert job.proc.returncode == code, f"{err[-3000:]}\n{logs[0][-2000:]}\n{logs[1][-2000:]}"
    assert (out / "checkpoint-3").is_dir() and not (out / "checkpoint-6").exists()
    what = (r"made no progress for \d+ s while in (data|forward/backward|collective|save) at step \d+"
            if how == signal.SIGSTOP else r"died: killed by SIGKILL[^,;]*")
    named = re.compile(rf"rank 1 \(pid {victim} on \S+\) {what}, with its background write of checkpoint-6 "
                       r"unfinished: checkpoint-6 was not saved; .*resume from \S*checkpoint-3, the newest complete "
                       r"checkpoint")
    for n, log in enumerate(logs):
        assert len(named.findall(log)) == 1, f"workerlog.{n}: {log[-3000:]}"
    assert named.search(err) and "launch.sh: rank 1 ended the job" in err, err[-3000:]
