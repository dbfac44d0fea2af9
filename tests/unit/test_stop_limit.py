"""A stop under Paddle's launcher run directly (`python -m paddle.distributed.launch`, the README's 8-GPU and 2-node
lines): at its SIGTERM it gives the ranks 30 s (`pod.stop(timeout=30)`), then SIGKILLs them, mid-save. Nothing in a
rank can lengthen that, but a rank knows its limit (`stopping.rank_limit`), notes when its stop began
(`watchdog.stop_began`, from `training.stop_signals`), says before the save when this run's last save took longer than the
stop has left (`stopping.short`), and its watcher names a SIGKILL during the stop as the launcher's limit, with how to
give a stop longer (`stopping.killed`). Before, the kill read `rank 0 (pid P on H) died: killed by SIGKILL` like any
death, and nothing said why the checkpoint was lost."""
import json
import logging
import os
import re
import signal
import subprocess
import sys
import time
import types

import pytest

from pretrain_cli.distributed.launcher import progress, stopping
from pretrain_cli.training.stop_signals import StopSignals

RANK = r"""
import os, sys, time
from pathlib import Path
from pretrain_cli.distributed.launcher import progress, stopping, watchdog, watcher
shared, verdicts = Path(sys.argv[1]), Path(sys.argv[2])
progress.open_record(shared / "progress.0")
progress.mark("data", 40)
progress.mark("save", 40)  # the stop's save of step 40
watchdog._spawn(watcher.Watcher(0, {0: os.getpid()}, "node1", shared, verdicts, grace=5.0, hang_timeout=0))
watchdog.stop_began(clock=lambda: time.time() - 31)  # (its signal 31 s ago: the launcher's SIGKILL is now)
print("saving", flush=True)
time.sleep(60)
"""


def _killed_in_stop(tmp_path, env) -> tuple[str, dict]:
    shared, verdicts = tmp_path / "shared", tmp_path / "verdicts"
    shared.mkdir()
    verdicts.mkdir()
    e = {k: v for k, v in os.environ.items() if k not in (stopping.LIMIT_ENV, "PADDLE_TRAINER_ID")}
    p = subprocess.Popen([sys.executable, "-c", RANK, str(shared), str(verdicts)], env={**e, **env},
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert p.stdout.readline() == "saving\n"
        os.kill(p.pid, signal.SIGKILL)  # the launcher's, at its limit
        out = p.stdout.read()  # until the watcher, which holds the log, is done
    finally:
        p.kill()
        p.wait()
    return out, json.loads((verdicts / "rank-0.json").read_text())


def test_a_rank_killed_by_paddles_launcher_mid_stop_is_said_to_be_its_30_s_limit(tmp_path):
    out, record = _killed_in_stop(tmp_path, {"PADDLE_TRAINER_ID": "0"})
    lines = [x for x in out.splitlines() if "killed by SIGKILL" in x]
    assert len(lines) == 1 and re.sub(r"(pid \d+|\d+ s into)", "_", lines[0]) == (  # (seconds: 31 and a load's more)
        "[pretrain-cli] rank 0 (_ on node1) died: killed by SIGKILL, _ its stop after a signal, while saving "
        "checkpoint-40: most likely Paddle's launcher, run directly (python -m paddle.distributed.launch), kills the "
        "ranks 30 s after its signal; that checkpoint is lost (a re-run resumes from the newest complete one), launch "
        "with scripts/launch.sh, which gives a stop STOP_TIMEOUT s (default 900), and give the scheduler's grace period "
        "as long; the other ranks stop too. Re-run the same command (or launch with MAX_RESTART) to resume from the "
        "newest complete checkpoint of output_dir, if any."), out  # (no output_dir given: rerun.resumes)
    assert record["exit"] == 137 and record["kind"] == "died"


def test_under_launch_sh_the_kill_names_stop_timeout(tmp_path):
    out, _ = _killed_in_stop(tmp_path, {"PADDLE_TRAINER_ID": "0", stopping.LIMIT_ENV: "20"})
    assert (" s into its stop after a signal, while saving checkpoint-40: most likely the launcher kills the ranks "
            "STOP_TIMEOUT=20 s after its signal (scripts/launch.sh); that checkpoint is lost (a re-run resumes from the "
            "newest complete one), give a stop more time with STOP_TIMEOUT (and the scheduler's grace period before "
            "its SIGKILL)") in out, out


def test_each_launch_forms_limit():
    assert stopping.rank_limit({"PADDLE_TRAINER_ID": "3"}) == (30, "paddle")  # Paddle's launcher run directly
    assert stopping.rank_limit({"PADDLE_TRAINER_ID": "3", stopping.LIMIT_ENV: "900"}) == (900, "STOP_TIMEOUT")
    assert stopping.rank_limit({"PADDLE_TRAINER_ID": "3", stopping.LIMIT_ENV: "0"}) == (None, "STOP_TIMEOUT")
    assert stopping.rank_limit({}) == (None, "")  # not launched: `pretrain-cli train`


@pytest.mark.parametrize("last_save, said", [(48.0, True), (20.0, False), (None, False)])
def test_the_stop_says_first_when_the_last_save_outlasts_the_time_left(monkeypatch, caplog, last_save, said):
    monkeypatch.setenv("PADDLE_TRAINER_ID", "0")
    monkeypatch.delenv(stopping.LIMIT_ENV, raising=False)
    monkeypatch.setattr(stopping, "_BEGAN", [1000.0])  # its signal 5 s ago: 25 s left
    monkeypatch.setattr(stopping, "time", types.SimpleNamespace(time=lambda: 1005.0, monotonic=time.monotonic))
    monkeypatch.setattr(progress, "last_save", lambda: last_save)
    stops = StopSignals()
    try:
        with caplog.at_level(logging.INFO, logger="pretrain_cli"):
            stops.hold(40)
            stops.hold(40)  # (the loop holds again as it ends: said once)
    finally:
        stops.restore()
        for s in (signal.SIGTERM, signal.SIGINT):
            signal.signal(s, signal.default_int_handler if s == signal.SIGINT else signal.SIG_DFL)
    lines = [r.getMessage() for r in caplog.records if "last save" in r.getMessage()]
    assert lines == ([
        "stopping: this run's last save took 48 s, more than the 25 s this stop has left before Paddle's launcher, run "
        "directly (python -m paddle.distributed.launch), kills the ranks 30 s after its signal: the save of step 40 "
        "will likely be cut off and its checkpoint lost (a re-run resumes from the newest complete one); launch with "
        "scripts/launch.sh, which gives a stop STOP_TIMEOUT s (default 900), and give the scheduler's grace period as "
        "long"] if said else [])


def test_a_rank_measures_its_saves(tmp_path, monkeypatch):
    record = progress.Record(tmp_path / "progress.0")
    clock = iter([100.0, 100.5, 148.5, 149.0])
    monkeypatch.setattr(progress.time, "time", lambda: next(clock))
    record.mark("data", 9)
    record.mark("save", 9)
    assert record.saved is None
    record.mark("data", 10)  # the save took 48 s
    assert record.saved == 48.0
    record.mark("forward/backward", 10)
    assert record.saved == 48.0
    record.close()
