"""`plan` on a MoE run's `capacity_factor`: one line in the words of the run's own experts line with what memory and
time plan per expert, and the memory and speed models computing what the training forward computes (at most the
capacity an expert; the evaluation dropless)."""
import dataclasses
from pathlib import Path

import pytest

from pretrain_cli.config.presets import PRESET_DIR
from pretrain_cli.models.config import ModelConfig
from pretrain_cli.orchestration.planned import from_file
from pretrain_cli.planning import hardware
from pretrain_cli.planning import experts
from pretrain_cli.planning.experts import assignments, capacity_ratio, capacity_words, padded_rows
from pretrain_cli.planning.memory import Setup
from pretrain_cli.planning.report import format_report

TINY = str(Path(__file__).resolve().parents[2] / "configs" / "qwen3-moe-tiny_cpu.json")  # b 8 x s 256, top-4 of 16


@pytest.fixture(autouse=True)
def machine(monkeypatch):
    monkeypatch.setattr(hardware, "cpu_memory_gib", lambda: 64.0)
    monkeypatch.setattr(hardware, "host_available_gib", lambda: 64.0)


def _plan(factor: float, device: str = "cpu"):
    return from_file(TINY, ["--capacity_factor", str(factor)], device=device)


def _line(r) -> str:
    (line,) = [x for x in format_report(r).splitlines() if x.startswith("  capacity:")]
    return line


def test_plan_says_the_capacity_as_the_run_does_and_what_it_plans_per_expert():
    """2,048 tokens x top-4 over 16 experts: 512 each at balance; 1.25 keeps 640 (nothing dropped at balance), 0.5
    keeps 256, which memory and time then plan; dropless says so. The words are the run's experts line's."""
    words = capacity_words(1.25, 2048, 4, 16)
    assert words.startswith("capacity_factor 1.25: an expert computes at most 640 of a micro-batch's 8,192 assignments")
    assert _line(_plan(1.25)) == (f"  capacity: {words}; memory and time plan 512 assignments a micro-batch per "
                                  f"expert, its balanced share (balanced routing, within the capacity)")
    assert _line(_plan(0.5)).endswith("memory and time plan 256 assignments a micro-batch per expert, the capacity, "
                                      "50% of its balanced share")
    assert _line(_plan(0)) == ("  capacity: capacity_factor 0 (dropless: every assignment computed); memory and time "
                               "plan 512 assignments a micro-batch per expert, its balanced share (balanced routing)")
    assert not any(x.startswith("  capacity:") for x in format_report(from_file(
        str(Path(TINY).with_name("tiny_cpu.json")), [], device="cpu")).splitlines())  # a dense model: none


def test_counts_are_said_in_full_at_a_large_micro_batch():
    """Qwen2-57B-A14B at 4 x 32,768 tokens, top-8 of 64: 16,384 assignments an expert at balance, said so in the
    capacity line and the run's experts line alike (`:.4g` said 1.638e+04); a share that is not whole to a tenth."""
    r = from_file(TINY, ["--model_name_or_path", "Qwen/Qwen2-57B-A14B", "--per_device_train_batch_size", "4",
                         "--max_seq_length", "32768", "--capacity_factor", "1.25", "--bf16", "true"],
                  device="H100", gpus=64, suggest_changes=False)
    words = capacity_words(1.25, 131072, 8, 64)
    assert words == ("capacity_factor 1.25: an expert computes at most 20,480 of a micro-batch's 1,048,576 "
                     "assignments (131,072 tokens x top-8; 16,384 each at balance), the rest dropped (evaluation is "
                     "dropless)")
    assert r.to_json()["capacity"]["words"] == words
    assert _line(r) == (f"  capacity: {words}; memory and time plan 16,384 assignments a micro-batch per expert, its "
                        f"balanced share (balanced routing, within the capacity)")
    assert "; 0.5 each at balance)" in capacity_words(1, 16, 2, 64)


