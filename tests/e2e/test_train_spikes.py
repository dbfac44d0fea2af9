"""The loss-spike guard end to end, with the spike injected from the data: a poisoned stretch of the
token file (random ids the model never sees elsewhere) inside a corpus of one repetitive pattern.

The test finds, through the product's own data reader, the one step whose batch holds the poison
(step 17 with this corpus and seed), so every assertion names a step it knows independently.
"""
import json
import os
import signal

import numpy as np
import pytest

from pretrain_cli.cli import main as cli_main

POISON_FROM = 300  # ids >= this appear only in the poisoned document
SPIKE_STEP = 17
GUARD = {"spike_loss_factor": 1.3, "spike_warmup_steps": 8, "spike_window": 5}  # step 17: ~1.4 x the mean


@pytest.fixture(scope="module")
def poisoned(tmp_path_factory):
    from pretrain_cli.data.indexed_writer import IndexedDatasetWriter

    root = tmp_path_factory.mktemp("poisoned")
    rng = np.random.default_rng(5)
    w = IndexedDatasetWriter(str(root / "data" / "c"))
    for _ in range(300):  # a count over 37 ids from a random start: learnable in a few steps
        start, n = int(rng.integers(3, 40)), int(rng.integers(40, 90))
        w.add_item(((start + np.arange(n)) % 37 + 3).astype(np.uint16))
        w.end_document()
    w.add_item(rng.integers(POISON_FROM, 500, size=100).astype(np.uint16))  # the poison
    w.end_document()
    w.finalize()
    return root


def _config(root, d, **over):
    cfg = {"model_name_or_path": "micro-qwen2", "input_dir": str(root / "data"), "output_dir": str(d / "out"),
           "device": "cpu", "do_train": True, "split": "100,0,0", "max_seq_length": 32,
           "per_device_train_batch_size": 4, "learning_rate": 0.02, "lr_scheduler_type": "constant",
           "warmup_steps": 2, "max_steps": 20, "logging_steps": 1, "save_steps": 5, "report_to": ["none"],
           "seed": 7, "disable_tqdm": True, **GUARD, **over}
    d.mkdir(parents=True, exist_ok=True)
    (d / "cfg.json").write_text(json.dumps(cfg))
    return str(d / "cfg.json")


def _records(d, kind):
    return [r for r in map(json.loads, (d / "out" / "metrics.jsonl").open()) if r["kind"] == kind]


def _losses(d):
    return {r["step"]: r["loss"] for r in _records(d, "train")}


def _state(d, name="trainer_state.json"):
    return json.loads((d / "out" / name).read_text())


def test_the_poison_lands_in_one_known_step(poisoned, tmp_path):
    from pretrain_cli.orchestration.prepare import prepare
    from pretrain_cli.run_config import Target
    from pretrain_cli.data.loader import micro_batch

    spec = prepare(_config(poisoned, tmp_path, max_steps=30), [], Target())
    gb = spec.run.global_batch_size
    hit = [s for s in range(1, 31) if (micro_batch(spec.splits.train, (s - 1) * gb, gb)["input_ids"] >= POISON_FROM).any()]
    assert hit == [SPIKE_STEP]


def test_skip_drops_the_update_and_consumes_the_batch(poisoned, tmp_path, capsys):
    assert cli_main(["train", _config(poisoned, tmp_path, spike_policy="skip")]) == 0
    (event,) = _records(tmp_path, "spike")
    assert event["step"] == SPIKE_STEP and event["action"] == "skip"
    assert event["loss"] > GUARD["spike_loss_factor"] * event["loss_mean"] and event["first_sample"] == (SPIKE_STEP - 1) * 4
    state = _state(tmp_path)
    assert state["global_step"] == 20 and state["consumed_samples"] == 21 * 4
    assert state["skipped_batches"] == [(SPIKE_STEP - 1) * 4] and state["skipped_steps"] == 1
    text = "".join(capsys.readouterr())
    assert f"step {SPIKE_STEP}: loss spike (loss" in text and "update skipped, batch consumed" in text


