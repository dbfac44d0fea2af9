"""launch.sh's account of why the job ended (`failure_report.cause`, printed on stderr): which rank ended it and how,
its line, where its full log is; a usage error every rank of the node found, as one process says it (its `error:`
lines). Paddle's launcher no longer says it (its report held back, the lines left out of its copy of rank 0), so this
is the one place the console says it."""
import json

from pretrain_cli.distributed.launcher import job

TYPO = "cfg.json: unknown key `learnig_rate`; did you mean `learning_rate`?"


def _verdicts(tmp_path, *records):
    for r in records:
        (tmp_path / f"rank-{r['rank']}.json").write_text(json.dumps(r))
    return tmp_path


def test_a_usage_error_every_rank_found_is_said_as_one_process_says_it(tmp_path):
    d = _verdicts(tmp_path, {"rank": 1, "exit": 2, "kind": "usage", "line": TYPO, "time": 1.0, "local": "1"},
                  {"rank": 0, "exit": 2, "kind": "usage", "line": TYPO, "time": 1.1, "local": "0"})
    assert job.cause(d) == f"error: {TYPO}"
    assert job.decide(d, 2) == (2, "stop")
    # every problem the rank's check found (the record holds the first), from its log, once each
    logs = tmp_path / "log"
    logs.mkdir()
    (logs / "workerlog.1").write_text(f"[INFO] arguments\nerror: {TYPO}\nerror: cfg.json: `max_steps` -3: not > 0\n")
    assert job.cause(d, logs) == f"error: {TYPO}\nerror: cfg.json: `max_steps` -3: not > 0"


def test_a_usage_error_of_one_rank_names_the_rank_its_code_and_its_log(tmp_path):
    left = f"[pretrain-cli] rank 0: rank 1 (pid 7 on h) left with an error: {TYPO}; this rank stops too."
    d = _verdicts(tmp_path, {"rank": 1, "exit": 2, "kind": "usage", "line": TYPO, "time": 1.0, "local": "1"},
                  {"rank": 0, "exit": 1, "kind": "peer", "line": left, "time": 1.1, "local": "0"})
    assert job.cause(d, "out/log") == (f"launch.sh: rank 1 ended the job (exit 2): {TYPO}. Its full log: "
                                                  f"out/log/workerlog.1")
    assert job.cause(tmp_path / "none") is None  # no record: nothing to say


def test_a_rank_killed_by_sigkill_is_said_with_the_oom_killer_and_its_log(tmp_path):
    died = ("[pretrain-cli] rank 1 (pid 7 on h) died: killed by SIGKILL; the other ranks stop too. Re-run the same "
            "command (or launch with MAX_RESTART) to resume from the newest complete checkpoint-N.")
    d = _verdicts(tmp_path, {"rank": 1, "exit": 137, "kind": "died", "line": died, "time": 1.0, "local": "1"},
                  {"rank": 0, "exit": 1, "kind": "peer", "line": "rank 0: rank 1 (pid 7 on h) died", "time": 1.1,
                   "local": "0"})
    assert job.cause(d, "out/log") == (
        "launch.sh: rank 1 ended the job: rank 1 (pid 7 on h) died: killed by SIGKILL (often the kernel's OOM killer: "
        "see dmesg); the other ranks stop too. Re-run the same command (or launch with MAX_RESTART) to resume from the "
        "newest complete checkpoint-N. Its full log: out/log/workerlog.1")
    # killed by a stop's limit: the line says whose, not the OOM killer
    stop = "rank 1 (pid 7 on h) died: killed by SIGKILL, 900 s into its stop after a signal, while saving checkpoint-4"
    _verdicts(tmp_path, {"rank": 1, "exit": 137, "kind": "died", "line": stop, "time": 1.0, "local": "1"})
    assert "OOM" not in job.cause(d)


def test_a_disk_full_on_rank_0_is_its_error_line_with_the_code(tmp_path):
    full = ("out/checkpoint-3.tmp/optimizer-00001-of-00002.safetensors: No space left on device; free disk space (or "
            "point output_dir elsewhere) and re-run the same command; training resumes from the last complete "
            "checkpoint")
    d = _verdicts(tmp_path, {"rank": 0, "exit": 1, "kind": "system", "line": full, "time": 1.0, "local": "0"},
                  {"rank": 1, "exit": 1, "kind": "peer", "line": "rank 1: rank 0 died", "time": 1.1, "local": "1"})
    assert job.cause(d, "out/log") == (f"launch.sh: rank 0 ended the job (exit 1): {full}. Its full log: "
                                                  f"out/log/workerlog.0")


def test_records_name_the_ranks_place_on_its_node(tmp_path, monkeypatch):
    monkeypatch.setenv("PADDLE_LOCAL_RANK", "0")
    job.record(3, 2, "usage", TYPO, directory=tmp_path)
    assert json.loads((tmp_path / "rank-3.json").read_text())["local"] == "0"
