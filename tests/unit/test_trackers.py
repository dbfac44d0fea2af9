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
