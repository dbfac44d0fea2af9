"""launch.sh's line on why the job ended (`job.cause`) leaves out a usage error the console shows already: the node's
first rank's own `error:` line, or its watcher's line on the rank that left with it, which Paddle's launcher copies
into the console (`failure_report`)."""
import json

from pretrain_cli.distributed.launcher import job

TYPO = "cfg.json: unknown key `learnig_rate`; did you mean `learning_rate`?"


def _verdicts(tmp_path, *records):
    for r in records:
        (tmp_path / f"rank-{r['rank']}.json").write_text(json.dumps(r))
    return tmp_path


def test_a_usage_error_the_first_rank_said_itself_is_not_said_again(tmp_path):
    d = _verdicts(tmp_path, {"rank": 1, "exit": 2, "kind": "usage", "line": TYPO, "time": 1.0, "local": "1"},
                  {"rank": 0, "exit": 2, "kind": "usage", "line": TYPO, "time": 1.1, "local": "0"})
    assert job.cause(d) is None and job.said_on_console(d)
    assert job.decide(d, 2) == (2, "stop")


def test_a_usage_error_the_console_has_not_shown_is_said_with_its_rank(tmp_path):
    d = _verdicts(tmp_path, {"rank": 1, "exit": 2, "kind": "usage", "line": TYPO, "time": 1.0, "local": "1"},
                  {"rank": 0, "exit": 1, "kind": "peer", "line": "rank 0: rank 1 left", "time": 1.1, "local": "0"})
    assert job.cause(d) == f"launch.sh: rank 1 ended the job: {TYPO}" and not job.said_on_console(d)
    assert job.cause(tmp_path / "none") is None  # no record: nothing to say


def test_a_usage_error_the_first_ranks_watcher_named_as_a_departure_is_not_said_again(tmp_path):
    left = f"[pretrain-cli] rank 0: rank 1 (pid 7 on h) left with an error: {TYPO}; this rank stops too."
    d = _verdicts(tmp_path, {"rank": 1, "exit": 2, "kind": "usage", "line": TYPO, "time": 1.0, "local": "1"},
                  {"rank": 0, "exit": 1, "kind": "peer", "line": left, "time": 1.1, "local": "0"})
    assert job.cause(d) is None and job.said_on_console(d)
    died = "[pretrain-cli] rank 0: rank 1 (pid 7 on h) died: exited with code 2; this rank stops too."
    _verdicts(tmp_path, {"rank": 0, "exit": 1, "kind": "peer", "line": died, "time": 1.1, "local": "0"})
    assert job.cause(d) == f"launch.sh: rank 1 ended the job: {TYPO}"  # a death's line does not say the error


def test_another_error_of_the_first_rank_does_not_hide_the_first_ones(tmp_path):
    d = _verdicts(tmp_path, {"rank": 1, "exit": 2, "kind": "usage", "line": TYPO, "time": 1.0, "local": "1"},
                  {"rank": 0, "exit": 2, "kind": "usage", "line": "out: not writable", "time": 1.1, "local": "0"})
    assert job.cause(d) == f"launch.sh: rank 1 ended the job: {TYPO}"


def test_records_name_the_ranks_place_on_its_node(tmp_path, monkeypatch):
    monkeypatch.setenv("PADDLE_LOCAL_RANK", "0")
    job.record(3, 2, "usage", TYPO, directory=tmp_path)
    assert json.loads((tmp_path / "rank-3.json").read_text())["local"] == "0"
