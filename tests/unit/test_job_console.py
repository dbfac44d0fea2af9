"""launch.sh's account of why the job ended (`account.cause`, printed on stderr): which rank ended it and how, its line,
where its full log is; a usage error every rank of the node found, as one process says it (its `error:` lines); what
it quotes from the rank's log is this launch's part only (`rank_log`). Paddle's launcher no longer says it (its report
held back, the lines left out of its copy of rank 0), so this is the one place the console says it."""
import json

from pretrain_cli.distributed.launcher import account, job, rank_log

TYPO = "cfg.json: unknown key `learnig_rate`; did you mean `learning_rate`?"


def _verdicts(tmp_path, *records):
    tmp_path.mkdir(parents=True, exist_ok=True)
    for r in records:
        (tmp_path / f"rank-{r['rank']}.json").write_text(json.dumps(r))
    return tmp_path


def test_a_usage_error_every_rank_found_is_said_as_one_process_says_it(tmp_path):
    d = _verdicts(tmp_path, {"rank": 1, "exit": 2, "kind": "usage", "line": TYPO, "time": 1.0, "local": "1"},
                  {"rank": 0, "exit": 2, "kind": "usage", "line": TYPO, "time": 1.1, "local": "0"})
    assert account.cause(d) == f"error: {TYPO}"
    assert job.decide(d, 2) == (2, "stop")
    # every problem the rank's check found (the record holds the first), from its log, once each
    logs = tmp_path / "log"
    logs.mkdir()
    (logs / "workerlog.1").write_text(f"[INFO] arguments\nerror: {TYPO}\nerror: cfg.json: `max_steps` -3: not > 0\n")
    assert account.cause(d, logs) == f"error: {TYPO}\nerror: cfg.json: `max_steps` -3: not > 0"


def test_a_usage_error_of_one_rank_names_the_rank_its_code_and_its_log(tmp_path):
    left = f"[pretrain-cli] rank 0: rank 1 (pid 7 on h) left with an error: {TYPO}; this rank stops too."
    d = _verdicts(tmp_path, {"rank": 1, "exit": 2, "kind": "usage", "line": TYPO, "time": 1.0, "local": "1"},
                  {"rank": 0, "exit": 1, "kind": "peer", "line": left, "time": 1.1, "local": "0"})
    assert account.cause(d, "out/log") == (f"launch.sh: rank 1 ended the job (exit 2): {TYPO} Its full log: "
                                       f"out/log/workerlog.1")  # (its question mark ends it: no full stop added)
    assert account.cause(tmp_path / "none") is None  # no record: nothing to say
    # two ranks with different usage errors: not one error every rank found; the first to end is named, with its line
    two = _verdicts(tmp_path / "two", {"rank": 1, "exit": 2, "kind": "usage", "line": TYPO, "time": 1.0, "local": "1"},
                    {"rank": 0, "exit": 2, "kind": "usage", "line": "out: not writable", "time": 1.1, "local": "0"})
    assert account.cause(two) == f"launch.sh: rank 1 ended the job (exit 2): {TYPO}"


def test_a_usage_error_found_before_the_ranks_joined_is_said_as_one_process_says_it(tmp_path, monkeypatch):
    """A usage error found before the rank began joining (`job.record`'s `before_join`: a run-wide check, made before
    any watcher runs) is one account whichever way the race of the other ranks went: no record of theirs (the
    launcher's SIGTERM came first), or the "joining" record a rank leaves as it enters the join when the launcher
    kills it there. Found after the join by one rank, it still names that rank."""
    monkeypatch.setenv(job.VERDICTS_ENV, str(tmp_path / "v"))
    (tmp_path / "v").mkdir()
    monkeypatch.setattr(job, "_joining", [False])
    job.record(0, 2, "usage", TYPO)
    assert json.loads((tmp_path / "v" / "rank-0.json").read_text())["before_join"] is True
    assert account.cause(tmp_path / "v") == f"error: {TYPO}"  # rank 1 recorded nothing
    job.record(1, 75, "joining", "rank 1 (pid 8 on h) was still joining the process group")
    assert account.cause(tmp_path / "v") == f"error: {TYPO}"  # rank 1 was killed inside the join
    monkeypatch.setattr(job, "_joining", [True])  # (this rank's join began: a usage error from here on is its own)
    job.record(0, 2, "usage", TYPO)
    assert "before_join" not in json.loads((tmp_path / "v" / "rank-0.json").read_text())
    assert account.cause(tmp_path / "v") == f"launch.sh: rank 0 ended the job (exit 2): {TYPO}"


