"""What launch.sh quotes from a rank's workerlog.N (`rank_log`, through `account.cause`): this launch's part only, read from
its end (at most `WINDOW` bytes, as Paddle reads it: universal newlines, undecodable bytes replaced); an exception's
traceback for a rank that crashed or died with an exit code, a fatal signal's stack only for a signal that leaves one,
each ending where its own account ends, a chained exception's cause named."""
import json

from pretrain_cli.distributed.launcher import account, rank_log

BUG = ["Traceback (most recent call last):", '  File "/src/run.py", line 3, in <module>', "    main()",
       "RuntimeError: bug"]
SEGV = ["Fatal Python error: Segmentation fault", "", "Current thread 0x00007f2 (most recent call first):",
        '  File "/py/weakref.py", line 1 in __del__', "", "Extension modules: numpy (total: 1)"]
OLD = ["Traceback (most recent call last):", '  File "/src/old.py", line 1, in <module>', "ValueError: an older one"]


def _cause(tmp_path, log_lines, kind: str, code: int, line: str = "RuntimeError: bug") -> list[str]:
    (tmp_path / "workerlog.1").write_text("\n".join(log_lines) + "\n")
    (tmp_path / "rank-1.json").write_text(json.dumps({"rank": 1, "exit": code, "kind": kind, "local": "1",
                                                      "line": line, "time": 1.0}))
    return account.cause(tmp_path, tmp_path).splitlines()[1:]


def test_an_exception_whose_shutdown_then_crashed_is_its_traceback_not_the_stack(tmp_path):
    """The interpreter's exit after an uncaught exception segfaulted: the record says `crashed` (exit 1), the log's last
    account is the fatal-error stack; the console quotes the traceback."""
    assert _cause(tmp_path, ["step 1", *BUG, "", *SEGV], "crashed", 1) == BUG
    # and a signal's death quotes its stack, not a traceback logged after it
    died = "rank 1 (pid 7 on h) died: killed by SIGSEGV; the other ranks stop too."
    said = _cause(tmp_path, [*SEGV, "", *BUG], "died", 139, died)
    assert said[:2] == [SEGV[0], SEGV[2]] and "RuntimeError: bug" not in said, said


def test_a_signal_that_leaves_no_stack_quotes_nothing(tmp_path):
    """SIGTERM, SIGHUP, SIGPIPE, SIGXCPU: no fatal-error stack of their own, so an older traceback of the same launch
    is not quoted as theirs; SIGABRT (134) and SIGBUS (135) leave one."""
    for code in (129, 141, 143, 152):
        died = f"rank 1 (pid 7 on h) died: killed by signal {code - 128}; the other ranks stop too."
        assert _cause(tmp_path, ["step 1", *BUG, "", *SEGV], "died", code, died) == [], code
    for code in (134, 135):
        assert _cause(tmp_path, ["terminate called", *SEGV], "died", code, "died")[:2] == ["terminate called", SEGV[0]]


def test_a_rank_that_died_with_an_exit_code_before_the_clis_handler_is_its_traceback(tmp_path):
    """An ImportError in run_pretrain.py: no record of the CLI's own, its watcher's `died: exited with code 1`."""
    died = "rank 1 (pid 7 on h) died: exited with code 1; the other ranks stop too."
    imp = ["Traceback (most recent call last):", '  File "run_pretrain.py", line 9, in <module>', "    import x",
           "ModuleNotFoundError: No module named 'x'"]
    assert _cause(tmp_path, ["[INFO] start", *imp, "", f"[pretrain-cli] {died}"], "died", 1, died) == imp


def test_a_traceback_ends_at_its_exception_not_at_the_lines_after_it(tmp_path):
    """Lines the rank (its other threads, the launcher's abort) wrote after the exception do not push it out."""
    after = [f"gloo abort line {n}" for n in range(30)]
    assert rank_log.crash(["x", *BUG, "", *after]) == BUG