def test_a_capacity_below_the_balanced_share_is_said_whole():
    """Qwen1.5-MoE-A2.7B at 2,000 tokens, top-4 of 60, factor 0.9: the capacity, 960, was planned as 960.0 (the
    balanced share x its kept share, 960.0000000000001); a count within rounding of a whole one is said whole."""
    r = from_file(TINY, ["--model_name_or_path", "Qwen/Qwen1.5-MoE-A2.7B", "--max_seq_length", "2000",
                         "--capacity_factor", "0.9"], device="H100", suggest_changes=False)
    assert r.to_json()["capacity"]["per_expert"] == 960
    assert _line(r).endswith("; 1,066.7 each at balance), the rest dropped (evaluation is dropless); memory and time "
                             "plan 960 assignments a micro-batch per expert, the capacity, 90% of its balanced share")
    assert assignments(119.99999) == "120" and assignments(1066.6666) == "1,066.7"


def test_memory_counts_the_rows_the_capacity_leaves():
    """The CPU's padded path pads every expert to the busiest one's rows (1.10 a routed row at 512 an expert, balanced
    routing); under a capacity it pads to, an untrained router fills the busiest expert to it (measured: 11 of 12
    layers at 1.25), so the GEMMs run the capacity's rows: 1 a routed row at factor 1, 1.25 at 1.25 (more than
    dropless). A factor above the padding (2) changes nothing, 0.5 halves the routed rows; the evaluation stays
    dropless."""
    act = {f: _plan(f).memory_breakdown_gib["activations"] for f in (0, 2, 1.25, 1, 0.5)}
    assert act[2] == act[0] and act[1.25] > act[0] > act[1] > act[0.5]
    assert _plan(0.5).eval_breakdown_gib == _plan(0).eval_breakdown_gib
    s = Setup(model=ModelConfig.from_file(str(PRESET_DIR / "micro-qwen3-moe")), micro_batch=8, seq_len=128,
              device="cpu", capacity_factor=1.25)
    assert padded_rows(s) == capacity_ratio(s) == 1.25


def test_an_fp16_gpu_runs_the_cpus_path(monkeypatch):
    """`batched_gemm` has no fp16 kernel: an fp16 run on a GPU (V100, T4) pads as the CPU does (`ops.grouped.
    batched_gemm_runs`, the rule `grouped_mlp_gpu` follows); in bf16 or fp32 the segments run as they are. `plan`
    hands the run's amp dtype to the rule: an fp16 file planned on a T4 pads."""
    cfg = ModelConfig.from_file(str(PRESET_DIR / "micro-qwen3-moe"))  # 8 experts, top 2
    cpu = Setup(model=cfg, micro_batch=8, seq_len=128, device="cpu", compute_bytes=2, amp_level="O2")
    assert 1.0 < padded_rows(cpu) <= 1.3
    for dtype, rows in (("float16", padded_rows(cpu)), ("bfloat16", 1.0), (None, 1.0)):
        assert padded_rows(dataclasses.replace(cpu, device="gpu", amp_dtype=dtype)) == rows, dtype
    planned = []
    monkeypatch.setattr(experts, "padded_rows", lambda s: planned.append((s, padded_rows(s))) or planned[-1][1])
    from_file(TINY, ["--fp16", "true"], device="T4", suggest_changes=False)
    gpu = [(s.amp_dtype, rows) for s, rows in planned if s.device == "gpu"]
    assert gpu and all(dtype == "float16" and rows > 1.0 for dtype, rows in gpu), gpu


def test_time_counts_the_assignments_computed():
    """At a factor below 1 the experts compute the capacity only: the hardware FLOPs and the time fall, the model
    FLOPs (the MFU basis) do not; at 1.25 nothing is dropped at balance, so nothing changes."""
    r0, r1, r5 = (_plan(f, "H100") for f in (0, 1.25, 0.5))
    assert r1.flops_per_token == r0.flops_per_token and r1.eta_hours == r0.eta_hours
    assert r5.flops_per_token.model == r0.flops_per_token.model
    assert r5.flops_per_token.hardware < r0.flops_per_token.hardware and r5.eta_hours < r0.eta_hours
    assert r5.stages[0]["tflops_per_step"] == pytest.approx(
        r0.stages[0]["tflops_per_step"] * r5.flops_per_token.hardware / r0.flops_per_token.hardware)
