"""`pretrain-cli plan`: counts, JSON shape, the text report, its flags, notes and errors, and that it runs without
Paddle (how each memory lever moves the estimate: test_plan_memory_levers.py)."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from pretrain_cli.cli import main as cli_main
from pretrain_cli.errors import UserError
from plan_helpers import plan


def test_qwen_param_counts_and_flops(write_args):
    r = plan(write_args(), device="V100-16GB")
    assert round(r["params"]["total"] / 1e6, 1) == 494.0
    assert round(r["params"]["embedding"] / 1e6, 1) == 136.1
    assert r["params"]["total"] == r["params"]["embedding"] + r["params"]["non_embedding"]
    assert r["flops_per_token"]["model"] == pytest.approx(3.228e9, rel=1e-3)
    assert r["tokens_per_step"] == 1024 and r["total_tokens"] == 10_240_000
    assert r["precision"] == {"amp_dtype": "float16", "amp_level": "O2"}
    b = r["memory_breakdown_gib"]
    n = r["params"]["total"] / 2**30
    assert b["weights"] == pytest.approx(2 * n) and b["master_weights"] == pytest.approx(4 * n)
    assert b["optimizer_state"] == pytest.approx(8 * n) and b["gradients"] == pytest.approx(2 * n)
    assert r["memory_gib"] == pytest.approx(sum(b.values()))
    assert r["fits"] and r["suggestions"] == []
    assert r["checkpoint"]["kept"] == 2
    assert r["checkpoint"]["per_checkpoint_gib"] == pytest.approx(14 * n)
    # one process writes all of it; the save time is its bytes at the stated per-rank write rate
    assert r["checkpoint"]["per_rank_gib"] == pytest.approx(14 * n)
    assert r["checkpoint"]["save_seconds"] == pytest.approx(14 * n * 2**30 / 1e9 / r["checkpoint"]["disk_gb_per_s_per_rank"])


def test_json_output_fields(write_args, capsys):
    assert cli_main(["plan", write_args(), "--device", "A100-80GB", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    for key in ("params", "flops_per_token", "memory_gib", "memory_breakdown_gib", "fits", "suggestions",
                "eta_hours", "device"):
        assert key in out
    assert set(out["memory_breakdown_gib"]) >= {"weights", "gradients", "optimizer_state", "master_weights",
                                                "activations", "logits_loss", "framework"}
    assert out["device"]["peak_tflops"] == 312.0 and "hardware" in out["device"]["peak_source"]
    assert out["eta_hours"] == pytest.approx(10_240_000 * out["flops_per_token"]["model"] / (312e12 * 0.4) / 3600)


def test_text_report_and_overrides(write_args, capsys):
    assert cli_main(["plan", write_args(), "--device", "H100", "--max_seq_length", "2048"]) == 0
    text = capsys.readouterr().out
    assert "2,048 tokens/step" in text and "optimizer_state" in text and "TFLOPS" in text


def test_user_errors(write_args):
    with pytest.raises(UserError, match="unknown device 'Z80'; use one of"):
        plan(write_args(), device="Z80")
    with pytest.raises(UserError, match=r"unknown device 'H10' \(did you mean H100, H20 or A10\?\); use one of"):
        plan(write_args(), device="H10")  # a typo: the nearest names first
    with pytest.raises(UserError, match="--gpus"):
        plan(write_args(), gpus=0)
    with pytest.raises(UserError, match="pipeline_parallel_degree: 3 does not divide the world size 2"):
        plan(write_args(pipeline_parallel_degree=3), gpus=2)


def test_cpu_mode_is_fp32_without_framework_constant(write_args):
    r = plan(write_args(model_name_or_path="tiny-llama", max_seq_length=256), device="cpu", baseline_bytes=2**20)
    assert r["precision"]["amp_dtype"] == "float32"
    assert r["memory_breakdown_gib"]["framework"] == pytest.approx(1 / 1024)
    assert r["attention"] == "math"


def test_cpu_plan_models_the_attention_kernel_that_runs(write_args):
    """`use_flash_attention` on CPU runs the block-causal kernel only with the fused CPU kernels; with
    `cpu_fused_ops: false` Paddle's ops hold the scores, and plan (host_fit with it) counts them."""
    def cpu(**keys):
        return plan(write_args(model_name_or_path="tiny-llama", max_seq_length=512, **keys), device="cpu")
    light, off = cpu(use_flash_attention=True), cpu(use_flash_attention=True, cpu_fused_ops=False)
    math = cpu(use_flash_attention=False, cpu_fused_ops=False)
    assert light["attention"] == "flash" and off["attention"] == "math"
    assert off["memory_breakdown_gib"] == math["memory_breakdown_gib"]
    assert off["memory_breakdown_gib"]["activations"] > light["memory_breakdown_gib"]["activations"]