def test_a_chained_exception_names_the_earlier_one(tmp_path):
    chained = [*OLD, "", "During handling of the above exception, another exception occurred:", "", *BUG]
    assert rank_log.crash(chained) == ["(raised while handling: ValueError: an older one)", *BUG]
    cause = [*OLD, "", "The above exception was the direct cause of the following exception:", "", *BUG]
    assert rank_log.crash(cause)[0] == "(the direct cause: ValueError: an older one)"
    long = [BUG[0]] + [f'  File "/src/m{n}.py", line {n}, in f{n}' for n in range(30)] + [BUG[-1]]
    said = rank_log.crash([*OLD, "", "During handling of the above exception, another exception occurred:", "", *long])
    assert len(said) == rank_log.LIMIT and said[:2] == ["(raised while handling: ValueError: an older one)", BUG[0]]
    assert said[2] == "  … (14 lines more in its full log)" and said[-1] == BUG[-1], said


def test_an_exception_groups_traceback_is_quoted_whole(tmp_path):
    group = ["  + Exception Group Traceback (most recent call last):", '  |   File "/src/run.py", line 3, in <module>',
             "  | ExceptionGroup: two (2 sub-exceptions)", "  +-+---------------- 1 ----------------",
             "    | ValueError: one", "    +------------------------------------"]
    assert rank_log.crash(["step 1", *group, "[pretrain-cli] rank 1 (pid 7 on h) died: ..."]) == group


def test_a_fatal_error_without_a_stack_is_its_lines_to_the_first_blank(tmp_path):
    fatal = ["Fatal Python error: _enter_buffered_busy: could not acquire lock", "Python runtime state: finalizing"]
    assert rank_log.crash(["step 1", *fatal, "", "later"], fatal=True) == fatal
    assert rank_log.crash(["step 1", *BUG], fatal=True) == []  # (an exception is not a signal's account)


def test_bytes_not_utf8_and_a_lone_carriage_return_are_read_as_paddle_reads_them(tmp_path):
    log = tmp_path / "workerlog.0"
    log.write_bytes(b"step 1\r\nbar \xff\xfe\rerror: a\n")
    assert rank_log.since(tmp_path, log) == ["step 1", "bar \ufffd\ufffd", "error: a"]


def test_a_start_mark_past_the_logs_end_reads_it_from_its_beginning(tmp_path):
    """A log cut or rotated since its rank started: its lines are all this launch's, not none."""
    log = tmp_path / "workerlog.0"
    log.write_text("error: cut\n")
    rank_log.mark(tmp_path, log, 5000)
    assert rank_log.since(tmp_path, log) == ["error: cut"]
    rank_log.mark(tmp_path, log, 6)
    assert rank_log.since(tmp_path, log) == [" cut"]


def test_a_long_log_is_read_from_its_end_only(tmp_path):
    """At most `WINDOW` bytes: a 100 MB log was read and split whole at each failure."""
    log = tmp_path / "workerlog.0"
    with open(log, "w") as f:
        f.write("error: early\n")
        for n in range(3 * rank_log.WINDOW // 20):
            f.write(f"step {n:>9} xxxx\n")  # (20 bytes a line)
        f.write("error: late\n")
    said = rank_log.since(tmp_path, log)
    assert said[-1] == "error: late" and "error: early" not in said
    assert rank_log.WINDOW // 20 - 2 <= len(said) <= rank_log.WINDOW // 20 + 1, len(said)
    assert said[0].startswith("step ") and len(said[0]) == 19, said[0]  # (the part of a line the window cut: left out)


def test_error_lines_are_bounded_saying_how_many_more(tmp_path):
    lines = [f"error: cfg.json: problem {n}" for n in range(30)]
    said = rank_log.errors(iter(lines + lines), "cfg.json: problem 0")
    assert said == lines[:rank_log.LIMIT] + ["… (10 more error: lines in its full log)"]
    assert rank_log.errors(iter(lines), "not in the log") == ["error: not in the log"]
