"""The launcher's copy of rank 0 onto stdout under launch.sh leaves out a fatal crash: with the default
`hang_timeout` a rank stopped mid-run is named after gloo's own 30 s timeout aborts the rank waiting for it, and that
rank's ~60 lines (gloo's `terminate called ... gloo::TimeoutException`, Python's `Fatal Python error: Aborted` with
every thread's stack, Paddle's C++ traceback and FatalError) reached the console before launch.sh's one line. They
stay in the workerlog (the watcher passes them there: no death was seen when rank 0 wrote them)."""
import pytest

from pretrain_cli.distributed.launcher import failure_report

ABORT = """terminate called after throwing an instance of 'gloo::TimeoutException'
  what():  [/paddle/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 30000ms for recv
Fatal Python error: Aborted

Thread 0x00007f5d7effd640 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 331 in wait

Current thread 0x00007f5e0a3c4740 (most recent call first):
  File "/work/src/pretrain_cli/training/step.py", line 88 in run


--------------------------------------
C++ Traceback (most recent call last):
--------------------------------------
0   paddle::distributed::ProcessGroupGloo::AllReduce(...)

----------------------
Error Message Summary:
----------------------
FatalError: `Process abort signal` is detected by the operating system.
  [TimeInfo: *** Aborted at 1765100000 (unix time) try "date -d @1765100000" if you are using GNU date ***]
"""
VERDICT = ("\n[pretrain-cli] rank 0: rank 1 (pid 7 on h) made no progress for 31 s while in forward/backward at step "
           "20; this rank stops too. See that rank's workerlog for its cause.\n")


def test_a_crash_after_the_ranks_own_lines_stays_off_the_console(capsys):
    console = failure_report._Console()
    for part in ("step 19: loss 2.5\nstep 20: ", "loss 2.4\n", ABORT[:100], ABORT[100:], VERDICT):
        console.write(part)
    console.flush()
    assert capsys.readouterr().out == "step 19: loss 2.5\nstep 20: loss 2.4\n"
    assert console.dropped[-1].startswith("[pretrain-cli] rank 0: rank 1") and "FatalError" in "".join(console.dropped)


# gloo's 30 s timeout raised in a Python collective (rank 0 waiting in the evaluation's all_reduce for a stopped rank 1),
# as workerlog.0 held it: its 47 lines reached the console, all but the exception line, which alone matched
TIMEOUT = """Traceback (most recent call last):
  File "/work/main/scripts/run_pretrain.py", line 16, in <module>
    raise SystemExit(main(["train", *sys.argv[1:]], prog=f"python {sys.argv[0]}"))
                     ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
  File "/work/main/src/pretrain_cli/training/trainer.py", line 340, in evaluate
    total, count = self.comm.sum(total) / copies, self.comm.sum(count) / copies
  File "/work/main/src/pretrain_cli/distributed/comms/comm.py", line 74, in _reduce
    dist.all_reduce(t, op=op)
  File "/work/.venv/lib/python3.11/site-packages/paddle/distributed/communication/stream/all_reduce.py", line 51, in _all
    task = group.process_group.all_reduce(tensor, op_type, sync_op)
           ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
RuntimeError: [/paddle/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:80] TIMEOUT self_rank = none pair_rank = -1
"""


def test_gloos_timeout_raised_as_a_python_traceback_stays_off_the_console(capsys):
    console = failure_report._Console()
    for part in ("[2026-12-07 20:04:30,938] [    INFO] - loss: 6.08, global_step: 6\n", TIMEOUT[:300], TIMEOUT[300:],
                 VERDICT):
        console.write(part)
    console.flush()
    assert capsys.readouterr().out == "[2026-12-07 20:04:30,938] [    INFO] - loss: 6.08, global_step: 6\n"
    assert console.dropped[0].startswith("Traceback") and console.dropped[-2].startswith("RuntimeError")


def _console(monkeypatch, tmp_path, record=None):
    """The console under launch.sh's verdict directory `tmp_path`, with rank 0's `record` there if any."""
    import json

    monkeypatch.setenv("PRETRAIN_CLI_VERDICTS", str(tmp_path))
    if record is not None:
        (tmp_path / "rank-0.json").write_text(json.dumps(record))
    return failure_report._Console()


@pytest.mark.parametrize("said", ["[2026-12-07 18:00:00,123] [   ERROR] - the tracker failed; training goes on "
                                  "without it\n", ""])
def test_a_python_traceback_the_rank_goes_on_from_stays_on_the_console_and_a_mention_of_gloo_is_kept(
        capsys, monkeypatch, tmp_path, said):
    """`logger.exception` of a failure the run goes on from (a tracker's): its traceback and exception line are the
    rank's own (the exception line was left out, and the cause with it when the rank then hung)."""
    console = _console(monkeypatch, tmp_path)
    logged = ("step 2: reading /data/gloo_corpus/part-0\n"
              + said +  # (logged by logger.exception, or printed bare by traceback.print_exc)
              "Traceback (most recent call last):\n  File \"x.py\", line 1\n    post()\nConnectionError: refused\n"
              "step 3: reading /data/gloo_corpus/part-1\n"
              "[2026-12-07 18:00:01,456] [    INFO] - loss: 6.25, global_step: 4\n")
    for part in (logged[:150], logged[150:], VERDICT):
        console.write(part)
    console.flush()
    assert capsys.readouterr().out == logged
    assert console.dropped == [VERDICT.strip() + "\n"]


