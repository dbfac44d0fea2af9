"""A node's only rank under launch.sh, which has no watcher, is named by its launcher (`failure_report._record_alone`)
as a watcher names a rank of several, in the two cases the first version of that record missed:

- it FINISHED (`train: done at step N`, its final model written) and then died by a signal at exit (an atexit
  handler's SIGSEGV, a native teardown's crash): it was said `died: killed by SIGSEGV. Re-run the same command ... to
  start again from step 0`, exit 139, retried under MAX_RESTART: a finished run trained again. A launched rank of
  several skips that teardown (`runtime.end_process`) and ends with 0; the lone rank's job now ends with 0 too, the
  crash said as one at exit after the run finished, its output complete, nothing to re-run;
- it was SIGKILLed during its own stop (its signal, then a save that outlasted the kill): it was said `killed by
  SIGKILL (often the kernel's OOM killer: see dmesg)`; a watcher says how far into the stop, saving which checkpoint,
  whose limit (`verdict_line.died`, now the one death line of both, from the rank's notes `watchdog.stop_began`
  leaves in launch.sh's verdict directory when it has no watcher)."""
import logging
import re
import socket
import time
import types
from pathlib import Path

import pytest

from pretrain_cli.distributed.launcher import account, failure_report, job, progress, rank_log, stopping, watchdog
from pretrain_cli.training import closing

HOST = socket.gethostname()


def _rank(code: int, log=None, pid: int = 4321):
    """Paddle's Container as the launcher leaves it after the rank ended: `_proc._proc` its Popen, `_out` its log."""
    popen = types.SimpleNamespace(returncode=code, pid=pid)
    return types.SimpleNamespace(_proc=types.SimpleNamespace(_proc=popen), _out=None if log is None else str(log),
                                 env={"PADDLE_TRAINER_ID": "0", "PADDLE_LOCAL_RANK": "0"})


def _logged(message: str) -> str:
    """`message` as the rank's log writes it (`training.metrics.setup_logging`'s format)."""
    record = logging.LogRecord("pretrain_cli", logging.INFO, __file__, 1, message, None, None)
    return logging.Formatter("[%(asctime)s] [%(levelname)8s] - %(message)s").format(record)


STACK = ["Fatal Python error: Segmentation fault", "", "Current thread 0x00007f (most recent call first):",
         '  File "/site/sitecustomize.py", line 4 in <lambda>', "", "Extension modules: numpy (total: 1)"]


def test_a_lone_rank_dying_at_exit_after_finishing_is_said_finished_exit_0_not_retried(tmp_path, monkeypatch):
    monkeypatch.setattr(job, "verdict_dir", lambda: tmp_path)
    out, logs = tmp_path / "out", tmp_path / "log"
    (out / "checkpoint-4").mkdir(parents=True)
    logs.mkdir()
    done = closing.finished(out, 4, "float32")
    (logs / "workerlog.0").write_text("\n".join([_logged("step 4/4"), _logged(done), *STACK]) + "\n")
    failure_report._record_alone([_rank(-11, logs / "workerlog.0")])
    assert job.decide(tmp_path, 245) == (0, "stop")  # (was 139, "retry": MAX_RESTART trained it again)
    said = account.cause(tmp_path, logs, (str(out), True, None))
    assert said.splitlines()[0] == (
        f"launch.sh: rank 0 (pid 4321 on {HOST}) died: killed by SIGSEGV, at exit, after the run had finished (train: "
        f"done at step 4; its final model is written): the run's output is complete, nothing to re-run. Its full log: "
        f"{logs}/workerlog.0"), said
    assert "Re-run" not in said and "step 0" not in said
    assert "Fatal Python error: Segmentation fault" in said.splitlines()[1:], said  # the crash at exit, its stack


def test_only_this_launchs_finish_counts(tmp_path, monkeypatch):
    """A finished line of an earlier launch in the same workerlog (Paddle appends) says nothing of this one."""
    monkeypatch.setattr(job, "verdict_dir", lambda: tmp_path)
    log = tmp_path / "workerlog.0"
    earlier = _logged(closing.already_complete(tmp_path / "out", 4)) + "\n"
    log.write_text(earlier + _logged("step 2/8") + "\n")
    rank_log.mark(tmp_path, log, len(earlier.encode()))
    failure_report._record_alone([_rank(-11, log)])
    assert job.decide(tmp_path, 245) == (139, "retry")
    assert "Re-run the same command" in account.cause(tmp_path)


@pytest.mark.parametrize("line", [closing.finished("/o", 12, "bfloat16"), closing.already_complete("/o", 12)])
def test_the_finished_mark_is_the_training_runs_own_last_line(line):
    """`FINISHED` is written here apart from `training.closing` (distributed may not import training): tied so."""
    assert failure_report.FINISHED.search(_logged(line))
    assert not failure_report.FINISHED.search(_logged("saved checkpoint-12; train: done at step"))
    assert not failure_report.FINISHED.search(line)  # (a line of the rank's own log only, not any text)