def test_a_rank_killed_by_sigkill_is_said_with_the_oom_killer_and_its_log(tmp_path):
    died = ("[pretrain-cli] rank 1 (pid 7 on h) died: killed by SIGKILL; the other ranks stop too. Re-run the same "
            "command (or launch with MAX_RESTART) to resume from the newest complete checkpoint-N.")
    d = _verdicts(tmp_path, {"rank": 1, "exit": 137, "kind": "died", "line": died, "time": 1.0, "local": "1"},
                  {"rank": 0, "exit": 1, "kind": "peer", "line": "rank 0: rank 1 (pid 7 on h) died", "time": 1.1,
                   "local": "0"})
    assert account.cause(d, "out/log") == (
        "launch.sh: rank 1 ended the job: rank 1 (pid 7 on h) died: killed by SIGKILL (often the kernel's OOM killer: "
        "see dmesg); the other ranks stop too. Re-run the same command (or launch with MAX_RESTART) to resume from the "
        "newest complete checkpoint-N. Its full log: out/log/workerlog.1")
    # killed by a stop's limit: the line says whose, not the OOM killer
    stop = "rank 1 (pid 7 on h) died: killed by SIGKILL, 900 s into its stop after a signal, while saving checkpoint-4"
    _verdicts(tmp_path, {"rank": 1, "exit": 137, "kind": "died", "line": stop, "time": 1.0, "local": "1"})
    assert "OOM" not in account.cause(d)


def test_a_disk_full_on_rank_0_is_its_error_line_with_the_code(tmp_path):
    full = ("out/checkpoint-3.tmp/optimizer-00001-of-00002.safetensors: No space left on device; free disk space (or "
            "point output_dir elsewhere) and re-run the same command; training resumes from the last complete "
            "checkpoint")
    d = _verdicts(tmp_path, {"rank": 0, "exit": 1, "kind": "system", "line": full, "time": 1.0, "local": "0"},
                  {"rank": 1, "exit": 1, "kind": "peer", "line": "rank 1: rank 0 died", "time": 1.1, "local": "1"})
    assert account.cause(d, "out/log") == (f"launch.sh: rank 0 ended the job (exit 1): {full}. Its full log: "
                                       f"out/log/workerlog.0")


def test_records_name_the_ranks_place_on_its_node(tmp_path, monkeypatch):
    monkeypatch.setenv("PADDLE_LOCAL_RANK", "0")
    job.record(3, 2, "usage", TYPO, directory=tmp_path)
    assert json.loads((tmp_path / "rank-3.json").read_text())["local"] == "0"


def test_only_this_launchs_part_of_the_log_is_quoted(tmp_path):
    """Paddle appends to workerlog.N across launches: a second launch's console said the first one's typo too. The
    log's size as this launch's rank started (`rank_log.mark`, left by `failure_report`) bounds what is quoted."""
    other = "cfg.json: unknown key `max_stepz`; did you mean `max_steps`?"
    d = _verdicts(tmp_path, {"rank": 0, "exit": 2, "kind": "usage", "line": other, "time": 1.0, "local": "0"})
    logs = tmp_path / "log"
    logs.mkdir()
    first = f"[INFO] arguments\nerror: {TYPO}\n"
    (logs / "workerlog.0").write_text(first + f"[INFO] arguments\nerror: {other}\n")
    rank_log.mark(d, logs / "workerlog.0", len(first.encode()))
    assert account.cause(d, logs) == f"error: {other}"


def test_a_usage_error_of_one_rank_says_its_other_problems_below_its_line(tmp_path):
    second = "cfg.json: `max_steps` -3: not > 0"
    d = _verdicts(tmp_path, {"rank": 1, "exit": 2, "kind": "usage", "line": TYPO, "time": 1.0, "local": "1"},
                  {"rank": 0, "exit": 1, "kind": "peer", "line": "x", "time": 1.1, "local": "0"})
    (tmp_path / "workerlog.1").write_text(f"[INFO] arguments\nerror: {TYPO}\nerror: {second}\n")
    assert account.cause(d, tmp_path).splitlines() == [
        f"launch.sh: rank 1 ended the job (exit 2): {TYPO} Its full log: {tmp_path}/workerlog.1", f"error: {second}"]


TRACEBACK = ["Traceback (most recent call last):"] + [
    x for n in range(12) for x in (f'  File "/src/m{n}.py", line {n}, in f{n}', f"    f{n + 1}()", "    ^^^^^^")] + [
    "RuntimeError: injected bug", "", "[pretrain-cli] rank 1 (pid 7 on h) died: exited with code 1; the other ranks "
    "stop too. Re-run the same command (or launch with MAX_RESTART) to resume from the newest complete checkpoint-N."]
FATAL = ["step 2", "Fatal Python error: Segmentation fault", "", "Thread 0x00007f1 (most recent call first):",
         '  File "/py/threading.py", line 331 in wait', "", "Current thread 0x00007f2 (most recent call first):"] + [
    f'  File "/src/m{n}.py", line {n} in f{n}' for n in range(25)] + [
    "", "Extension modules: numpy (total: 1)", "", "FatalError: `Segmentation fault` is detected by the operating "
    "system.", "", "[pretrain-cli] rank 1 (pid 7 on h) died: killed by SIGSEGV; the other ranks stop too."]


