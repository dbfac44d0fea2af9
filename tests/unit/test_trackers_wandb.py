"""wandb across resumes and spike rollbacks: one run, rewound to the checkpoint's mark, instead of a new run that gets
the whole history again at every start (~0.6 CPU-s per 1,000 records: past the 600 s start-up allowance near 10^6).

A fake `wandb` module stands in for the library (in sys.modules): it records every `init` and `log` and keeps the
runs as a server would, a rewind (`resume_from`) cutting a run's rows after its point, a fork (`fork_from`) starting a
new run from another's rows. One test runs the real wandb offline, in a fresh interpreter (wandb keeps process-wide
settings)."""
import json
import logging
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

from pretrain_cli.training import trackers_wandb
from pretrain_cli.training.metrics import MetricsWriter
from trainer_records import log_steps


class FakeWandb(types.ModuleType):
    """wandb as far as the tracker uses it. `accepts`: the branching arguments its `init` takes (an older wandb takes
    fewer); `refuse`: the ways to start that raise, as a server without rewind does."""

    def __init__(self, accepts=("resume_from", "fork_from"), refuse=(), offline=False):
        super().__init__("wandb")
        self.__version__ = "0.31.0"
        self.inits, self.logged, self.runs, self.refuse, self.offline = [], [], {}, refuse, offline

        def init(project=None, name=None, config=None, dir=None, id=None, resume_from=None, fork_from=None):
            return self._init(project=project, name=name, config=config, dir=dir, id=id, resume_from=resume_from,
                              fork_from=fork_from)

        def init_016(project=None, name=None, config=None, dir=None, id=None, fork_from=None):
            return self._init(project=project, name=name, config=config, dir=dir, id=id, fork_from=fork_from)

        def init_015(project=None, name=None, config=None, dir=None, id=None):
            return self._init(project=project, name=name, config=config, dir=dir, id=id)

        self.init = {2: init, 1: init_016, 0: init_015}[len(accepts)]

    def _init(self, **kwargs):
        kwargs = {k: v for k, v in kwargs.items() if v is not None}
        self.inits.append(kwargs)
        how = "rewind" if "resume_from" in kwargs else "fork" if "fork_from" in kwargs else "new"
        if how in self.refuse:
            raise RuntimeError(f"{how} is not enabled for this entity\nmore")
        rows = []
        if how == "new":
            run_id = kwargs.get("id") or f"run{len(self.runs)}"
        else:
            source, step = kwargs.get("resume_from", kwargs.get("fork_from")).split("?_step=")
            rows = [row for row in self.runs[source] if row["_step"] <= int(step)]
            run_id = source if how == "rewind" else f"run{len(self.runs)}"
            assert how == "fork" or kwargs.get("id") == source
        self.runs[run_id] = rows
        return FakeRun(self, run_id, int(step) + 1 if how != "new" else 0)


class FakeRun:
    def __init__(self, wandb, run_id, step):
        self.wandb, self.id, self.step, self.offline, self.finished = wandb, run_id, step, wandb.offline, False

    def define_metric(self, *args, **kwargs):
        pass

    def log(self, values):
        assert not self.finished
        self.wandb.runs[self.id].append({"_step": self.step, **values})
        self.wandb.logged.append((self.id, values["train/global_step"]))
        self.step += 1

    def finish(self):
        self.finished = True


def _steps(rows, tag="train/loss"):
    return [row["train/global_step"] for row in rows if tag in row]


@pytest.fixture
def fake(monkeypatch):
    def install(**kwargs):
        module = FakeWandb(**kwargs)
        monkeypatch.setitem(sys.modules, "wandb", module)
        return module
    monkeypatch.delenv("WANDB_DIR", raising=False)
    monkeypatch.delenv("WANDB_PROJECT", raising=False)
    return install


