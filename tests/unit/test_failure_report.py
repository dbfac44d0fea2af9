"""Paddle's launcher under launch.sh (`failure_report.install`): its copy of the first rank's log onto stdout leaves out
the lines that say how the job ended (the CLI's `error:` lines, the rank watchers' verdicts), which launch.sh says once
on stderr; its failure report (`Container failed`, the log's tail) is held back, and given only when no rank recorded
its end; after a failure the first rank's log is copied on to its end (past `Container.logs`' 1000 lines a call, and
after the launcher's `Pod.stop` closed the log it copies from, which it does at every failure before `finalize`).
"""
import logging
import signal
import types

from paddle.distributed.launch.controllers.controller import ControllerBase
from paddle.distributed.launch.job.container import Container

from pretrain_cli.distributed.launcher import account, failure_report, job, verdict_line
from pretrain_cli.distributed.launcher.verdict import hung_cause
from pretrain_cli.distributed.launcher.watcher import Watcher

ERROR = "error: cfg.json: unknown key `learnig_rate`\n"
DIED = ("\n[pretrain-cli] rank 0: rank 1 (pid 7 on h) died: killed by SIGKILL; this rank stops too. See that rank's "
        "workerlog for its cause; re-run to resume from the newest complete checkpoint-N.\n")
FINALIZED = []  # the `exit` each call of Paddle's own finalize (as `install` leaves it) was given


def _installed(tmp_path, monkeypatch, said: str | None):
    """`install` as paddle_launch.py runs it under launch.sh (`said`: what `cause` finds the ranks recorded)."""
    for name in ("logs", "tail", "terminate", "start"):  # (restored after: install replaces them)
        monkeypatch.setattr(Container, name, getattr(Container, name))
    FINALIZED.clear()
    monkeypatch.setattr(ControllerBase, "finalize", lambda self, exit=True: FINALIZED.append(exit))
    monkeypatch.setattr(job, "verdict_dir", lambda: tmp_path)
    monkeypatch.setattr(job, "wait_for_watchers", lambda directory: None)
    monkeypatch.setattr(account, "cause", lambda directory, log_dir=None: said)
    monkeypatch.setattr(logging.getLogger("LAUNCH"), "filters", [])
    failure_report.install()


def _failure(tmp_path, monkeypatch, stopped: bool, said: str | None = "launch.sh: rank 1 ended the job: ..."):
    """Paddle's failure path on a first rank whose log holds 2500 lines, then the watcher's verdict, then the error:
    the watch loop's last copy (`Pod.logs`: 1000 lines), its `Container failed` record and tail, then, when
    `stopped`, `Pod.stop`'s terminate, then finalize; returns rank 0's Container."""
    log = tmp_path / "workerlog.0"
    log.write_text("".join(f"step {n}\n" for n in range(2500)) + DIED + ERROR)
    _installed(tmp_path, monkeypatch, said)
    rank0 = Container()
    rank0.outfile = str(log)
    rank0._log_handler, rank0._log_start_offset = open(log), 0  # as Container.start opens it: nothing read yet
    pod = types.SimpleNamespace(join=lambda: None, containers=[rank0])
    try:
        assert rank0.logs() is True  # the watch loop's copy: 1000 lines, onto stdout
        logging.getLogger("LAUNCH").error(f"Container failed !!!\n{rank0}")
        rank0.tail()
        if stopped:
            rank0.terminate()  # Pod.stop's: no process here (`_proc` None); the log it copies from is closed
            assert rank0._log_handler is None
        ControllerBase.finalize(types.SimpleNamespace(pod=pod), exit=False)
    finally:
        if rank0._log_handler is not None:
            rank0._log_handler.close()
    return rank0


def test_after_the_launcher_stopped_the_ranks_the_first_ranks_log_is_copied_on_without_the_ending(
        tmp_path, monkeypatch, capsys):
    _failure(tmp_path, monkeypatch, stopped=True)
    out, err = capsys.readouterr()
    assert out.count("\n") == 2500 and out.startswith("step 0\n") and out.endswith("step 2499\n"), out[-300:]
    assert "error:" not in out and "died" not in out  # launch.sh says it, once, on stderr
    assert "Container failed" not in out + err and "ERROR LOG" not in out + err
    assert FINALIZED == [False]  # Paddle's own finalize still runs after the copy, with its `exit`


def test_a_log_still_open_is_copied_on_past_1000_lines(tmp_path, monkeypatch, capsys):
    _failure(tmp_path, monkeypatch, stopped=False)
    out = capsys.readouterr().out
    assert out.count("\n") == 2500 and out.endswith("step 2499\n"), out[-300:]
    assert FINALIZED == [False]


def test_with_no_rank_record_the_launchers_report_and_tail_are_given(tmp_path, monkeypatch, capsys):
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logging.getLogger("LAUNCH").addHandler(handler)
    try:
        _failure(tmp_path, monkeypatch, stopped=True, said=None)
    finally:
        logging.getLogger("LAUNCH").removeHandler(handler)
    out = capsys.readouterr().out
    assert [r.getMessage().split(" !!!")[0] for r in records] == ["Container failed"]
    # rank 0's tail (its last 3000 bytes) is on stdout already: only the lines the copy left out follow, once
    assert out.endswith("step 2499\n" + DIED.lstrip("\n") + ERROR) and out.count(ERROR) == 1, out[-300:]
    assert out.count("step 2499\n") == 1 and out.count("\n") == 2502, out[-300:]


