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
    """Every layout the run builds gets an fp16 loss scaler starting at the run's scale_loss (START where
    `_config` writes the file), whose scaled gradients have fp16's range (the run's precision otherwise fp32)."""
    from pretrain_cli.run_config import Precision
    from pretrain_cli.training import precision, run

    def build_amp(model, optimizer, given):
        with emu.scaler_enabled_on_cpu():
            return precision.build_amp(model, optimizer, Precision("float16", "O1", loss_scale=given.loss_scale))

    real = precision.Amp.unscale

    def unscale(amp, optimizer):
        for p in optimizer._parameter_list:
            if p.grad is not None:
                g = p.grad.numpy()
                p.grad.set_value(np.where(np.abs(g) > FP16_MAX, np.inf, g).astype(g.dtype))
        real(amp, optimizer)

    monkeypatch.setattr(run, "build_amp", build_amp)
    monkeypatch.setattr(precision.Amp, "unscale", unscale)


def _config(path, corpus, **overrides):
    return write_config(path, corpus, scale_loss=START, **PADDLES_ADAMW, **overrides)


def _state(out, name):
    return json.loads((out / name / "trainer_state.json").read_text())


def _train(out):
    """Each step's loss and gradient norm (NaN on an overflow step) as their exact reprs."""
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: (repr(r["loss"]), repr(r["grad_norm"])) for r in lines if r["kind"] == "train"}


def test_a_resumed_fp16_run_keeps_the_lowered_scale_and_matches_the_uninterrupted_one(corpus, tmp_path, fp16):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    common = dict(max_steps=10, save_steps=5, decay_steps=10)
    assert cli_main(["train", _config(a, corpus, **common)]) == 0
    uninterrupted = _train(a / "out")
    overflowed = [s for s, (_, norm) in uninterrupted.items() if norm == "nan"]
    before = [s for s in overflowed if s <= 5]
    at5 = _state(a / "out", "checkpoint-5")["loss_scaler"]
    assert before and at5["scale"] == START / 2 ** len(before) < START  # the scale had dropped by the save
    assert at5 == {"scale": at5["scale"], "incr_count": 5 - before[-1], "decr_count": 0}
    cfg_b = _config(b, corpus, **common)
    assert cli_main(["train", cfg_b, "--max_steps", "5"]) == 0
    assert cli_main(["train", cfg_b]) == 0  # resumes from checkpoint-5
    assert _state(b / "out", "checkpoint-10")["loss_scaler"] == _state(a / "out", "checkpoint-10")["loss_scaler"]
    assert _train(b / "out") == uninterrupted  # every step's loss and gradient norm, bit for bit
    wa, wb = load_file(str(a / "out" / "model.safetensors")), load_file(str(b / "out" / "model.safetensors"))
    assert all(np.array_equal(wa[k], wb[k]) for k in wa)


def test_a_checkpoint_without_the_scale_resumes_from_loss_scale_with_one_note(corpus, tmp_path, fp16, capsys):
    """A checkpoint written before the scale was kept (or without fp16): the scaler starts at `loss_scale`, as it
    did, and the log says so once."""
    cfg = _config(tmp_path, corpus, max_steps=6, save_steps=3, decay_steps=6)
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


