"""Nothing ever unpickles, configs never execute code, paths are never shell-expanded.

A copy of a real checkpoint gets every pickle file name PaddleNLP/torch use, each holding a
payload whose unpickling creates a marker file. Resuming from it and evaluating it must work
(they read only safetensors + JSON) and the marker must never appear. The resumed run also uses
an output_dir full of shell syntax, which must be created literally.
"""
import json
import os
import pickle
import re
import shutil

from harness import RUN_CONFIG, run_cli

PICKLE_NAMES = ("optimizer.pdopt", "model_state.pdparams", "rng_state.pth", "training_args.bin",
                "scheduler.pdparams", "pytorch_model.bin", "model_state.tp00_pp00.pdparams")
WEIRD_OUTPUT = "o $HOME ~x `touch pwned` $(touch pwned2)"


class _Payload:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _poison(ckpt, marker):
    for name in PICKLE_NAMES:
        (ckpt / name).write_bytes(pickle.dumps(_Payload(str(marker))))


def test_payload_is_live(tmp_path):
    """The payload really fires when unpickled (so the absence of the marker below means something)."""
    probe = tmp_path / "probe"
    pickle.loads(pickle.dumps(_Payload(str(probe))))
    assert probe.exists()


def test_no_unpickling_on_resume_or_eval(workdir, reference):
    marker = workdir / "UNPICKLED"
    ckpt = workdir / "ckpt"
    shutil.copytree(reference / "out" / "checkpoint-9", ckpt)
    _poison(ckpt, marker)
    home_before = sorted(os.listdir(os.path.expanduser("~")))
    cfg = {**RUN_CONFIG, "resume_from_checkpoint": "ckpt", "output_dir": WEIRD_OUTPUT}
    (workdir / "run.json").write_text(json.dumps(cfg))
    p = run_cli(["train", "run.json"], cwd=workdir)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "resumed from ckpt at step 9" in p.stdout
    # the literal directory, not an expansion
    assert (workdir / WEIRD_OUTPUT / "model.safetensors").is_file()
    assert (workdir / WEIRD_OUTPUT / "model.safetensors").read_bytes() == \
        (reference / "out" / "model.safetensors").read_bytes()
    p = run_cli(["eval", "--model", "ckpt", "--data", "data/c", "--max_seq_length", "32", "--max_batches", "2",
                 "--json"], cwd=workdir)
    assert p.returncode == 0, p.stderr[-3000:]
    assert json.loads(p.stdout)["model_weights"] == "trained weights"
    assert not marker.exists()
    assert not (workdir / "pwned").exists() and not (workdir / "pwned2").exists()
    assert sorted(os.listdir(os.path.expanduser("~"))) == home_before


def test_no_pickle_loading_in_source():
    """Belt and braces: the product never calls a pickle-based loader."""
    import pretrain_cli

    root = os.path.dirname(pretrain_cli.__file__)
    bad = [r"pickle\.loads?\(", r"paddle\.load\(", r"torch\.load\(", r"allow_pickle=True", r"(?<![\w.])eval\(",
           r"(?<![\w.])exec\(", r"shell=True", r"os\.system\(", r"os\.popen\(", r"expandvars\(", r"expanduser\("]
    hits = []
    for dirpath, _, files in os.walk(root):
        for f in files:
            if f.endswith(".py"):
                text = open(os.path.join(dirpath, f), encoding="utf-8").read()
                hits += [f"{f}: {b}" for b in bad if re.search(b, text)]
    assert hits == []