def test_a_resume_rewinds_the_same_wandb_run_to_its_checkpoint_without_replaying_the_history(tmp_path, fake):
    """A resume started a new wandb run and logged the whole history into it again. Now the checkpoint's mark names
    the run and its next row, and the resume rewinds that run there (`resume_from`, the same id): only that step's
    kept records are logged again, none of the steps before, none of the killed run's steps past the checkpoint."""
    wandb = fake()
    writer = MetricsWriter(str(tmp_path), None, ["wandb"], None, {"max_steps": 20})
    marks = log_steps(writer, 1, 12, offset=5.0)  # killed at step 12 (no close): checkpoint-10 is the newest
    (first,) = wandb.inits
    assert "resume_from" not in first and "fork_from" not in first and "id" not in first
    run_id = writer._trackers[0].run.id
    assert marks[10]["wandb"] == {"id": run_id, "step": 11, "project": "pretrain-cli"}  # rows 0-10: steps 1-9, 5's
    run_file = json.loads((tmp_path / trackers_wandb.WANDB_RUN_FILE).read_text())
    assert run_file == {"id": run_id, "project": "pretrain-cli"}

    wandb.logged.clear()
    writer = MetricsWriter(str(tmp_path), None, ["wandb"], 10, {"max_steps": 20}, (), marks[10])
    assert wandb.inits[-1] == {**first, "config": {"max_steps": 20}, "id": run_id, "resume_from": f"{run_id}?_step=10"}
    assert wandb.logged == [(run_id, 10)] * 3  # step 10's train, eval and checkpoint records: no history
    marks = log_steps(writer, 11, 17)
    writer.close()
    writer = MetricsWriter(str(tmp_path), None, ["wandb"], 15, {"max_steps": 20}, (), marks[15])
    assert wandb.inits[-1]["resume_from"] == f"{run_id}?_step={marks[15]['wandb']['step'] - 1}"
    log_steps(writer, 16, 20)
    writer.close()
    assert list(wandb.runs) == [run_id]  # one run
    rows = wandb.runs[run_id]
    assert [row["_step"] for row in rows] == list(range(len(rows)))
    assert _steps(rows) == list(range(1, 21))
    assert [(row["train/global_step"], row["train/loss"]) for row in rows if "train/loss" in row][:10] == \
        [(s, pytest.approx(15.0 - s / 10)) for s in range(1, 11)]  # the first run's records up to its checkpoint
    assert _steps(rows, "eval/eval_loss") == [5, 10, 15, 20]


def test_a_spike_rollback_rewinds_the_run_instead_of_starting_another(tmp_path, fake, caplog):
    """A rollback finished the wandb run and started a new one holding the whole history. Now it rewinds the same run to
    the checkpoint's mark: the steps trained again have one row each, and the rollback's record is kept. Offline
    (no server to rewind) it is the same call, and the line says where the rows go."""
    caplog.set_level(logging.INFO, logger="pretrain_cli")
    wandb = fake(offline=True)
    writer = MetricsWriter(str(tmp_path), None, ["wandb"], None, {})
    marks = log_steps(writer, 1, 12, offset=5.0)
    run_id = writer._trackers[0].run.id
    wandb.logged.clear()
    dropped = writer.rewind(10, marks[10])
    assert dropped["steps"] == [11, 12]
    assert wandb.inits[-1]["resume_from"] == f"{run_id}?_step=10" and wandb.inits[-1]["id"] == run_id
    assert wandb.logged == [(run_id, 10)] * 3  # no history
    assert [r.getMessage() for r in caplog.records if r.getMessage().startswith("report_to: wandb:")] == [
        f"report_to: wandb: run {run_id} rewound to checkpoint-10's mark (wandb step 11) and continued; offline: in "
        f"a new directory offline-run-*-{run_id}, which `wandb sync` uploads after the run's earlier ones"]
    writer.write("spike", 13, {"loss": 50.0, "checkpoint_step": 10})
    log_steps(writer, 11, 20)
    writer.close()
    assert list(wandb.runs) == [run_id]
    rows = wandb.runs[run_id]
    assert _steps(rows) == list(range(1, 21)) and _steps(rows, "spike/loss") == [13]
    assert [row["train/loss"] for row in rows if row["train/global_step"] == 11 and "train/loss" in row] == \
        [pytest.approx(8.9)]  # the step trained again, not the rolled-back one (13.9)


