"""warmup_stable_decay (config/schedule.py, run_config.Schedule): transformers' lr values, and a run extended from a
stable-phase checkpoint that continues exactly as if it had been planned longer from the start."""
import json
import re

import numpy as np
import pytest
from e2e_helpers import write_config
from safetensors.numpy import load_file

from pretrain_cli.cli import main as cli_main

# micro model, 16-token sequences, one per step: 325 cheap steps
WSD = dict(lr_scheduler_type="warmup_stable_decay", warmup_steps=10, num_decay_steps=20, min_lr_ratio=0.1,
           max_seq_length=16, per_device_train_batch_size=1, logging_steps=5, save_steps=75, do_eval=False,
           do_predict=False, split="100,0,0")


def _records(out):
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r for r in lines if r["kind"] == "train"}


def test_a_stable_phase_checkpoint_extends_to_the_longer_run(corpus, tmp_path):
    """100 steps (the last 20 decaying), resumed from checkpoint-75 with max_steps 150, equals a
    150-step run from the start over steps 76-150: the same losses, rates, phases and final weights, bit for bit."""
    short, extended, long = tmp_path / "short", tmp_path / "ext", tmp_path / "long"
    for d in (short, extended, long):
        d.mkdir()
    assert cli_main(["train", write_config(short, corpus, max_steps=100, **WSD)]) == 0
    rs = _records(short / "out")
    assert re.fullmatch(r"0:0\d:\d\d", rs[10]["eta"]) and rs[100]["eta"] == "0:00:00"  # time remaining, h:mm:ss
    assert rs[75]["lr_phase"] == "stable" and rs[85]["lr_phase"] == "decay" and rs[10]["lr_phase"] == "stable"
    # transformers' step indices: the decay runs over steps 80..99, step 100 is at the floor
    assert rs[95]["learning_rate"] == pytest.approx(0.005 * (0.1 + 0.9 * 0.5 * (1 + np.cos(np.pi * 15 / 20))), 1e-3)
    assert rs[100]["learning_rate"] == pytest.approx(0.0005) and rs[100]["lr_phase"] == "annealed"
    assert cli_main(["train", write_config(long, corpus, max_steps=150, **WSD)]) == 0
    cfg = write_config(extended, corpus, max_steps=150, resume_from_checkpoint=str(short / "out" / "checkpoint-75"),
                       **WSD)
    assert cli_main(["train", cfg]) == 0
    re_, rl = _records(extended / "out"), _records(long / "out")
    keys = ("loss", "learning_rate", "lr_phase", "batch_hash")
    assert [(s, *(re_[s][k] for k in keys)) for s in range(80, 151, 5)] == \
           [(s, *(rl[s][k] for k in keys)) for s in range(80, 151, 5)]
    assert rl[125]["lr_phase"] == "stable" and rl[135]["lr_phase"] == "decay"
    a, b = load_file(str(extended / "out" / "model.safetensors")), load_file(str(long / "out" / "model.safetensors"))
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