def test_a_lone_ranks_sigkill_during_its_stop_is_named_as_its_stops_limit(tmp_path, monkeypatch):
    monkeypatch.setattr(job, "verdict_dir", lambda: tmp_path)
    monkeypatch.setenv(stopping.LIMIT_ENV, "900")  # (launch.sh's STOP_TIMEOUT, default)
    monkeypatch.setattr(stopping, "_BEGAN", [])
    monkeypatch.setattr(watchdog, "_ALONE", None, raising=False)
    watchdog.start(types.SimpleNamespace(world_size=1, rank=0))  # (no watcher: its notes in the verdict directory)
    try:
        progress.mark("data", 6)
        progress.mark("save", 6)  # the stop's save of step 6, stalled
        watchdog.stop_began(clock=lambda: time.time() - 12)
        failure_report._record_alone([_rank(-9)])
    finally:
        progress.close_record()
    assert job.decide(tmp_path, 247) == (137, "retry")
    said = account.cause(tmp_path, tmp_path / "log", (str(tmp_path / "out"), False, None))
    assert re.fullmatch(
        rf"launch\.sh: rank 0 ended the job: rank 0 \(pid 4321 on {re.escape(HOST)}\) died: killed by SIGKILL, "
        r"1\d s into its stop after a signal, while saving checkpoint-6: most likely the launcher kills the ranks "
        r"STOP_TIMEOUT=900 s after its signal \(scripts/launch\.sh\); that checkpoint is lost \(a re-run resumes from "
        r"the newest complete one\), give a stop more time with STOP_TIMEOUT \(and the scheduler's grace period "
        r"before its SIGKILL\)\. Re-run the same command \(or launch with MAX_RESTART\) to start from step 0 \(\S+ "
        r"holds no complete checkpoint\)\. Its full log: \S+/log/workerlog\.0", said), said
    assert "OOM" not in said


def test_a_lone_rank_not_under_launch_sh_leaves_no_notes(tmp_path, monkeypatch):
    monkeypatch.setattr(job, "verdict_dir", lambda: None)
    monkeypatch.setattr(stopping, "_BEGAN", [])
    monkeypatch.setattr(watchdog, "_ALONE", None, raising=False)
    watchdog.start(types.SimpleNamespace(world_size=1, rank=0))
    watchdog.stop_began()
    assert progress._CURRENT is None and watchdog._ALONE is None and list(tmp_path.iterdir()) == []


def test_the_finished_mark_is_anchored_to_the_loggers_prefix():
    """FINISHED was searched anywhere in a line: a warning, or an INFO line quoting another run's end, counted as
    this run's (review of 7a4d7529, item 6)."""
    done = closing.finished(Path("out"), 4, "float32")
    warned = logging.Formatter("[%(asctime)s] [%(levelname)8s] - %(message)s").format(
        logging.LogRecord("pretrain_cli", logging.WARNING, __file__, 1, done, None, None))
    assert not failure_report.FINISHED.match(warned)
    assert not failure_report.FINISHED.match(_logged(f"an earlier run said {_logged(done)}"))
    assert failure_report.FINISHED.match(_logged(done))


def test_a_finished_ranks_line_has_no_stop_clause(tmp_path, monkeypatch):
    """SIGKILLed at exit long after a stop began that followed the finish: the record was the watcher's line with its
    stop clause ('905 s into its stop ... that checkpoint is lost ...') and then 'after the run had finished ...:
    nothing to re-run'. A finished record's death is the bare 'died: <status>'."""
    monkeypatch.setattr(job, "verdict_dir", lambda: tmp_path)
    monkeypatch.setenv(stopping.LIMIT_ENV, "900")
    monkeypatch.setattr(stopping, "_BEGAN", [])
    monkeypatch.setattr(watchdog, "_ALONE", None, raising=False)
    out, logs = tmp_path / "out", tmp_path / "log"
    out.mkdir()
    logs.mkdir()
    watchdog.start(types.SimpleNamespace(world_size=1, rank=0))
    try:
        progress.mark("save", 4)
        (logs / "workerlog.0").write_text(_logged(closing.finished(out, 4, "float32")) + "\n")
        watchdog.stop()
        watchdog.stop_began(clock=lambda: time.time() - 905)
        failure_report._record_alone([_rank(-9, logs / "workerlog.0")])
    finally:
        progress.close_record()
    assert job.decide(tmp_path, 247) == (0, "stop")
    said = account.cause(tmp_path, logs, (str(out), False, None))
    assert f"rank 0 (pid 4321 on {HOST}) died: killed by SIGKILL, at exit, after the run had finished (train: done at " \
           "step 4; its final model is written): the run's output is complete, nothing to re-run" in said, said
    assert "into its stop" not in said and "lost" not in said
