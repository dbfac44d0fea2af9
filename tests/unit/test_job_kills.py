"""The job's own SIGKILLs of a rank leave a mark (`account.killed_here`) that launch.sh's line reads, so that such a kill is
not said as `often the kernel's OOM killer`: the launcher's once a stop's STOP_TIMEOUT has passed
(`stopping.stop_ranks`) and a rank's own once its launcher is gone (`launch._end_now`). A rank stuck in a native call
never runs its stop handler, so its watcher's line has no `into its stop` to tell such a kill from the OOM killer's."""
import json
import os
import signal
import subprocess
import sys
import types
from pathlib import Path

from pretrain_cli.distributed.launcher import account, job, stopping

SRC = Path(__file__).resolve().parents[2] / "src"
DIED = "[pretrain-cli] rank {} (pid 7 on h) died: killed by SIGKILL; the other ranks stop too."


class _Rank:
    """Paddle's Container as `stop_ranks` uses it: a rank that ends at the stop's SIGTERM, or one that never does."""

    def __init__(self, rank: int, ends: bool):
        self.env, self.ends, self.signals = {"PADDLE_TRAINER_ID": str(rank)}, ends, []
        self._proc = types.SimpleNamespace(_proc=types.SimpleNamespace(pid=7))  # (ProcessContext's Popen)

    def terminate(self, force=False):
        self.signals.append("KILL" if force else "TERM")

    def wait(self, timeout=None):
        return self.ends


def _cause(directory: Path, rank: int, pid: int = 7) -> str:
    (directory / f"rank-{rank}.json").write_text(json.dumps(
        {"rank": rank, "exit": 137, "kind": "died", "line": DIED.format(rank).replace("pid 7", f"pid {pid}"),
         "time": 1.0, "local": str(rank)}))
    return account.cause(directory)


def test_the_launchers_kill_after_stop_timeout_is_said_as_its_own(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(job.VERDICTS_ENV, str(tmp_path))
    ranks = [_Rank(0, ends=True), _Rank(1, ends=False)]
    assert stopping.stop_ranks(ranks, 3) is False
    assert [r.signals for r in ranks] == [["TERM", "KILL"], ["TERM", "KILL"]]
    assert "had not finished their stop 3 s after the signal" in capsys.readouterr().err
    assert not (tmp_path / "killed-0").exists()  # (it ended within the stop: a later death is not ours)
    # said once: the launcher's line has said the stop and what to do (no `ended the job`, no MAX_RESTART advice)
    assert _cause(tmp_path, 1) == ("launch.sh: rank 1 (pid 7 on h) died: killed by SIGKILL (by the launcher, 3 s into "
                                   "the stop (STOP_TIMEOUT)).")
    assert account.OOM in _cause(tmp_path, 1, pid=8)  # a mark for another process of rank 1 (an earlier launch's): not it
    (tmp_path / "rank-1.json").unlink()
    assert account.OOM in _cause(tmp_path, 0)  # no mark: the OOM killer, most likely


def test_a_ranks_own_kill_after_its_launchers_death_is_said_as_its_own(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(SRC), "PADDLE_TRAINER_ID": "1", job.VERDICTS_ENV: str(tmp_path)}
    p = subprocess.Popen([sys.executable, "-c", "from pretrain_cli.distributed.launcher import launch\n"
                          "launch._end_now(900)"], env=env, stderr=subprocess.PIPE, text=True)
    _, err = p.communicate(timeout=60)
    assert p.returncode == -signal.SIGKILL and "it ends itself now (SIGKILL)" in err, err
    said = _cause(tmp_path, 1, pid=p.pid)
    assert "ended the job: rank 1" in said and "(by itself, 900 s after its launcher died)" in said, said
    assert "OOM" not in said
    # the mark names the rank's process: the next launch's rank 1 (another pid) killed by the OOM killer is said so
    assert account.OOM in _cause(tmp_path, 1, pid=p.pid + 1)


def test_a_death_reaped_before_its_watcher_read_it_is_the_jobs_own_kill_when_marked(tmp_path, monkeypatch):
    """Paddle's launcher reaps its ranks once a second, so a watcher can find its dead rank's status gone
    (`exit status unknown`, and then no record: launch.sh's code was the launcher's 1, not 137). The job's own kill
    left its mark first: the watcher takes SIGKILL from it, for that pid only."""
    from pretrain_cli.distributed.launcher.verdict import Evidence

    monkeypatch.setenv(job.VERDICTS_ENV, str(tmp_path))
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # reaped: /proc holds no status to read
    shared = tmp_path / "shared"
    seen = Evidence(0, {0: gone.pid, 1: os.getpid()}, shared)
    seen.observe({0})
    assert seen.statuses[0] is None  # unmarked: unknown, as before
    account.killed_here(0, "by the launcher, 2 s into the stop (STOP_TIMEOUT)", gone.pid + 1, stop=True)
    seen = Evidence(0, {0: gone.pid, 1: os.getpid()}, shared)
    seen.observe({0})
    assert seen.statuses[0] is None  # another process's mark
    account.killed_here(0, "by the launcher, 2 s into the stop (STOP_TIMEOUT)", gone.pid, stop=True)
    seen = Evidence(0, {0: gone.pid, 1: os.getpid()}, shared)
    seen.observe({0})
    assert seen.statuses[0] == signal.SIGKILL and (shared / "status.0").read_text() == "9"


def test_a_first_look_without_waiting_leaves_an_exiting_rank_to_the_wait(tmp_path, monkeypatch):
    """The watcher looks first without waiting (`observe(gone, wait=False)`), then waits for a rank still exiting
    (`_status`, its 0.5 s pidfd wait): the first look must leave it unread, mark or none, so the wait still runs."""
    from pretrain_cli.distributed.launcher import verdict

    monkeypatch.setenv(job.VERDICTS_ENV, str(tmp_path))
    waited = []
    monkeypatch.setattr(verdict.processes, "exit_status", lambda pid: None)  # still exiting: not a zombie yet
    monkeypatch.setattr(verdict.Evidence, "_status", staticmethod(lambda pid: waited.append(pid) or 9))
    seen = verdict.Evidence(0, {0: 12345, 1: os.getpid()}, tmp_path / "shared")
    seen.observe({0}, wait=False)
    assert 0 not in seen.statuses
    seen.observe({0})
    assert waited == [12345] and seen.statuses[0] == 9