@pytest.mark.parametrize("entry, wrong", [
    ({"scale": 1e39, "incr_count": 0, "decr_count": 0}, "scale 1e+39 is not a finite, positive, normal float32"),
    ({"scale": 1e-50, "incr_count": 0, "decr_count": 0}, "scale 1e-50 is not"),
    ({"scale": 2.0 ** -127, "incr_count": 0, "decr_count": 0}, "scale 5.877471754111438e-39 is not"),  # subnormal
    ({"scale": float("nan"), "incr_count": 0, "decr_count": 0}, "scale nan is not"),
    ({"scale": -1.0, "incr_count": 0, "decr_count": 0}, "scale -1.0 is not"),
    ({"scale": True, "incr_count": 0, "decr_count": 0}, "scale True is not"),
    ({"scale": "8", "incr_count": 0, "decr_count": 0}, "scale '8' is not"),
    ({"scale": 8.0, "incr_count": True, "decr_count": 0}, "incr_count True is not an integer >= 0"),
    ({"scale": 8.0, "incr_count": 1.5, "decr_count": 0}, "incr_count 1.5 is not"),
    ({"scale": 8.0, "incr_count": 0, "decr_count": -1}, "decr_count -1 is not"),
    ({"scale": 8.0, "incr_count": 0}, "decr_count None is not"),
    ([8.0, 0, 0], "[8.0, 0, 0] is not an object of scale, incr_count and decr_count"),
])
def test_a_bad_loss_scaler_entry_is_judged_with_the_trainer_state(tmp_path, entry, wrong):
    """The one reader of a trainer state judges the entry, so every resume (and `check`) meets it before a run writes
    anything: past float32's range the scale would load as inf, below its normal range as 0 or a subnormal."""
    from pretrain_cli.errors import UserError
    from pretrain_cli.storage.checkpoint_dir import read_state

    path = tmp_path / "trainer_state.json"
    path.write_text(json.dumps({"global_step": 2, "consumed_samples": 8, "loss_scaler": entry}))
    with pytest.raises(UserError) as e:
        read_state(tmp_path)
    assert str(e.value).startswith(f"{path}: `loss_scaler`: {wrong}") and str(e.value).endswith(
        " (delete the entry to start the scale at scale_loss); resume from another checkpoint")


@pytest.mark.parametrize("entry", [{"scale": 32768, "incr_count": 0, "decr_count": 3},
                                   {"scale": 2.0 ** -126, "incr_count": 5, "decr_count": 0},
                                   {"scale": 3.4028234663852886e38, "incr_count": 0, "decr_count": 0}])
def test_a_float32_scale_and_integer_counts_are_read(tmp_path, entry):
    from pretrain_cli.storage.checkpoint_dir import read_state

    (tmp_path / "trainer_state.json").write_text(json.dumps({"global_step": 2, "consumed_samples": 8,
                                                             "loss_scaler": entry}))
    assert read_state(tmp_path)["loss_scaler"] == entry


def _spoil(ckpt, **entry):
    path = ckpt / "trainer_state.json"
    state = json.loads(path.read_text())
    state["loss_scaler"].update(entry)
    path.write_text(json.dumps(state))
    return path


def test_a_bad_loss_scaler_entry_is_skipped_for_the_previous_checkpoint(corpus, tmp_path, fp16, capsys):
    """As any other damage to a trainer state: `check` and the resume say it and take the checkpoint before."""
    cfg = _config(tmp_path, corpus, max_steps=6, save_steps=2, decay_steps=6)
    assert cli_main(["train", cfg, "--max_steps", "4"]) == 0
    path = _spoil(tmp_path / "out" / "checkpoint-4", scale=1e39)
    skipped = (f"not resuming from checkpoint-4: {path}: `loss_scaler`: scale 1e+39 is not a finite, positive, "
               f"normal float32 (1.175e-38 to 3.403e+38) (delete the entry to start the scale at scale_loss); trying "
               f"the previous checkpoint")
    capsys.readouterr()
    assert cli_main(["check", cfg]) == 0
    assert skipped in "".join(capsys.readouterr())
    assert cli_main(["train", cfg]) == 0
    text = "".join(capsys.readouterr())
    assert skipped in text and f"resumed from {tmp_path / 'out' / 'checkpoint-2'} at step 2" in text
    assert _state(tmp_path / "out", "checkpoint-6")["global_step"] == 6


