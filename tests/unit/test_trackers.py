"""`report_to` as PaddleNLP spells it, decided in config; an absent optional tracker is one line at start; what a
resume writes into the trackers' files."""
import json
import sys
from pathlib import Path

import pytest

from pretrain_cli.cli import main as cli_main
from pretrain_cli.errors import UserError
from pretrain_cli.training import trackers
from trainer_records import log_steps


def test_report_to_names_are_resolved_once(monkeypatch):
    notes = []
    assert trackers.choose(None, notes) == ("visualdl",)  # the default
    assert trackers.choose("tensorboard", notes) == ("tensorboard",)  # a string, as PaddleNLP takes it
    assert trackers.choose(["wandb", "TensorBoard"], notes) == ("wandb", "tensorboard")
    assert trackers.choose("tensorboard,wandb", notes) == ("tensorboard", "wandb")
    assert trackers.choose(["none"], notes) == () and trackers.choose(["visualdl", "none"], notes) == ()
    assert notes == []
    monkeypatch.setattr(trackers, "installed", lambda name: name != "wandb")
    assert trackers.choose("all", notes) == ("visualdl", "tensorboard")  # the installed ones
    assert len(notes) == 1 and "wandb (pip install wandb" in notes[0]
    with pytest.raises(UserError, match="unknown tracker 'mlflow'; use visualdl, tensorboard, wandb, all or none"):
        trackers.choose(["visualdl", "mlflow"], [])


def test_a_named_tracker_that_is_not_installed_is_one_check_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(trackers, "installed", lambda name: name == "visualdl")
    cfg = {"model_name_or_path": "micro-qwen2", "output_dir": str(tmp_path / "out"), "max_steps": 2,
           "max_seq_length": 32, "do_train": True, "report_to": ["tensorboard", "wandb"], "input_dir": str(tmp_path)}
    (tmp_path / "cfg.json").write_text(json.dumps(cfg))
    assert cli_main(["check", str(tmp_path / "cfg.json")]) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if "report_to" in line]
    assert lines == ["error: report_to: tensorboard needs the tensorboardX package, which is not installed: "
                     "pip install tensorboardX  (or pip install -e '.[tensorboard]')",
                     "error: report_to: wandb needs the wandb package, which is not installed: "
                     "pip install wandb  (or pip install -e '.[wandb]')"]
    assert cli_main(["plan", str(tmp_path / "cfg.json"), "--device", "A100-80GB"]) == 0  # plan needs no tracker