def test_a_resume_into_another_output_dir_forks_the_run_and_leaves_it_as_it_was(tmp_path, fake):
    """resume_from_checkpoint of another output_dir's checkpoint: rewinding that directory's run would cut its history;
    the new directory's run forks from it at the mark (`fork_from`, a new id, named in the new wandb_run.json)."""
    wandb = fake()
    writer = MetricsWriter(str(tmp_path / "a"), None, ["wandb"], None, {})
    marks = log_steps(writer, 1, 12)
    writer.close()
    source = writer._trackers[0].run.id
    before = list(wandb.runs[source])
    wandb.logged.clear()
    writer = MetricsWriter(str(tmp_path / "b"), None, ["wandb"], 10, {}, (), marks[10])
    call = wandb.inits[-1]
    assert call["fork_from"] == f"{source}?_step=10" and "id" not in call and "resume_from" not in call
    forked = writer._trackers[0].run.id
    assert forked != source and wandb.logged == []  # nothing replayed
    assert json.loads((tmp_path / "b" / trackers_wandb.WANDB_RUN_FILE).read_text())["id"] == forked
    log_steps(writer, 11, 12)
    writer.close()
    assert wandb.runs[source] == before
    # its rows up to the mark, then this directory's (step 10's own records came after the mark: in neither)
    assert _steps(wandb.runs[forked]) == list(range(1, 10)) + [11, 12]
    # the same directory without its wandb_run.json (lost): not known to be this run's, so forked, not rewound
    (tmp_path / "a" / trackers_wandb.WANDB_RUN_FILE).unlink()
    MetricsWriter(str(tmp_path / "a"), None, ["wandb"], 10, {}, (), marks[10]).close()
    assert "fork_from" in wandb.inits[-1] and wandb.runs[source] == before


def test_an_older_wandb_or_a_server_without_rewind_forks_then_starts_a_new_run(tmp_path, fake, monkeypatch, caplog):
    """Without rewind (wandb < 0.17.1, or a server that refuses it) the run is forked at the mark; without fork too
    (wandb < 0.16.5, or refused) a new run gets the history only while metrics.jsonl is within REPLAY_BYTES, else the
    records from the checkpoint on. Each says so in one line; none replays an unbounded history."""
    caplog.set_level(logging.INFO, logger="pretrain_cli")

    def resumed(**kwargs):
        wandb = fake(**kwargs)
        writer = MetricsWriter(str(tmp_path), None, ["wandb"], None, {})
        marks = log_steps(writer, 1, 12)
        writer.close()
        wandb.logged.clear()
        caplog.clear()
        MetricsWriter(str(tmp_path), None, ["wandb"], 10, {}, (), marks[10]).close()
        (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("report_to: wandb:")]
        return wandb, line

    wandb, line = resumed(accepts=("fork_from",))
    assert "fork_from" in wandb.inits[-1] and wandb.logged == [("run1", 10)] * 3  # step 10's records: no history
    assert "forks run run0 at checkpoint-10's mark" in line and "wandb 0.31.0 cannot rewind a run" in line
    wandb, line = resumed(refuse=("rewind",))
    assert [("resume_from" in c, "fork_from" in c) for c in wandb.inits[1:]] == [(True, False), (False, True)]
    assert line.endswith("rewind: rewind is not enabled for this entity")
    wandb, line = resumed(accepts=())
    assert set(wandb.inits[-1]) == {"project", "name", "config", "dir"}
    assert sorted(set(s for _, s in wandb.logged)) == list(range(1, 11))  # the history: metrics.jsonl is small
    assert line.startswith("report_to: wandb: new run run1 from step 10, holding the history (0.0 MB of metrics.jsonl)")
    monkeypatch.setattr(trackers_wandb, "REPLAY_BYTES", 100)
    wandb, line = resumed(refuse=("rewind", "fork"))
    assert wandb.logged == [("run1", 10)] * 3  # over the bound: the records from the checkpoint on, no history
    assert "without the history (the steps before are in metrics.jsonl" in line
    assert line.endswith("rewind: rewind is not enabled for this entity; fork: fork is not enabled for this entity")