def test_stop_saves_nothing_new(poisoned, tmp_path, capsys):
    assert cli_main(["train", _config(poisoned, tmp_path, spike_policy="stop")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"step {SPIKE_STEP}: loss spike" in err[0] and "stopped without saving" in err[0]
    out = tmp_path / "out"
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-10", "checkpoint-15", "checkpoint-5"]
    assert not (out / "model.safetensors").exists()
    assert _records(tmp_path, "spike")[0]["action"] == "stop"


def test_rollback_skips_the_window_and_a_resume_after_it_matches(poisoned, tmp_path, monkeypatch):
    """A: uninterrupted, with a rollback at step 17 to checkpoint-15. B: the same run, stopped by SIGTERM right
    after its rollback (so it saves checkpoint-16, whose window lies ahead), then resumed: it must jump over
    the window and end bitwise identical to A."""
    from pretrain_cli.training import spike

    a, b = tmp_path / "a", tmp_path / "b"
    cfg_a = _config(poisoned, a, spike_policy="rollback", max_steps=22)
    assert cli_main(["train", cfg_a]) == 0
    (event,) = _records(a, "spike")
    assert (event["step"], event["action"], event["checkpoint_step"]) == (SPIKE_STEP, "rollback", 15)
    first = (SPIKE_STEP - 1) * 4
    assert event["skipped_samples"] == [first, first + 4]
    state = _state(a)
    assert state["skipped_batches"] == [first] and state["consumed_samples"] == 23 * 4
    assert state["rollbacks"] == [{"spike_step": SPIKE_STEP, "checkpoint_step": 15, "window": [first, first + 4]}]
    steps = [r["step"] for r in _records(a, "train")]
    assert steps == list(range(1, 23))  # step 16 trained again after the rollback: its first record was dropped
    assert event["dropped"]["loss"] == [[16, _losses(a)[16]]]  # the reload is exact: the same loss again

    real = spike.SpikePolicy.handle

    def then_sigterm(policy, trainer, *args):
        reloaded = real(policy, trainer, *args)
        os.kill(os.getpid(), signal.SIGTERM)  # the trainer's handler: finish the step, save, stop
        return reloaded

    monkeypatch.setattr(spike.SpikePolicy, "handle", then_sigterm)
    cfg_b = _config(poisoned, b, spike_policy="rollback", max_steps=22)
    assert cli_main(["train", cfg_b]) == 0
    saved = _state(b, "checkpoint-16/trainer_state.json")
    assert saved["consumed_samples"] == first and saved["skipped_batches"] == [first]  # the window is ahead
    monkeypatch.undo()
    assert cli_main(["train", cfg_b]) == 0  # resumes from checkpoint-16
    assert (b / "out" / "model.safetensors").read_bytes() == (a / "out" / "model.safetensors").read_bytes()
    la, lb = _losses(a), _losses(b)
    assert [lb[s] for s in range(17, 23)] == [la[s] for s in range(17, 23)]
    assert _state(b)["consumed_samples"] == 23 * 4
    assert [r["step"] for r in _records(b, "train")] == list(range(1, 23))  # cut at the rollback, then at the resume


def test_a_rollback_to_a_damaged_checkpoint_stops_with_one_line(poisoned, tmp_path, monkeypatch, capsys):
    """A rollback reads its checkpoint as a resume does and checks the checksums of every file it read: a byte
    flipped in checkpoint-15's weights after it was saved stops the run with one line naming the file (exit 2),
    instead of training on from altered weights."""
    from pretrain_cli.training import trainer

    real = trainer.Trainer.newest_checkpoint

    def damaged(self):
        path = real(self)
        weights = path / "model.safetensors"
        data = bytearray(weights.read_bytes())
        data[-5] ^= 0x01  # a weight's low mantissa bit: the header still parses, the checksum no longer matches
        weights.write_bytes(bytes(data))
        return path

    monkeypatch.setattr(trainer.Trainer, "newest_checkpoint", damaged)
    assert cli_main(["train", _config(poisoned, tmp_path, spike_policy="rollback", max_steps=18)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert "spike rollback" in err[0] and "checkpoint-15/model.safetensors does not match its checksum" in err[0]
    assert not (tmp_path / "out" / "model.safetensors").exists()  # no final export from the altered weights


def test_a_rollback_leaves_one_record_per_step_in_metrics_and_every_tracker(poisoned, tmp_path, monkeypatch):
    """The steps a rollback trains again were logged a second time after the first: metrics.jsonl, VisualDL,
    TensorBoard and wandb held two points for step 16 (a zig-zag curve), and the checkpoints' log_history two records.
    The record files are now cut back to checkpoint-15's mark, as a resume from it cuts them, and the run writes on:
    one point per step, of the weights the run went on from. The rollback is one `spike` record, which says what was
    dropped (step 16's train record and its loss); the trackers show it once, as `spike/*` at step 17."""
    import tracker_readers
    from visualdl import LogReader

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.delenv("WANDB_DIR", raising=False)
    cfg = _config(poisoned, tmp_path, spike_policy="rollback", max_steps=22,
                  report_to=["visualdl", "tensorboard", "wandb"])
    assert cli_main(["train", cfg]) == 0
    out = tmp_path / "out"
    records = [json.loads(line) for line in (out / "metrics.jsonl").open()]
    train = [(r["step"], r["loss"]) for r in records if r["kind"] == "train"]
    assert [s for s, _ in train] == list(range(1, 23))
    (event,) = [r for r in records if r["kind"] == "spike"]
    assert event["dropped"] == {"steps": [16, 16], "records": {"train": 1}, "loss": [[16, dict(train)[16]]]}
    kinds = [(r["kind"], r["step"]) for r in records if r["kind"] != "startup"]
    at = kinds.index(("spike", 17))  # after checkpoint-15's records, before the step trained again
    assert kinds[at - 2: at + 2] == [("train", 15), ("checkpoint", 15), ("spike", 17), ("train", 16)]

    runs = out / "runs"
    (vdl,) = runs.glob("vdlrecords.*")
    reader = LogReader(file_path=str(vdl))
    tensorboard, _ = tracker_readers.tensorboard(runs)
    curves = {"visualdl": [(r.id, r.value) for r in reader.get_data("scalar", "train/loss")],
              "tensorboard": tensorboard["train/loss"]}
    spikes = {"visualdl": [r.id for r in reader.get_data("scalar", "spike/loss")],
              "tensorboard": [s for s, _ in tensorboard["spike/loss"]]}
    ((rows, _),) = tracker_readers.wandb_runs(out / "wandb").values()  # one run, rewound by the rollback (as synced)
    curves["wandb"] = [(row["train/global_step"], row["train/loss"]) for row in rows if "train/loss" in row]
    spikes["wandb"] = [row["train/global_step"] for row in rows if "spike/loss" in row]
    for tracker, curve in curves.items():
        assert [s for s, _ in curve] == list(range(1, 23)), tracker
        assert [v for _, v in curve] == pytest.approx([v for _, v in train]), tracker
        assert spikes[tracker] == [17], tracker
    history = _state(tmp_path, "checkpoint-20/trainer_state.json")["log_history"]
    assert [e["step"] for e in history if e["kind"] == "train"] == list(range(1, 21))