def test_wandb_that_cannot_start_is_one_line_naming_the_offline_mode(tmp_path):
    """Not logged in and not offline: one UserError line at start, not wandb's traceback at step 1 (in a fresh
    interpreter: wandb keeps process-wide settings, and another test may have run it offline)."""
    import os
    import subprocess
    import sys

    code = ("from pretrain_cli.training import trackers_wandb\nfrom pretrain_cli.errors import UserError\n"
            "try:\n    trackers_wandb.Wandb('runs', 'out', {}, [])\nexcept UserError as e:\n    print(e)\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                         env={**env, "HOME": str(tmp_path)}, stdin=subprocess.DEVNULL)
    lines = out.stdout.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("report_to: wandb could not start a run ("), out.stdout + out.stderr
    assert lines[0].endswith("run `wandb login`, or set WANDB_MODE=offline to write a local run to upload later "
                             "with `wandb sync`")


def test_a_tensorboard_file_opened_in_the_same_second_as_the_last_is_a_new_file(tmp_path, monkeypatch):
    """tensorboardX names its file by the whole second and the host: a run resumed in the same second as the last
    one started used to truncate that file and then remove it as an old one (no event file at all). Each file is
    now its own, and the old one goes only once the new one holds the history."""
    import tensorboardX.event_file_writer as efw

    class Frozen:  # the clock tensorboardX names its files by, stopped within one second
        @staticmethod
        def time():
            return 1796445046.5

    monkeypatch.setattr(efw, "time", Frozen)
    history = [{"kind": "train", "step": 1, "loss": 2.0, "time": 1796445046.0}]
    for n in range(3):  # a run and two resumes
        trackers.TensorBoard(str(tmp_path), str(tmp_path), {"n": n}, history).close()
        files = list(tmp_path.glob("events.out.tfevents.*"))
        assert len(files) == 1 and files[0].stat().st_size > 0, (n, files)
        history.append({"kind": "train", "step": n + 2, "loss": 1.0, "time": 1796445047.0})


def test_a_resume_reads_a_long_runs_metrics_without_holding_them(tmp_path, monkeypatch):
    """metrics.jsonl grows by a line per log step for the whole run; a resume keeps its lines up to the checkpoint
    and gives the trackers the kept records. It held every record as a dict (and every kept line) at once: ~5 KB
    a record, 520 MB at 100,000. Now it streams: its peak does not grow with the file (counted by tracemalloc)."""
    import tracemalloc

    from pretrain_cli.training.metrics import MetricsWriter

    record = {"loss": 1.25, "learning_rate": 3e-4, "interval_runtime": 0.05, "tokens_per_sec": 1e4, "mfu": 0.02,
              "host_memory_gib": 0.33, "grad_norm": 1.5, "tokens_seen": 640, "batch_hash": "997edc330f3a"}
    n = 20_000
    lines = [json.dumps({"kind": "startup", "step": 0, "rank": 0})]
    lines += [json.dumps({"kind": "train", "step": s, "time": 1.0, **record}) for s in range(1, n + 1)]
    (tmp_path / "metrics.jsonl").write_text("\n".join(lines) + '\n{"kind": "tra')  # a last line cut by a kill
    seen = []

    def fake_open(names, logdir, output_dir, config, history, start=None, begin=None):
        for _ in range(2):  # two trackers, each reading the history
            seen.append(sum(1 for _ in history))
        return []

    monkeypatch.setattr(trackers, "open_trackers", fake_open)
    keep = n - 500  # the checkpoint the run resumes from: the 500 steps logged after it are dropped
    tracemalloc.start()
    try:
        writer = MetricsWriter(str(tmp_path), None, ["visualdl"], keep)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    writer.close()
    assert seen == [keep, keep]  # the startup record is not tracked
    assert (tmp_path / "metrics.jsonl").read_text().splitlines() == lines[: keep + 1]
    assert peak < 2e6, peak  # the old reading: ~60 MB for these 20,000 records


def _curves(runs):
    """{tracker: {tag: [(step, value)]}} as VisualDL (its newest file, all it shows) and TensorBoard (every file,
    in name order) read them."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))
    import tracker_readers
    from visualdl import LogReader

    reader = LogReader(file_path=str(max(runs.glob("vdlrecords.*"))))
    vdl = {tag: [(r.id, r.value) for r in reader.get_data("scalar", tag)]
           for tag in ("train/loss", "eval/eval_loss", "checkpoint/stall_seconds")}
    vdl["config"] = [r.id for r in reader.get_data("text", "config")]
    return {"visualdl": vdl, "tensorboard": tracker_readers.tensorboard(runs)[0]}


def test_a_resume_cuts_the_tracker_files_back_to_its_checkpoint_instead_of_writing_the_history_again(tmp_path,
                                                                                                      monkeypatch):
    """A resume wrote the whole history into new VisualDL and TensorBoard files before its first step: 15 minutes
    on rank 0 for 10^6 records, and in a launch of two processes past gloo's 30 s at 50,000 (TensorBoard), the
    other rank waiting. Now each file is cut back to where the checkpoint's mark says it stood, and only the kept
    records of that step are written again: one curve per tag, none of an interrupted run's records past the
    checkpoint, whatever the history's length."""
    from pretrain_cli.training.metrics import MetricsWriter

    names = ["visualdl", "tensorboard"]
    writer = MetricsWriter(str(tmp_path), None, names, None, {"max_steps": 12})
    marks = log_steps(writer, 1, 12, offset=5.0)  # killed at step 12: checkpoint-10 is the newest
    writer.close()
    written, add = [], trackers._Records.add

    def counted(self, record):
        written.append((self.name, record["step"]))
        add(self, record)

    monkeypatch.setattr(trackers._Records, "add", counted)
    writer = MetricsWriter(str(tmp_path), None, names, 10, {"max_steps": 20}, (), marks[10])
    monkeypatch.undo()
    # nothing before step 10 is written again; of step 10 the records after the mark (train, eval, checkpoint)
    assert written == [(name, 10) for name in names for _ in range(3)]
    writer.write("startup", 10, {"rank": 0})
    marks = log_steps(writer, 11, 17)  # killed again at 17: resumed from checkpoint-15
    writer.close()
    writer = MetricsWriter(str(tmp_path), None, names, 15, {"max_steps": 20}, (), marks[15])
    log_steps(writer, 16, 20)
    writer.close()

    runs = tmp_path / "runs"
    assert len(list(runs.glob("vdlrecords.*"))) == 1 and len(list(runs.glob("events.out.tfevents.*"))) == 3
    expected = [(s, pytest.approx(10.0 - s / 10 + (5.0 if s <= 10 else 0.0))) for s in range(1, 21)]
    for tracker, curves in _curves(runs).items():
        assert curves["train/loss"] == expected, tracker  # no step twice, none of the killed runs' later steps
        assert [s for s, _ in curves["eval/eval_loss"]] == [5, 10, 15, 20], tracker
        assert [s for s, _ in curves["checkpoint/stall_seconds"]] == [5, 10, 15, 20], tracker
    assert _curves(runs)["visualdl"]["config"] == [0, 10, 15]  # each process's configuration, at its start
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").open()]
    assert [(r["kind"], r["step"]) for r in records if r["kind"] == "train"] == [("train", s) for s in range(1, 21)]
    assert [r["step"] for r in records if r["kind"] in ("startup", "checkpoint")] == [5, 10, 10, 15, 20]


def test_a_resume_without_an_intact_mark_writes_that_trackers_history_again(tmp_path):
    """No mark (a checkpoint from before marks), a tracker the run did not report to before, or a file changed
    since its mark: that tracker's history is written anew from metrics.jsonl, as before; the others are cut."""
    from pretrain_cli.training.metrics import MetricsWriter

    writer = MetricsWriter(str(tmp_path), None, ["visualdl"], None, {})
    marks = log_steps(writer, 1, 12)
    writer.close()
    runs = tmp_path / "runs"
    vdl = max(runs.glob("vdlrecords.*"))
    writer = MetricsWriter(str(tmp_path), None, ["visualdl", "tensorboard"], 10, {}, (), marks[10])
    writer.close()
    assert max(runs.glob("vdlrecords.*")) == vdl  # cut back and written on
    curves = _curves(runs)
    assert [s for s, _ in curves["tensorboard"]["train/loss"]] == list(range(1, 11))  # added: the history
    assert curves["visualdl"]["train/loss"] == curves["tensorboard"]["train/loss"]

    with open(vdl, "r+b") as f:  # a byte the mark saw, changed: the file is rewritten, not cut
        f.seek(marks[10]["files"]["visualdl"][vdl.name][0] - 1)
        f.write(b"\xff")
    writer = MetricsWriter(str(tmp_path), None, ["visualdl"], 10, {}, (), marks[10])
    writer.close()
    assert [vdl.name] != [p.name for p in runs.glob("vdlrecords.*")]
    assert [s for s, _ in _curves(runs)["visualdl"]["train/loss"]] == list(range(1, 11))
    writer = MetricsWriter(str(tmp_path), None, ["visualdl"], 5, {})  # no mark at all
    writer.close()
    assert [s for s, _ in _curves(runs)["visualdl"]["train/loss"]] == list(range(1, 6))


def test_finishing_a_run_writes_its_last_evaluations_again_once(tmp_path):
    """A run killed in its final export, re-run to finish it: its last step's eval and test records are the ones the
    new process writes (`redo`: `run_end.FINAL_KINDS`, as `train` passes them), the closing metrics' too; of the
    records after the mark the train and checkpoint ones stay. metrics.jsonl then keeps lines that do not all come
    first: it is published whole, its first part copied as it is."""
    from pretrain_cli.training.metrics import MetricsWriter
    from pretrain_cli.training.run_end import FINAL_KINDS

    names = ["visualdl", "tensorboard"]
    writer = MetricsWriter(str(tmp_path), None, names, None, {})
    marks = log_steps(writer, 1, 10)
    writer.write("test", 10, {"test_loss": 8.0})
    writer.write("train_metrics", 10, {"train_loss": 9.0})
    writer.close()
    writer = MetricsWriter(str(tmp_path), None, names, 10, {}, FINAL_KINDS, marks[10])
    writer.write("eval", 10, {"eval_loss": 7.75})  # (the same weights: the same loss, here another to tell them apart)
    writer.write("test", 10, {"test_loss": 7.5})
    writer.write("train_metrics", 10, {"train_loss": 8.5})
    writer.close()
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").open()]
    assert [(r["kind"], r["step"]) for r in records if r["step"] == 10] == [
        ("train", 10), ("checkpoint", 10), ("eval", 10), ("test", 10), ("train_metrics", 10)]
    trackers_curves = _curves(tmp_path / "runs")
    assert trackers_curves["tensorboard"]["train_metrics/train_loss"] == [(10, 8.5)]  # (_curves' VisualDL: 3 tags)
    for tracker, curves in trackers_curves.items():
        assert curves["eval/eval_loss"] == [(5, pytest.approx(8.5)), (10, 7.75)], tracker
        assert [s for s, _ in curves["train/loss"]] == list(range(1, 11)), tracker


def test_the_other_ranks_wait_for_rank_0s_trackers_on_the_store_not_in_a_collective(tmp_path, monkeypatch):
    """Rank 0 opens metrics.jsonl and the trackers while the other ranks go on to the start-up gather, a gloo
    collective that ends after 30 s: a tracker getting a long history anew (wandb, or one without its checkpoint's
    mark) ended a 2-process resume there. The other ranks now wait for rank 0's round on the launcher's store."""
    from types import SimpleNamespace

    from pretrain_cli.training import run as run_module

    class Comm:
        def __init__(self):
            self.calls = []

        def wait_for_rank0(self, what, timeout=None):
            self.calls.append(("wait", what))

        def rank0_done(self, ok=True):
            self.calls.append(("done", ok))

    def config(rank0):
        return SimpleNamespace(parallel=SimpleNamespace(is_rank0=rank0), loop=SimpleNamespace(do_train=True),
                               output=SimpleNamespace(output_dir=str(tmp_path / "out"), logging_dir=None,
                                                      report_to=["visualdl"], overwrite=False))

    opened = []
    monkeypatch.setattr(run_module.metrics, "MetricsWriter", lambda *args: opened.append(args) or "writer")
    rank1 = Comm()
    assert run_module.open_output_dir(config(False), {}, None, rank1) is None
    assert rank1.calls == [("wait", "opening output_dir (metrics.jsonl and the trackers of report_to)")]
    assert not opened and not (tmp_path / "out").exists()
    rank0 = Comm()
    assert run_module.open_output_dir(config(True), {"a": 1}, None, rank0) == "writer"
    assert rank0.calls == [("done", True)] and len(opened) == 1 and (tmp_path / "out" / "args.json").is_file()


def _rollback(writer, marks: dict, step: int, to: int = 10) -> dict:
    """What the trainer does on rank 0 at a spike at `step` rolled back to checkpoint-`to`: the records cut back to
    its mark, then the rollback's record (`spike.SpikePolicy`). Returns what was dropped."""
    dropped = writer.rewind(to, marks[to])
    writer.write("spike", step, {"action": "rollback", "loss": 50.0, "checkpoint_step": to, "dropped": dropped})
    return dropped


def test_a_spike_rollback_cuts_the_record_files_back_to_its_checkpoint_and_says_what_it_dropped(tmp_path,
                                                                                                 monkeypatch):
    """A rollback to checkpoint-10 trains steps 11 on again, and they were logged a second time after the first: two
    points per step in metrics.jsonl and both trackers (a zig-zag curve), and in the loss curve. `rewind` cuts the
    files back to the checkpoint's mark, as a resume from it does: one record per step, of the weights the run went
    on from. Each rollback's record says what went (steps, records, losses) and stays, also through a second
    rollback to the same checkpoint; the configuration is not written again; the loss curve's next drawing reads
    metrics.jsonl from its start again (it had read past where the cut file then grew)."""
    from pretrain_cli.training import plot
    from pretrain_cli.training.metrics import MetricsWriter

    drawn = []
    monkeypatch.setattr(plot, "write_loss_curve",
                        lambda out, curve: drawn.append(list(curve.update().series[("train", "loss")][0])))
    names = ["visualdl", "tensorboard"]
    writer = MetricsWriter(str(tmp_path), None, names, None, {"max_steps": 20})
    marks = log_steps(writer, 1, 12, offset=5.0)
    writer.plot(stopping=True)
    dropped = _rollback(writer, marks, 13)
    assert dropped == {"steps": [11, 12], "records": {"train": 2},
                       "loss": [[11, pytest.approx(13.9)], [12, pytest.approx(13.8)]]}
    log_steps(writer, 11, 13, offset=2.0)
    dropped = _rollback(writer, marks, 14)  # the same checkpoint again: the first rollback's record stays
    assert dropped == {"steps": [11, 13], "records": {"train": 3},
                       "loss": [[11, pytest.approx(10.9)], [12, pytest.approx(10.8)], [13, pytest.approx(10.7)]]}
    log_steps(writer, 11, 20)
    writer.plot(stopping=True)
    writer.close()

    assert drawn == [list(range(1, 13)), list(range(1, 21))]
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").open()]
    assert [r["step"] for r in records if r["kind"] == "train"] == list(range(1, 21))
    assert [(r["step"], r["dropped"]["steps"]) for r in records if r["kind"] == "spike"] == [(13, [11, 12]),
                                                                                            (14, [11, 13])]
    expected = [(s, pytest.approx(10.0 - s / 10 + (5.0 if s <= 10 else 0.0))) for s in range(1, 21)]
    curves = _curves(tmp_path / "runs")
    for tracker, curve in curves.items():
        assert curve["train/loss"] == expected, tracker
        assert [s for s, _ in curve["eval/eval_loss"]] == [5, 10, 15, 20], tracker
        assert [s for s, _ in curve["checkpoint/stall_seconds"]] == [5, 10, 15, 20], tracker
    assert [s for s, _ in curves["tensorboard"]["spike/loss"]] == [13, 14]
    assert curves["visualdl"]["config"] == [0]  # the process's configuration, once


def test_a_rollback_without_an_intact_mark_writes_the_files_anew_and_one_at_the_start_writes_its_configuration(
        tmp_path):
    """A rollback to a checkpoint without marks (saved before them) rewrites metrics.jsonl and the trackers' files
    from the records it keeps, as such a resume does: the same one record per step. A rollback to the checkpoint its
    process resumed from cuts that process's configuration away with the rest, so it is written again, once."""
    from pretrain_cli.training.metrics import MetricsWriter

    names = ["visualdl", "tensorboard"]
    writer = MetricsWriter(str(tmp_path), None, names, None, {})
    marks = log_steps(writer, 1, 12, offset=5.0)
    dropped = _rollback(writer, {10: None}, 13)
    assert dropped["steps"] == [11, 12] and dropped["records"] == {"train": 2}
    log_steps(writer, 11, 12)
    writer.close()
    assert [s for s, _ in _curves(tmp_path / "runs")["visualdl"]["train/loss"]] == list(range(1, 13))

    writer = MetricsWriter(str(tmp_path), None, names, 10, {}, (), marks[10])  # (its bytes changed: written anew)
    marks = log_steps(writer, 11, 17)
    writer.close()
    writer = MetricsWriter(str(tmp_path), None, names, 15, {}, (), marks[15])  # resumed from checkpoint-15 ...
    log_steps(writer, 16, 17)
    assert _rollback(writer, marks, 18, to=15)["steps"] == [16, 17]  # ... and rolled back to it
    log_steps(writer, 16, 18)
    writer.close()
    curves = _curves(tmp_path / "runs")
    assert curves["visualdl"]["config"] == [10, 15]  # (the first file was written anew from step 10)
    for tracker, curve in curves.items():
        assert [s for s, _ in curve["train/loss"]] == list(range(1, 19)), tracker
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").open()]
    assert [r["step"] for r in records if r["kind"] == "train"] == list(range(1, 19))