def test_a_resume_after_metrics_changed_since_its_mark_starts_a_new_run(tmp_path, fake):
    """metrics.jsonl no longer holds what the checkpoint's mark saw (a resume of an older checkpoint wrote past it):
    the run's rows before the mark may not be this checkpoint's either, so it is neither rewound nor forked; a new run
    gets the history from metrics.jsonl (within REPLAY_BYTES)."""
    wandb = fake()
    writer = MetricsWriter(str(tmp_path), None, ["wandb"], None, {})
    marks = log_steps(writer, 1, 12)
    writer.close()
    MetricsWriter(str(tmp_path), None, ["wandb"], 5, {}, (), marks[5]).close()  # back to checkpoint-5 ...
    writer = MetricsWriter(str(tmp_path), None, ["wandb"], 5, {}, (), marks[5])
    log_steps(writer, 6, 7, offset=1.0)  # ... which writes other records where checkpoint-10's mark was
    writer.close()
    wandb.logged.clear()
    MetricsWriter(str(tmp_path), None, ["wandb"], 10, {}, (), marks[10]).close()
    assert set(wandb.inits[-1]) == {"project", "name", "config", "dir"}
    assert sorted(set(s for _, s in wandb.logged)) == list(range(1, 8))  # what metrics.jsonl kept


def test_the_real_wandb_offline_continues_one_run_across_a_resume_and_a_rollback(tmp_path):
    """wandb 0.31 offline: the run, a resume from checkpoint-10 and a rollback to checkpoint-15 start without error,
    each later directory holds only the rows from its mark on (no replay) under the same run id, with the rewind as
    its branch point; the runs as `wandb sync` would apply them hold each step once."""
    code = f"""
import sys
sys.path.insert(0, {str(Path(__file__).parent)!r})
from trainer_records import log_steps
from pretrain_cli.training.metrics import MetricsWriter
out = {str(tmp_path / "out")!r}
writer = MetricsWriter(out, None, ["wandb"], None, {{"max_steps": 20}})
marks = log_steps(writer, 1, 12, offset=5.0)
writer.close()
writer = MetricsWriter(out, None, ["wandb"], 10, {{"max_steps": 20}}, (), marks[10])
marks = log_steps(writer, 11, 17)
writer.rewind(15, marks[15])
writer.write("spike", 18, {{"loss": 50.0}})
log_steps(writer, 16, 20)
writer.close()
"""
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env.update(WANDB_MODE="offline", WANDB_DIR=str(tmp_path / "wandb_dir"), WANDB_SILENT="true", HOME=str(tmp_path))
    (tmp_path / "wandb_dir").mkdir()
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stdout + done.stderr
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))
    import tracker_readers

    dirs = sorted((tmp_path / "wandb_dir" / "wandb").glob("offline-run-*"))
    run_id = dirs[0].name.split("-")[3]  # offline-run-<date>_<time>-<id>[-<n>]
    assert len(dirs) == 3 and all(d.name.split("-")[3] == run_id for d in dirs)
    assert json.loads((tmp_path / "out" / "wandb_run.json").read_text())["id"] == run_id
    rows = [tracker_readers.wandb_run(d)[0] for d in dirs]
    assert _steps(rows[0]) == list(range(1, 13))
    assert [r["train/global_step"] for r in rows[1]][:3] == [10, 10, 10]  # step 10's records, then on: no history
    assert _steps(rows[1]) == list(range(10, 18)) and _steps(rows[2]) == list(range(15, 21))
    assert rows[1][0]["_step"] == 11  # after the first run's rows 0-10
    (synced,) = tracker_readers.wandb_runs(tmp_path / "wandb_dir" / "wandb").values()
    assert _steps(synced[0]) == list(range(1, 21)) and _steps(synced[0], "spike/loss") == [18]
    assert [row["_step"] for row in synced[0]] == list(range(len(synced[0])))
    assert synced[1]["max_steps"] == 20
