"""Lines a MoE user met on the README's walk (W1) that said less than they could: `check` named a preset by the
package directory that holds it, `plan --device H100` of the tiny MoE printed "ETA 0.00 h" and "19.7x sooner" beside
a note saying the speed model does not hold for a model that small, and a resume's "no eval_iters makes 24" did
not name the per_device_eval_batch_size that does."""
from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

from data_helpers import write_tokens
from run_helpers import BASE, model_config, resolve_run
from test_resume_notes import _checkpoint, _Splits

from pretrain_cli import cli
from pretrain_cli.planning import hardware

ROOT = Path(__file__).resolve().parents[2]


def test_check_names_a_preset_as_typed_not_its_package_directory(tmp_path, capsys):
    """'model: qwen2_moe from .../src/pretrain_cli/config/presets/micro-qwen2-moe': a path the user never typed."""
    for typed, said in (("micro-qwen2-moe", "preset micro-qwen2-moe"),
                        ("Qwen/Qwen2-0.5B", "preset qwen2-0.5b (Qwen/Qwen2-0.5B)")):
        assert cli.main(["check", "--model_name_or_path", typed, "--input_dir", write_tokens(tmp_path / "docs"),
                         "--output_dir", str(tmp_path / "out"), "--do_train", "--max_steps", "2", "--device", "cpu",
                         "--num_hidden_layers", "1"]) == 0
        out = capsys.readouterr().out
        [line] = [x for x in out.splitlines() if x.startswith("  model: ")]
        assert f" from {said} (" in line and "presets/" not in line, line


def test_a_local_model_directory_is_still_named_by_its_path(tmp_path, capsys):
    import shutil

    from pretrain_cli.config.presets import PRESET_DIR

    local = tmp_path / "mine"
    shutil.copytree(PRESET_DIR / "micro-qwen2", local)
    assert cli.main(["check", "--model_name_or_path", str(local), "--input_dir", write_tokens(tmp_path / "docs"),
                     "--output_dir", str(tmp_path / "out"), "--do_train", "--max_steps", "2", "--device", "cpu"]) == 0
    assert f"  model: qwen2 from {local} (" in capsys.readouterr().out


def _plan_lines(monkeypatch, capsys, *extra: str) -> list[str]:
    monkeypatch.chdir(ROOT)
    assert cli.main(["plan", "configs/qwen3-moe-tiny_cpu.json", "--device", "H100", *extra]) == 0
    return capsys.readouterr().out.splitlines()


def test_a_run_under_a_minute_has_its_eta_in_seconds_and_no_speed_up_out_of_the_speed_models_range(monkeypatch,
                                                                                                     capsys):
    """The tiny MoE's 200 steps on an H100: 'ETA ... = 0.00 min' and the fp32 note's 'ETA 0.00 h ... 19.7x sooner',
    beside the note that the FLOPs model does not hold for it (its ETA far too optimistic): a ratio of two such
    times says nothing true of bf16 there."""
    lines = _plan_lines(monkeypatch, capsys)
    assert any(x.startswith("  note: speed: this model is too small for the FLOPs model") for x in lines)
    [eta] = [x for x in lines if x.startswith("ETA: ")]
    assert re.search(r"= \d+\.\d\d s$", eta) and "0.00 min" not in eta, eta
    [fp32] = [x for x in lines if "sets neither bf16 nor fp16" in x]
    assert "x sooner" not in fp32 and "0.00 h" not in fp32 and "ETA" not in fp32, fp32
    assert ("`bf16: true` (with `fp16_opt_level: O2` for half-precision weights) trains on its 989 TFLOPS bf16 tensor "
            "cores; how much sooner is not said: the speed model does not hold for this model (the speed note): "
            "time a few steps of each") in fp32, fp32


def test_the_fp32_notes_times_are_in_a_readable_unit():
    """Within the speed model's range, a short run's two ETAs are in seconds or minutes, not '0.00 h'."""
    from pretrain_cli.planning.speed import fp32_on_gpu_note

    h100 = hardware.lookup("H100")
    for hours, said in ((10.0, "ETA 10.00 h"), (0.5, "ETA 30.00 min"), (20 / 3600, "ETA 20.00 s")):
        r = SimpleNamespace(eta_hours=hours, eta_traffic_hours=0.0, mfu=0.3, device=SimpleNamespace(peak_tflops=67.0),
                            measured_mfu=None, notes=())
        [note] = fp32_on_gpu_note(h100, r, None, False, 0.4)
        assert f"(67 TFLOPS non-tensor-core, {said})" in note and "x sooner" in note, note
    assert "ETA 1.02 s at MFU 0.40" in note, note  # 20 s x (67 x 0.3) / (989 x 0.4)


def _resumed_eval_note(tmp_path, saved: list[str], world_was: int, world: int, train=("2", "2")) -> str:
    from pretrain_cli.config.parser import parse_config
    from pretrain_cli.config.resolve import resolve
    from pretrain_cli.orchestration.resumed import keep_global_batch
    from pretrain_cli.run_config import Target

    tmp_path.mkdir()
    common = ["--per_device_train_batch_size", train[0], "--gradient_accumulation_steps", train[1], "--do_eval",
              "true", *saved]
    ckpt = _checkpoint(tmp_path, resolve_run(*common, world=world_was), 5)
    cfg, args = model_config(), parse_config(None, [*BASE, *common])
    run = keep_global_batch(args, resolve(args, cfg, Target("cpu", world)), cfg, Target("cpu", world), ckpt,
                            _Splits(list(range(24))))
    [note] = [n for n in run.notes if n.startswith("eval: checkpoint-5")]
    return note


def test_no_eval_iters_names_the_eval_batch_that_keeps_the_windows(tmp_path):
    """W1: checkpoint-40 evaluated 8 x eval_iters 3 on 1 rank = 24 windows (the whole valid split); on 2 ranks
    eval_iters makes 16 or 32, never 24, and per_device_eval_batch_size 4 makes 24 again."""
    note = _resumed_eval_note(tmp_path / "a", ["--per_device_eval_batch_size", "8", "--eval_iters", "3"], 1, 2)
    assert note == ("eval: checkpoint-5's run evaluated 24 windows; this one evaluates 48 (eval_iters x "
                    "per_device_eval_batch_size x 2 data ranks), which no eval_iters makes 24; "
                    "per_device_eval_batch_size 4 does (4 x eval_iters 3 x 2 data ranks = 24, the windows of "
                    "checkpoint-5's run): set it, or the eval curve is not comparable across the resume (its losses "
                    "average other windows)"), note


def test_where_eval_iters_must_change_too_both_are_named_and_where_nothing_splits_it_is_said(tmp_path):
    """12 windows (4 x eval_iters 1 on 3 ranks) on 2 ranks: 6 a rank, which eval_iters 1 cannot read in batches
    of 4 and no larger batch is named (it may not fit): 3 x eval_iters 2. On 5 ranks 12 does not split at all."""
    saved = ["--per_device_eval_batch_size", "4", "--eval_iters", "1"]
    note = _resumed_eval_note(tmp_path / "a", saved, 3, 2)
    assert ("which no eval_iters makes 12; per_device_eval_batch_size 3 with eval_iters 2 does (3 x eval_iters 2 x "
            "2 data ranks = 12, the windows of checkpoint-5's run)") in note, note
    note = _resumed_eval_note(tmp_path / "b", saved, 3, 5, ("1", "5"))  # (15 sequences a step: 5 ranks split them)
    assert ("which no eval_iters or per_device_eval_batch_size makes 12 on 5 data ranks (12 windows do not split "
            "over them): the eval curve is not comparable across the resume") in note, note