def test_a_debug_traceback_and_a_dying_threads_stay_on_the_console(capsys, monkeypatch, tmp_path):
    """`--debug` prints a usage error's traceback before its `error:` line (said by launch.sh: left out); a dying
    thread's `Exception in thread` line was left dangling, its traceback dropped."""
    console = _console(monkeypatch, tmp_path, {"rank": 0, "kind": "usage", "local": "0", "exit": 2})
    debug = ("Traceback (most recent call last):\n  File \"cli.py\", line 9, in _main\n"
             "pretrain_cli.errors.UserError: max_steps: must be > 0\n")
    thread = ("Exception in thread Thread-3 (upload):\nTraceback (most recent call last):\n  File \"t.py\", line 2\n"
              "OSError: [Errno 28] No space left on device\n")
    console.write(thread + "[2026-12-07 18:00:01,456] [    INFO] - loss: 6.25, global_step: 4\n" + debug +
                  "error: max_steps: must be > 0\n")
    console.flush()
    assert capsys.readouterr().out == thread + "[2026-12-07 18:00:01,456] [    INFO] - loss: 6.25, global_step: 4\n" + \
        debug
    assert console.dropped == ["error: max_steps: must be > 0\n"]


def test_gloos_timeout_in_a_thread_and_an_uncaught_errors_traceback_stay_off_the_console(capsys, monkeypatch, tmp_path):
    """gloo's timeout raised in a thread is left out with its `Exception in thread` line; an uncaught error's
    traceback, which launch.sh's account quotes (rank 0 recorded `crashed`), too, with what follows until the rank's
    next logged line (its chained part)."""
    console = _console(monkeypatch, tmp_path)
    console.write("step 1\nException in thread Thread-2 (save):\n" + TIMEOUT + "step 2\n")
    console.flush()
    assert capsys.readouterr().out == "step 1\n"
    assert console.dropped[0].startswith("Exception in thread") and console.dropped[-1] == "step 2\n"
    console = _console(monkeypatch, tmp_path, {"rank": 0, "kind": "crashed", "local": "0", "exit": 1})
    bug = ("Traceback (most recent call last):\n  File \"x.py\", line 1\nKeyError: 'a'\n\n"
           "The above exception was the direct cause of the following exception:\n\n"
           "Traceback (most recent call last):\n  File \"x.py\", line 3\nValueError: bug\n")
    console.write("step 1\n" + bug)
    console.flush()
    assert capsys.readouterr().out == "step 1\n" and console.dropped[-1] == "ValueError: bug\n"


def test_an_exception_groups_traceback_is_judged_whole(capsys, monkeypatch, tmp_path):
    group = ("  + Exception Group Traceback (most recent call last):\n  |   File \"x.py\", line 1\n"
             "  | ExceptionGroup: two (2 sub-exceptions)\n  +-+---------------- 1 ----------------\n"
             "    | Traceback (most recent call last):\n    | {}\n    +------------------------------------\n")
    console = _console(monkeypatch, tmp_path)
    own = group.format("ValueError: one")
    console.write(own + "step 2\n" + group.format(TIMEOUT.strip().splitlines()[-1]) + "step 3\n")
    console.flush()
    assert capsys.readouterr().out == own + "step 2\n"
    assert console.dropped[-1] == "step 3\n" and "TIMEOUT" in "".join(console.dropped)


def test_a_crash_the_rank_survives_ends_at_its_next_logged_line(capsys):
    """A Paddle error caught and logged (its C++ traceback and summary) is a crash's text, but the rank goes on: its
    next line of its own log (`[date time] [LEVEL]`) and those after it are on the console again (they were all left
    out for the rest of the run)."""
    console = failure_report._Console()
    paddle_error = ("C++ Traceback (most recent call last):\n0   paddle::memory::Alloc\n"
                    "Error Message Summary:\nResourceExhaustedError: Out of memory\n")
    after = ("[2026-12-07 18:00:00,123] [ WARNING] - retrying the step with a smaller micro-batch\n"
             "[2026-12-07 18:00:01,456] [    INFO] - loss: 2.4, global_step: 21\n")
    console.write(paddle_error + after + "  [enforce fail at gloo/x.cc:3] after the last log line\n")
    console.flush()
    assert capsys.readouterr().out == after
    assert "".join(console.dropped).startswith(paddle_error) and "enforce fail" in console.dropped[-1]


def test_one_list_of_a_crash_s_lines_for_the_console_and_the_watchers():
    """The watchers' `before_abort` and the console judge a crash's line by `rank_log.crash_line` (two lists of
    different members were kept: `Fatal Python error` ended a survivor's output for the console only)."""
    from pretrain_cli.distributed.launcher import rank_log, watcher

    out = b"step 7: loss 2.5\nFatal Python error: Aborted\n\nThread 0x1 (most recent call first):\n"
    assert watcher.before_abort(out) == b"step 7: loss 2.5\n"
    assert watcher.before_abort(b"step 7: loss 2.5\n" + TIMEOUT.encode()) == b"step 7: loss 2.5\n"
    assert rank_log.crash_line(rank_log.TRACEBACK) and rank_log.crash_line(rank_log.GROUP)  # (one list: the console's)
    for line in ABORT.splitlines():
        if line.strip() and not line.startswith((" ", "-", "Thread", "Current", "0 ")):
            assert rank_log.crash_line(line), line
    assert not rank_log.crash_line("step 3: reading /data/gloo_corpus/part-1")
