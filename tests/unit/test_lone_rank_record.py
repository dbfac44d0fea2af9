"""A node's only rank killed by a signal without a record of its own (a job of one process has no watcher: SIGKILL,
a SIGSEGV) is recorded by its launcher from its exit status
(`failure_report._record_alone`), so launch.sh's line names it as a watcher's record names a rank of several, with
the re-run advice from the user's settings (`account.cause`'s `output`) and its exit code (`job.decide`). Not for a
rank that recorded anything (a `joining` record is a failed join, retried as one), an exit with a code (a usage
error's 2 stays unretried), nor for several ranks of a node, whose watchers decide which died first."""
import socket
import types

from pretrain_cli.distributed.launcher import account, failure_report, job


def _rank(code: int, rank: int = 0, pid: int = 4321):
    """Paddle's Container as the launcher leaves it after the rank ended: `_proc._proc` its Popen."""
    popen = types.SimpleNamespace(returncode=code, pid=pid)
    return types.SimpleNamespace(_proc=types.SimpleNamespace(_proc=popen),
                                 env={"PADDLE_TRAINER_ID": str(rank), "PADDLE_LOCAL_RANK": "0"})


def test_a_lone_ranks_sigkill_is_recorded_and_said_with_where_the_same_command_resumes(tmp_path, monkeypatch):
    monkeypatch.setattr(job, "verdict_dir", lambda: tmp_path)
    out = tmp_path / "out"
    (out / "checkpoint-3").mkdir(parents=True)
    failure_report._record_alone([_rank(-9)])
    assert job.decide(tmp_path, 247) == (137, "retry")  # SIGKILL's code, not Paddle's launcher's 247
    said = account.cause(tmp_path, tmp_path / "log", (str(out), False, None))
    assert said == (f"launch.sh: rank 0 ended the job: rank 0 (pid 4321 on {socket.gethostname()}) died: killed by "
                    f"SIGKILL (often the kernel's OOM killer: see dmesg). Re-run the same command (or launch with "
                    f"MAX_RESTART) to resume from {out}/checkpoint-3, the newest complete checkpoint. Its full log: "
                    f"{tmp_path}/log/workerlog.0")
    # (without the user's settings: the advice launch.sh gave before it knew output_dir)
    assert "to resume from the newest complete checkpoint of output_dir, if any." in account.cause(tmp_path)


def test_a_lone_ranks_sigsegv_is_said_with_its_signals_code(tmp_path, monkeypatch):
    monkeypatch.setattr(job, "verdict_dir", lambda: tmp_path)
    failure_report._record_alone([_rank(-11, rank=3)])
    assert job.decide(tmp_path, 245) == (139, "retry")
    assert account.cause(tmp_path).startswith(f"launch.sh: rank 3 ended the job: rank 3 (pid 4321 on "
                                              f"{socket.gethostname()}) died: killed by SIGSEGV. Re-run the same")


def test_nothing_is_recorded_for_a_rank_with_a_record_several_ranks_or_a_success(tmp_path, monkeypatch):
    monkeypatch.setattr(job, "verdict_dir", lambda: tmp_path)
    job.record(0, job.TRANSIENT, "joining", "died while joining the process group", tmp_path)
    failure_report._record_alone([_rank(-9)])
    assert job.decide(tmp_path, 247) == (job.TRANSIENT, "rendezvous")  # a failed join, as before
    (tmp_path / "rank-0.json").unlink()
    failure_report._record_alone([_rank(-9), _rank(-6, rank=1)])  # (their watchers say which died first)
    for code in (0, 1, 2, 130):  # (an exit with a code: a usage error's 2 is never retried, 130 a Ctrl-C's)
        failure_report._record_alone([_rank(code)])
    failure_report._record_alone([types.SimpleNamespace(_proc=None, env={})])  # (never started)
    assert job.read_records(tmp_path) == []