def test_a_crashed_rank_is_followed_by_the_end_of_its_traceback_or_stack(tmp_path):
    """An uncaught exception: its traceback's last lines (the `^` markers left out), ending with the exception; a fatal
    signal: Python's fatal-error line and the crashed thread's innermost frames; 20 lines at most, this launch's."""
    log = tmp_path / "workerlog.1"
    log.write_text("\n".join(["old launch:", *FATAL, "new launch:", *TRACEBACK]) + "\n")
    rank_log.mark(tmp_path, log, len(("\n".join(["old launch:", *FATAL]) + "\n").encode()))
    d = _verdicts(tmp_path, {"rank": 1, "exit": 1, "kind": "crashed", "line": "RuntimeError: injected bug",
                             "time": 1.0, "local": "1"})
    said = account.cause(d, tmp_path).splitlines()
    assert said[0] == f"launch.sh: rank 1 ended the job (exit 1): RuntimeError: injected bug. Its full log: {log}"
    assert said[1:4] == ["Traceback (most recent call last):", "  … (8 lines more in its full log)",
                         '  File "/src/m4.py", line 4, in f4'], said
    assert said[-3:] == ['  File "/src/m11.py", line 11, in f11', "    f12()", "RuntimeError: injected bug"], said
    assert len(said) == 20 and "    ^^^^^^" not in said
    log.write_text("\n".join(["new launch:", *FATAL]) + "\n")
    rank_log.mark(tmp_path, log, 0)
    _verdicts(tmp_path, {"rank": 1, "exit": 139, "kind": "died", "line": FATAL[-1], "time": 1.0, "local": "1"})
    said = account.cause(d, tmp_path).splitlines()
    assert said[1:4] == ["Fatal Python error: Segmentation fault", "Current thread 0x00007f2 (most recent call first):",
                         '  File "/src/m0.py", line 0 in f0'], said
    assert said[-1] == "  … (8 frames more in its full log)" and len(said) == 21, said
    killed = "[pretrain-cli] rank 1 (pid 7 on h) died: killed by SIGKILL; the other ranks stop too."
    _verdicts(tmp_path, {"rank": 1, "exit": 137, "kind": "died", "line": killed, "time": 1.0, "local": "1"})
    assert len(account.cause(d, tmp_path).splitlines()) == 1  # a SIGKILL leaves no stack of its own: nothing quoted


def test_a_sigkill_of_our_own_is_said_as_ours_not_the_oom_killers(tmp_path, monkeypatch):
    """`account.killed_here`, left by a rank's own kill once its launcher is gone (and the launcher's after STOP_TIMEOUT:
    test_job_kills): the rank's handler never ran (stuck in a native call), so its line has no `into its stop`."""
    died = "[pretrain-cli] rank 1 (pid 7 on h) died: killed by SIGKILL; the other ranks stop too."
    d = _verdicts(tmp_path, {"rank": 1, "exit": 137, "kind": "died", "line": died, "time": 1.0, "local": "1"})
    monkeypatch.setenv(job.VERDICTS_ENV, str(d))
    account.killed_here(1, "by itself, 900 s after its launcher died", 7)
    assert account.cause(d) == ("launch.sh: rank 1 ended the job: rank 1 (pid 7 on h) died: killed by SIGKILL (by "
                            "itself, 900 s after its launcher died); the other ranks stop too.")


def test_a_ranks_collective_error_after_another_ranks_death_does_not_name_it(tmp_path):
    """A SIGKILLed rank's peers lose their gloo connection at once: under the semi-auto engine Paddle raises that as
    an OSError ('(External) RuntimeError: ... Read error ... Connection reset by peer'), which the CLI records as a
    "system" end, often before the dead rank's watcher records its death. The death is the cause: launch.sh named
    rank 1 and exited 1 for `kill -9` of rank 3 (2 of 5 tries at tp 2 x ZeRO-3 on 4 CPU processes)."""
    reset = ("system: (External) RuntimeError: [/paddle/third_party/gloo/gloo/transport/tcp/pair.cc:576] Read error "
             "[127.0.0.1]:7073: Connection reset by peer")
    died = ("[pretrain-cli] rank 3 (pid 9 on h) died: killed by SIGKILL; the other ranks stop too. Re-run the same "
            "command (or launch with MAX_RESTART) to start from step 0.")
    d = _verdicts(tmp_path, {"rank": 1, "exit": 1, "kind": "system", "line": reset, "time": 1.0, "local": "1"},
                  {"rank": 3, "exit": 137, "kind": "died", "line": died, "time": 1.2, "local": "3"},
                  {"rank": 0, "exit": 1, "kind": "peer", "line": "rank 0: rank 3 (pid 9 on h) died", "time": 1.3,
                   "local": "0"})
    assert account.cause(d, "out/log").startswith("launch.sh: rank 3 ended the job: rank 3 (pid 9 on h) died: killed "
                                                  "by SIGKILL")
    assert job.decide(d, 1) == (137, "retry")
    # alone (the rank it lost on another node, say, left no record here), the reaction is still said
    alone = _verdicts(tmp_path / "alone", {"rank": 1, "exit": 1, "kind": "system", "line": reset, "time": 1.0,
                                           "local": "1"})
    assert account.cause(alone, "out/log").startswith("launch.sh: rank 1 ended the job (exit 1): system:")