def test_plan_does_not_import_paddle(write_args):
    code = ("import sys; from pretrain_cli.cli import main; rc = main(['plan', sys.argv[1], '--json']); "
            "assert 'paddle' not in sys.modules, 'paddle imported'; sys.exit(rc)")
    out = subprocess.run([sys.executable, "-c", code, write_args()], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["params"]["total"] > 0


def test_bf16_without_bf16_hardware_is_a_warning_with_the_fix(write_args, capsys):
    cfg = write_args(bf16=True, fp16=False)
    for device in ("V100-16GB", "T4"):
        notes = [n for n in plan(cfg, device=device)["notes"] if n.startswith("bf16:")]
        assert len(notes) == 1 and device in notes[0] and "fp16: true" in notes[0], notes
    assert not [n for n in plan(cfg, device="A100-80GB")["notes"] if n.startswith("bf16:")]
    assert cli_main(["plan", cfg, "--device", "V100-16GB"]) == 0
    assert "note: bf16: WARNING: V100-16GB has no bf16" in capsys.readouterr().out


def test_peak_tflops_flag_wins_and_the_source_is_named(write_args, capsys, monkeypatch):
    cfg = write_args(bf16=True, fp16=False, peak_tflops=50.0)
    assert plan(write_args(bf16=True, fp16=False), device="A100-80GB")["device"]["peak_tflops"] == 312.0
    from_file = plan(cfg, device="A100-80GB")["device"]
    assert from_file["peak_tflops"] == 50.0 and from_file["peak_source"] == "peak_tflops in the argument file"
    flag = plan(cfg, device="A100-80GB", peak_tflops=123.0)
    assert flag["device"]["peak_tflops"] == 123.0 and flag["device"]["peak_source"] == "--peak_tflops on the command line"
    assert flag["eta_hours"] == pytest.approx(10_240_000 * flag["flops_per_token"]["model"] / (123e12 * 0.4) / 3600)
    from pretrain_cli.planning import hardware

    monkeypatch.setattr(hardware, "cpu_peak_tflops", lambda **kw: (None, "this CPU reports no clock or vector flags"))
    assert cli_main(["plan", write_args(), "--device", "cpu"]) == 0  # no peak known: the report says how to give one
    assert "ETA: unknown: no peak for this device and precision; pass --peak_tflops N" in capsys.readouterr().out
    assert cli_main(["plan", cfg, "--device", "cpu", "--peak_tflops", "2.5"]) == 0
    text = capsys.readouterr().out
    assert "peak: 2.5 TFLOPS per device, from --peak_tflops on the command line" in text and "ETA: unknown" not in text
    with pytest.raises(UserError, match="--peak_tflops"):
        plan(cfg, peak_tflops=0)


def test_hardware_flops_only_with_recompute(write_args, capsys):
    assert cli_main(["plan", write_args()]) == 0
    assert "hardware (with recompute)" not in capsys.readouterr().out
    assert cli_main(["plan", write_args(recompute=True)]) == 0
    assert "hardware (with recompute)" in capsys.readouterr().out


def test_new_user_notes_device_family_data_ranks_and_too_small_models(capsys):
    from pretrain_cli.cli import main as cli_main

    configs = Path(__file__).resolve().parents[2] / "configs"
    assert cli_main(["plan", str(configs / "demo_cpu.json"), "--device", "H100", "--gpus", "8"]) == 0
    text = capsys.readouterr().out
    assert "note: device: --device H100 is planned as H100-SXM (80 GiB" in text and "H100-PCIe" in text
    assert "note: speed: this model is too small for the FLOPs model (its matmuls are 128 wide" in text
    assert "world 8 = 8 data ranks x tp 1;" in text
    assert cli_main(["plan", str(configs / "demo_cpu.json"), "--device", "A100-80GB", "--gpus", "8",
                     "--sharding", "stage1"]) == 0
    text = capsys.readouterr().out
    assert "world 8 = 8 data ranks (one ZeRO stage-1 group of 8) x tp 1;" in text and "dp 1" not in text
    assert "is planned as" not in text  # a full table name needs no mapping note
    assert cli_main(["plan", str(configs / "llama-3.2-1b_pretrain.json"), "--device", "A100-80GB"]) == 0
    assert "too small for the FLOPs model" not in capsys.readouterr().out


def test_a_mistyped_local_model_directory_names_the_nearest_one(tmp_path, monkeypatch):
    from pretrain_cli.config.presets import resolve_model_dir

    (tmp_path / "demo" / "output").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError) as e:
        resolve_model_dir("demo/outptu", key="--model")
    assert e.value.lines == ["--model: the directory demo/outptu does not exist; did you mean demo/output?"]
    with pytest.raises(UserError, match="huggingface-cli download Qwen/Qwen2.5-Coder-7B"):  # a hub name that is no preset keeps its hint
        resolve_model_dir("Qwen/Qwen2.5-Coder-7B", key="--model")


def test_the_command_checks_its_flags_once_per_plan_and_per_fit(write_args, monkeypatch, capsys):
    """`plan` and `plan --fit` check --device/--gpus/--mfu/--margin once, not again per suggestion or candidate
    (`orchestration.planned.plan` trusts them)."""
    from pretrain_cli.orchestration import plan_options

    calls, real = [], plan_options.check_flags
    monkeypatch.setattr(plan_options, "check_flags", lambda *a, **k: calls.append(a) or real(*a, **k))
    cfg = write_args(per_device_train_batch_size=64)  # does not fit a T4: suggestions re-plan several layouts
    assert cli_main(["plan", cfg, "--device", "T4"]) == 0
    assert "suggestions" in capsys.readouterr().out.lower() and len(calls) == 1
    cli_main(["plan", cfg, "--device", "T4", "--fit", "--json"])
    assert len(json.loads(capsys.readouterr().out)["diff"]) > 0 and len(calls) == 2
