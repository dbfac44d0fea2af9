"""`report_to` as PaddleNLP spells it, decided in config; an absent optional tracker is one line at start."""
import json

import pytest

from pretrain_cli.cli import main as cli_main
from pretrain_cli.errors import UserError
from pretrain_cli.training import trackers


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

    code = ("from pretrain_cli.training import trackers\nfrom pretrain_cli.errors import UserError\n"
            "try:\n    trackers.Wandb('runs', 'out', {}, [])\nexcept UserError as e:\n    print(e)\n")
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

    def fake_open(names, logdir, output_dir, config, history):
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