def test_a_named_checkpoint_with_a_bad_entry_is_refused_before_output_dir_is_touched(corpus, tmp_path, fp16,
                                                                                      capsys):
    cfg = _config(tmp_path, corpus, max_steps=4, save_steps=2, decay_steps=4)
    assert cli_main(["train", cfg, "--max_steps", "2"]) == 0
    out = tmp_path / "out"
    path = _spoil(out / "checkpoint-2", incr_count=True)
    records = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    assert {"args.json", "metrics.jsonl", "all_results.json"} <= set(records)
    capsys.readouterr()
    assert cli_main(["train", cfg, "--resume_from_checkpoint", str(out / "checkpoint-2")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == (f"error: resume_from_checkpoint: {path}: `loss_scaler`: incr_count True is not an integer >= 0 "
                       f"(delete the entry to start the scale at scale_loss); name a complete checkpoint-N, or remove "
                       f"the key to resume from the newest complete one")
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == records


def test_a_bad_entry_stops_no_reader_of_the_weights_alone(corpus, tmp_path, fp16, capsys):
    """`export` reads a checkpoint's weights, never its loss scale: a bad entry refused it (review R9 on f6437ec7)
    while `eval` read the same weights. A resume still refuses it (`intact.problem`)."""
    from safetensors.numpy import load_file as load

    from pretrain_cli.storage import intact

    cfg = _config(tmp_path, corpus, max_steps=2, save_steps=2, decay_steps=2)
    assert cli_main(["train", cfg]) == 0
    ckpt = tmp_path / "out" / "checkpoint-2"
    path = _spoil(ckpt, scale=-1.0)
    assert intact.problem(ckpt).startswith(f"{path}: `loss_scaler`: scale -1.0 is not a finite")
    assert intact.export_problem(ckpt) is None
    capsys.readouterr()
    assert cli_main(["export", str(ckpt), str(tmp_path / "exported")]) == 0, capsys.readouterr().err
    got, final = load(str(tmp_path / "exported" / "model.safetensors")), load(str(tmp_path / "out" /
                                                                                  "model.safetensors"))
    assert sorted(got) == sorted(final) and all(np.array_equal(got[k], final[k]) for k in final)


def test_a_changed_scale_loss_is_said_and_the_checkpoints_scale_goes_on(corpus, tmp_path, fp16, capsys):
    """scale_loss is where a run's scale starts; a resume goes on from the checkpoint's, and says so once where the
    run gives another scale_loss than the checkpoint's run was given."""
    cfg = _config(tmp_path, corpus, max_steps=6, save_steps=3, decay_steps=6)
    assert cli_main(["train", cfg, "--max_steps", "3"]) == 0
    at3 = _state(tmp_path / "out", "checkpoint-3")["loss_scaler"]
    assert at3["scale"] < START
    capsys.readouterr()
    assert cli_main(["train", cfg, "--scale_loss", "1024"]) == 0
    text = "".join(capsys.readouterr())
    path = tmp_path / "out" / "checkpoint-3" / "trainer_state.json"
    assert text.count("differs from") == 1 and (
        f"note: scale_loss 1024 differs from the {START:g} checkpoint-3's run was given: the scale goes on from the "
        f"checkpoint's {at3['scale']:g} (scale_loss is where a run's scale starts); to start at 1024, delete "
        f"`loss_scaler` from {path}") in text


@pytest.mark.parametrize("rebuilds", [False, True])
def test_a_spike_rollback_takes_the_checkpoints_scale_too(corpus, tmp_path, fp16, monkeypatch, capsys, rebuilds):
    """The rollback reloads checkpoint-5: its loss scale and counts, not the ones the steps since left (two more
    finite steps counted, or a scale lowered since). `rebuilds`: the path of a layout of placed pieces (the
    semi-auto engine's), which builds the layout and its scaler again (`training.run.rebuild`), forced here in one
    process."""
    from pretrain_cli.config import resolve
    from pretrain_cli.training import spike

    if rebuilds:
        real_guard = resolve.SpikeGuardConfig
        monkeypatch.setattr(resolve, "SpikeGuardConfig",
                            lambda *args, **kw: real_guard(*args, **{**kw, "rollback_rebuilds": True}))

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
    cfg = _config(tmp_path, corpus, max_steps=10, save_steps=5, decay_steps=10, spike_policy="rollback",
                  spike_warmup_steps=1)
    assert cli_main(["train", cfg]) == 0
    (event,) = [r for r in map(json.loads, (tmp_path / "out" / "metrics.jsonl").open()) if r["kind"] == "spike"]
    assert event["action"] == "rollback" and event["checkpoint_step"] == 5 < event["step"]
    assert after == [_state(tmp_path / "out", "checkpoint-5")["loss_scaler"]] and shapes == [[]]
    assert ("rebuilding the model and its layout from checkpoint-5" in "".join(capsys.readouterr())) == rebuilds
