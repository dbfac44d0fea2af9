"""fp16's loss scale across a resume: the checkpoint keeps the scaler's state, so a resumed run scales its steps
as the uninterrupted one (in-process through the real CLI entry, tiny model, CPU).

The scaler is Paddle's own, enabled on the CPU (`gpu_emulation.scaler_enabled_on_cpu`); the model computes in fp32
(Paddle ignores `auto_cast` on CPU), so fp16's range is emulated where it decides: a scaled gradient past fp16's
largest value is inf, as an fp16 backward leaves it. Started at 2^22, the first steps overflow: each is counted with
no update and halves the scale, until the scaled gradients fit. A resume that started the scale again at 2^22 would
overflow again, dropping updates the uninterrupted run made."""
import json

import numpy as np
import pytest
from safetensors.numpy import load_file

import gpu_emulation as emu
from e2e_helpers import write_config
from pretrain_cli.cli import main as cli_main

START = 2.0 ** 22
FP16_MAX = 65504.0
PADDLES_ADAMW = {"cpu_fused_optimizer": False}  # the optimizer an fp16 run steps: the scaler's found_inf skips it


@pytest.fixture
def fp16(monkeypatch):
    """Every layout the run builds gets an fp16 loss scaler starting at START, whose scaled gradients have fp16's
    range (the run's precision otherwise fp32)."""
    from pretrain_cli.run_config import Precision
    from pretrain_cli.training import precision, run

    def build_amp(model, optimizer, _precision):
        with emu.scaler_enabled_on_cpu():
            return precision.build_amp(model, optimizer, Precision("float16", "O1", loss_scale=START))

    real = precision.Amp.unscale

    def unscale(amp, optimizer):
        for p in optimizer._parameter_list:
            if p.grad is not None:
                g = p.grad.numpy()
                p.grad.set_value(np.where(np.abs(g) > FP16_MAX, np.inf, g).astype(g.dtype))
        real(amp, optimizer)

    monkeypatch.setattr(run, "build_amp", build_amp)
    monkeypatch.setattr(precision.Amp, "unscale", unscale)


def _state(out, name):
    return json.loads((out / name / "trainer_state.json").read_text())


def _train(out):
    """Each step's loss and gradient norm (NaN on an overflow step) as their exact reprs."""
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: (repr(r["loss"]), repr(r["grad_norm"])) for r in lines if r["kind"] == "train"}


def test_a_resumed_fp16_run_keeps_the_lowered_scale_and_matches_the_uninterrupted_one(corpus, tmp_path, fp16):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    common = dict(max_steps=10, save_steps=5, decay_steps=10, **PADDLES_ADAMW)
    assert cli_main(["train", write_config(a, corpus, **common)]) == 0
    uninterrupted = _train(a / "out")
    overflowed = [s for s, (_, norm) in uninterrupted.items() if norm == "nan"]
    before = [s for s in overflowed if s <= 5]
    at5 = _state(a / "out", "checkpoint-5")["loss_scaler"]
    assert before and at5["scale"] == START / 2 ** len(before) < START  # the scale had dropped by the save
    assert at5 == {"scale": at5["scale"], "incr_count": 5 - before[-1], "decr_count": 0}
    cfg_b = write_config(b, corpus, **common)
    assert cli_main(["train", cfg_b, "--max_steps", "5"]) == 0
    assert cli_main(["train", cfg_b]) == 0  # resumes from checkpoint-5
    assert _state(b / "out", "checkpoint-10")["loss_scaler"] == _state(a / "out", "checkpoint-10")["loss_scaler"]
    assert _train(b / "out") == uninterrupted  # every step's loss and gradient norm, bit for bit
    wa, wb = load_file(str(a / "out" / "model.safetensors")), load_file(str(b / "out" / "model.safetensors"))
    assert all(np.array_equal(wa[k], wb[k]) for k in wa)


def test_a_checkpoint_without_the_scale_resumes_from_loss_scale_with_one_note(corpus, tmp_path, fp16, capsys):
    """A checkpoint written before the scale was kept (or without fp16): the scaler starts at `loss_scale`, as it
    did, and the log says so once."""
    cfg = write_config(tmp_path, corpus, max_steps=6, save_steps=3, decay_steps=6, **PADDLES_ADAMW)
    assert cli_main(["train", cfg, "--max_steps", "3"]) == 0
    path = tmp_path / "out" / "checkpoint-3" / "trainer_state.json"
    state = json.loads(path.read_text())
    assert state.pop("loss_scaler")["scale"] < START
    path.write_text(json.dumps(state))
    capsys.readouterr()
    assert cli_main(["train", cfg]) == 0
    text = "".join(capsys.readouterr())
    assert text.count("holds no fp16 loss scale") == 1
    assert f"{path} holds no fp16 loss scale (written without fp16, or by a version that did not keep it); " \
           f"the scale goes on from {START:g}" in text
    assert "fp16 overflow, update skipped" in text.split("resumed from")[-1]  # the old behaviour, said


def test_a_bad_loss_scaler_entry_is_one_line(corpus, tmp_path, fp16, capsys):
    cfg = write_config(tmp_path, corpus, max_steps=4, save_steps=2, decay_steps=4, **PADDLES_ADAMW)
    assert cli_main(["train", cfg, "--max_steps", "2"]) == 0
    path = tmp_path / "out" / "checkpoint-2" / "trainer_state.json"
    state = json.loads(path.read_text())
    state["loss_scaler"]["scale"] = -1.0
    path.write_text(json.dumps(state))
    capsys.readouterr()
    assert cli_main(["train", cfg]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(f"error: {path}: `loss_scaler` is not a positive finite scale") and \
        err[-1].endswith("resume from another checkpoint")


def test_a_spike_rollback_takes_the_checkpoints_scale_too(corpus, tmp_path, fp16, monkeypatch):
    """The rollback reloads checkpoint-5: its loss scale and counts, not the ones the steps since left (two more
    finite steps counted, or a scale lowered since)."""
    from pretrain_cli.training import spike

    fired, after, shapes = [], [], []

    def check(guard, stats, loss, norm):  # one spike, at the second finite step after the save's
        if not fired and stats.get("n", 0) >= 2:
            fired.append(True)
            return "a spike (test)"
        return None

    real = spike.SpikePolicy.handle

    def handle(policy, trainer, *args):
        reloaded = real(policy, trainer, *args)
        after.append(trainer.amp.state_dict())
        shapes.append(trainer.amp.scaler._scale.shape)  # 0-D: `GradScaler._update`'s float(scale) on an overflow
        return reloaded

    monkeypatch.setattr(spike.SpikeGuard, "check", check)
    monkeypatch.setattr(spike.SpikePolicy, "handle", handle)
    cfg = write_config(tmp_path, corpus, max_steps=10, save_steps=5, decay_steps=10, spike_policy="rollback",
                       spike_warmup_steps=1, **PADDLES_ADAMW)
    assert cli_main(["train", cfg]) == 0
    (event,) = [r for r in map(json.loads, (tmp_path / "out" / "metrics.jsonl").open()) if r["kind"] == "spike"]
    assert event["action"] == "rollback" and event["checkpoint_step"] == 5 < event["step"]
    assert after == [_state(tmp_path / "out", "checkpoint-5")["loss_scaler"]] and shapes == [[]]
