"""The job's own SIGKILLs of a rank leave a mark (`job.killed_here`) that launch.sh's line reads, so that such a kill is
not said as `often the kernel's OOM killer`: the launcher's once a stop's STOP_TIMEOUT has passed
(`stopping.stop_ranks`) and a rank's own once its launcher is gone (`launch._end_now`). A rank stuck in a native call
never runs its stop handler, so its watcher's line has no `into its stop` to tell such a kill from the OOM killer's."""
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from pretrain_cli.distributed.launcher import job, stopping

SRC = Path(__file__).resolve().parents[2] / "src"
DIED = "[pretrain-cli] rank {} (pid 7 on h) died: killed by SIGKILL; the other ranks stop too."


class _Rank:
    """Paddle's Container as `stop_ranks` uses it: a rank that ends at the stop's SIGTERM, or one that never does."""

    def __init__(self, rank: int, ends: bool):
        self.env, self.ends, self.signals = {"PADDLE_TRAINER_ID": str(rank)}, ends, []

    def terminate(self, force=False):
        self.signals.append("KILL" if force else "TERM")

    def wait(self, timeout=None):
        return self.ends


def _cause(directory: Path, rank: int) -> str:
    (directory / f"rank-{rank}.json").write_text(json.dumps(
        {"rank": rank, "exit": 137, "kind": "died", "line": DIED.format(rank), "time": 1.0, "local": str(rank)}))
    return job.cause(directory)


def test_the_launchers_kill_after_stop_timeout_is_said_as_its_own(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(job.VERDICTS_ENV, str(tmp_path))
    ranks = [_Rank(0, ends=True), _Rank(1, ends=False)]
    assert stopping.stop_ranks(ranks, 3) is False
    assert [r.signals for r in ranks] == [["TERM", "KILL"], ["TERM", "KILL"]]
    assert "had not finished their stop 3 s after the signal" in capsys.readouterr().err
    assert not (tmp_path / "killed-0").exists()  # (it ended within the stop: a later death is not ours)
    assert _cause(tmp_path, 1) == ("launch.sh: rank 1 ended the job: rank 1 (pid 7 on h) died: killed by SIGKILL (by "
                                   "the launcher, 3 s into the stop (STOP_TIMEOUT)); the other ranks stop too.")
    (tmp_path / "rank-1.json").unlink()
    assert job.OOM in _cause(tmp_path, 0)  # no mark: the OOM killer, most likely


def test_a_ranks_own_kill_after_its_launchers_death_is_said_as_its_own(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(SRC), "PADDLE_TRAINER_ID": "1", job.VERDICTS_ENV: str(tmp_path)}
    p = subprocess.run([sys.executable, "-c", "from pretrain_cli.distributed.launcher import launch\n"
                        "launch._end_now(900)"], env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == -signal.SIGKILL and "it ends itself now (SIGKILL)" in p.stderr, p.stderr
    assert "(by itself, 900 s after its launcher died)" in _cause(tmp_path, 1)
    assert "OOM" not in _cause(tmp_path, 1)