def test_the_ending_lines_are_the_watchers_verdicts_and_the_clis_errors(tmp_path):
    """`ENDING` matches what the rank watchers write at a death, a hang, a loss elsewhere (`verdict_line.line`), a
    departure (`departure.follow`), and the CLI's `error:` line; not a straggler's line or a training line."""
    w = Watcher(0, {0: 10, 1: 11}, "h", tmp_path, None, 1.0, remote={2: "other"})
    died = {"kind": "died", "ranks": [1], "statuses": [signal.SIGKILL]}
    lost = {"kind": "lost", "ranks": [0], "statuses": [signal.SIGABRT]}
    hung = hung_cause(1, {"phase": "collective", "step": 4}, 30.0)
    ending = [verdict_line.line(w, died), verdict_line.line(w, died, own=True), verdict_line.line(w, lost),
              verdict_line.line(w, hung), ERROR,
              "[pretrain-cli] rank 0: rank 1 (pid 11 on h) left with an error: out: missing; this rank stops too.\n"]
    for line in ending:
        assert failure_report.ENDING.match(line.strip("\n")), line
    kept = ["[pretrain-cli] rank 0: rank 1 (pid 11 on h) is a straggler: its own work per step takes 3.0x\n",
            "[2026-12-07 10:53:50,941] [    INFO] - loss: 6.25, global_step: 1\n",
            "[pretrain-cli] rank 1: its watcher (pid 9) ended: killed by SIGKILL; training goes on unwatched\n"]
    for line in kept:
        assert not failure_report.ENDING.match(line), line


def test_a_line_read_before_it_was_whole_is_judged_whole(capsys):
    console = failure_report._Console()
    for part in ("step 1\nerr", "or: out: no space\n", "\n", "[pretrain-cli] rank 0: rank 1 (pid 7 on h) di",
                 "ed: killed by SIGKILL\nstep 2\n\npartial"):
        console.write(part)
    console.flush()
    assert capsys.readouterr().out == "step 1\nstep 2\n\npartial"


def test_without_launch_sh_the_launchers_report_stands(monkeypatch):
    monkeypatch.setattr(job, "verdict_dir", lambda: None)
    tail = Container.tail
    failure_report.install()
    assert Container.tail is tail


def test_lines_end_at_newline_only_as_paddles_readline_ends_them(capsys):
    """`str.splitlines` also ends a line at \\x0c, \\u2028 and others: the text before one waited for the final flush,
    and a part after one that starts `error: ` was dropped."""
    console = failure_report._Console()
    for part in ("step 1 sample: foo\u2028bar\n", "step 2 page\x0cerror: not a line of its own\n", "step 3\n"):
        console.write(part)
        assert capsys.readouterr().out == part  # (each whole line at once, not at the flush)
    console.write("error: out: no space\n")
    console.flush()
    assert capsys.readouterr().out == ""


def test_blank_lines_at_the_end_are_kept_when_no_ending_line_follows(capsys):
    console = failure_report._Console()
    console.write("step 1\n\n\n")
    console.flush()
    assert capsys.readouterr().out == "step 1\n\n\n"


def test_each_ranks_log_start_is_left_for_launch_sh(tmp_path, monkeypatch):
    """`Container.start` notes how long the (appended) log was before this launch's rank wrote to it
    (`_log_start_offset`): `account.cause` quotes from there (`rank_log.since`)."""
    import os
    import sys

    from pretrain_cli.distributed.launcher import rank_log

    _installed(tmp_path, monkeypatch, said=None)
    log = tmp_path / "log" / "workerlog.0"
    log.parent.mkdir()
    log.write_text("error: the last launch's\n")
    rank = Container(entrypoint=[sys.executable, "-c", "print('error: this one')"],
                     env={"PADDLE_LOG_DIR": str(log.parent), "PATH": os.environ.get("PATH", "")})
    rank.outfile = rank.errfile = str(log)
    try:
        rank.start()
        assert rank.wait(60)
    finally:
        rank.terminate()
    assert (tmp_path / "start.workerlog.0").read_text() == str(len("error: the last launch's\n"))
    assert rank_log.since(tmp_path, log) == ["error: this one"]


def test_the_held_tail_of_another_rank_is_this_launchs_part_only(tmp_path, capsys):
    """Paddle's `Container.tail` clamps its 3000 bytes to `_log_start_offset`; the held one (no rank record) too: an
    earlier launch's lines are not printed as this one's."""
    log = tmp_path / "workerlog.1"
    log.write_text("an earlier launch's end\nthis launch\n")
    begin = len("an earlier launch's end\n")
    failure_report._tail(types.SimpleNamespace(_out=str(log), _log_start_offset=begin), 3000)
    assert capsys.readouterr().out == "this launch\n"
    failure_report._tail(types.SimpleNamespace(_out=str(log), _log_start_offset=0), 7)
    assert capsys.readouterr().out == "launch\n"  # (the last `length` bytes, as Paddle's)
