"""Training keys on the command line of a command they change nothing in: `eval --learning_rate 3` was taken and
ignored (the user thinks it mattered). `eval` and `generate` refuse the keys that change nothing they compute, in one
line naming them and the ones they take; `export` and `inspect-data`, which take no training key, name a training
key as one (not as any unrecognised argument). Nothing is loaded before the line."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from pretrain_cli import cli
from pretrain_cli.config.presets import resolve_model_dir


@pytest.fixture
def run_dir(tmp_path):
    """A directory a run wrote, as far as the commands look before loading anything: its args.json and config.json."""
    d = tmp_path / "run"
    d.mkdir()
    arguments = {"model_name_or_path": "micro-llama", "input_dir": str(tmp_path / "data"), "output_dir": str(d),
                 "max_seq_length": 16, "do_train": True}
    (d / "args.json").write_text(json.dumps({"version": "test", "arguments": arguments, "user_arguments": arguments,
                                             "run": {"parallel": {"dp_degree": 1, "sharding_degree": 1}}}))
    shutil.copy(Path(resolve_model_dir("micro-llama")) / "config.json", d / "config.json")
    return str(d)


def _error(capsys, *argv) -> str:
    assert cli.main(list(argv)) == 2, argv
    return capsys.readouterr().err.strip().splitlines()[-1]


def test_eval_and_generate_refuse_a_training_key_that_changes_nothing_they_compute(run_dir, tmp_path, capsys):
    split = _error(capsys, "eval", "--model", run_dir, "--learning_rate", "3", "--weight_decay", "0.1")
    assert split.startswith("error: --learning_rate, --weight_decay: training keys that change nothing eval "
                            "computes; drop them (eval's --key value overrides take the kernel keys: "
                            "use_flash_attention"), split
    assert "recompute, recompute_granularity, fp16, bf16, fp16_opt_level; and max_seq_length" in split
    assert "eval_iters" in split and "split" in split  # a run's split: its data and eval batches count
    windows = _error(capsys, "eval", "--model", run_dir, "--data", str(tmp_path / "none"), "--eval_iters", "3")
    assert windows.startswith("error: --eval_iters: a training key that changes nothing eval computes; drop it"), windows
    assert windows.endswith("; and max_seq_length, attention_mask_type, reset_position_ids)"), windows
    generate = _error(capsys, "generate", "--model", run_dir, "--prompt", "x", "--max_steps", "5")
    assert generate.startswith("error: --max_steps: a training key that changes nothing generate computes"), generate


def test_the_keys_that_count_pass_under_any_of_their_names(run_dir, tmp_path, capsys):
    """The kernel keys (PaddleFormers' attn_impl for use_flash_attention, a --no_ flag) pass the check: the command
    goes on to its next error here (no tokenizer files, no token file)."""
    for argv in (["generate", "--model", run_dir, "--prompt", "x", "--attn_impl", "eager", "--no_cpu_fused_ops"],
                 ["eval", "--model", run_dir, "--data", str(tmp_path / "none"), "--use_flash_attention", "false"]):
        line = _error(capsys, *argv)
        assert "changes nothing" not in line and "--key value" not in line, line


def test_export_and_inspect_data_name_a_training_key_as_one(tmp_path, capsys):
    for argv, prog in ((["export", str(tmp_path / "c"), str(tmp_path / "o"), "--learning_rate", "3"], "export"),
                       (["inspect-data", str(tmp_path / "p"), "--max_steps", "5", "--warmup_steps", "2"],
                        "inspect-data")):
        line = _error(capsys, *argv)
        key = "--learning_rate: a training key" if prog == "export" else "--max_steps, --warmup_steps: training keys"
        assert line.startswith(f"error: {key}, which `pretrain-cli {prog}` does not take"), line
    assert "unrecognized arguments: --bogus 1" in _error(capsys, "export", "a", "b", "--bogus", "1")


def test_an_idle_kernel_keys_reasons_are_the_notes_naming_it_as_a_word(monkeypatch):
    """`--fp16 true` took fp16_opt_level's notes too (a substring match): a note counts where it names the key as
    a word, said of either value (the one given, the one in effect without it)."""
    from pretrain_cli.config import compute
    from pretrain_cli.orchestration.recorded import idle_kernel_keys

    def kernels_for(args, target, notes=None, problems=None):
        if notes is not None:
            notes += ["fp16_opt_level: O2 noted", "precision: fp16 is not applicable on cpu", "fp16: said"]
        return "fp32"

    monkeypatch.setattr(compute, "kernels_for", kernels_for)
    notes = idle_kernel_keys({"fp16": True}, lambda tokens: {"fp16": bool(tokens)}, ["--fp16", "true"], "eval")
    assert notes == ["note: --fp16 true: changes no kernel eval runs on cpu (precision: fp16 is not applicable on "
                     "cpu; fp16: said): it runs as it would without it"]
