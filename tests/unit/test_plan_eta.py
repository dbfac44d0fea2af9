"""`plan`'s ETA is the time of the speed model `plan --fit` ranks and times layouts by (one estimate per layout:
the FLOPs with recompute over peak x MFU, the pipeline's fill and drain, plus the traffic over each group's link),
and a layout that does not fit memory gets no time: it cannot start."""
from pathlib import Path

import pytest
from plan_helpers import fit, plan
from pretrain_cli.cli import main as cli_main
from pretrain_cli.orchestration.planned import from_file
from pretrain_cli.planning.report import format_report
from pretrain_cli.planning.speed import speed

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
LLAMA3_8B = str(CONFIGS / "llama-3-8b_pretrain.json")  # tp 2, sharding stage1, bf16 O2
AT_8K = ["--model_name_or_path", "meta-llama/Llama-3.1-8B", "--max_seq_length", "8192"]


def test_plans_eta_is_the_time_fit_gives_the_same_layout(capsys):
    """Llama-3.1-8B at 8K on 8 H100, 100B tokens: `plan` said 508 h (MFU only) where `plan --fit` timed the same
    layout at 526 h (with its traffic), neither saying why. Now both are the speed model's 525.9 h, and the ETA line
    says what the traffic adds to the compute."""
    argv = ["plan", LLAMA3_8B, *AT_8K, "--device", "H100", "--gpus", "8", "--tokens", "100B"]
    assert cli_main(argv) == 0
    eta = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("ETA: "))
    assert eta == ("ETA: 5.79e+21 FLOPs / (8 x 989 TFLOPS x MFU 0.40, the kernels' share of peak: --mfu) = 508.32 h "
                   "+ traffic 17.60 h (TP collectives 16.18 h over in-node 450 GB/s; not overlapped with compute) = "
                   "525.92 h (21.9 days)")
    assert cli_main([*argv, "--fit"]) == 0
    said = capsys.readouterr().out.splitlines()  # (the file's layout, kept: --fit's fastest is +1.6 %)
    assert "  time for 100,000,071,680 tokens at that speed: 525.9 h (21.9 days)" in said
    r = from_file(LLAMA3_8B, AT_8K, device="H100", gpus=8)
    sp = speed(r)
    assert r.eta_hours * 3600 == pytest.approx(r.max_steps * sp["step_seconds"], rel=1e-12)
    assert r.eta_traffic_hours * 3600 == pytest.approx(r.max_steps * sp["comm_seconds"], rel=1e-12)
    written = fit(LLAMA3_8B, AT_8K, device="H100", gpus=8)["before"]["speed"]
    assert r.eta_hours * 3600 == pytest.approx(r.total_tokens / written["tokens_per_sec"], rel=1e-12)


def test_recompute_counts_in_the_eta():
    """Recompute's forward is time the run spends: the ETA (like --fit's speed) divides the FLOPs with recompute by
    peak x MFU, and the line names them so."""
    off = from_file(LLAMA3_8B, AT_8K, device="H100", gpus=8)
    on = from_file(LLAMA3_8B, [*AT_8K, "--recompute", "true"], device="H100", gpus=8)
    compute = [r.eta_hours - r.eta_traffic_hours for r in (off, on)]
    ratio = on.flops_per_token.hardware / off.flops_per_token.model
    assert ratio > 1.3 and abs(compute[1] / compute[0] - ratio) < 1e-9
    assert f"ETA: {on.total_tokens * on.flops_per_token.hardware:.3g} FLOPs with recompute / (8 x 989" \
           in format_report(on)


def test_a_layout_that_does_not_fit_gets_no_time():
    """Llama-3-8B on one A100-40GB does not fit: its ETA (75.08 h) was of a run that cannot start. Now none, in
    `--json` too, and the line says why, as `--fit` says of a file that does not fit as written."""
    r = from_file(LLAMA3_8B, ["--tensor_parallel_degree", "1", "--sharding", ""], device="A100-40GB", gpus=1,
                  suggest_changes=False)
    assert not r.fits and r.eta_hours is None and r.eta_traffic_hours is None
    line = next(x for x in format_report(r).splitlines() if x.startswith("ETA"))
    assert line == ("ETA: no time: as written the run does not fit 40.0 GiB per device (above), so it cannot start; "
                    "a suggestion that fits, planned, or --fit (whose layouts keep --margin, 10% by default, free) "
                    "gives a layout's time")
    fits = plan(LLAMA3_8B, device="H100", gpus=8)
    assert fits["fits"] and fits["eta_hours"] > 0  # the file where it fits: a time


def test_the_gpu_check_report_reads_a_plan_without_time():
    """scripts/gpu_check_report.py put plan's tokens/s beside the measured from `eta_hours`: a plan with no time (the
    layout it says does not fit ran anyway) is `none` there, not a crash."""
    import importlib.util

    path = CONFIGS.parent / "scripts" / "gpu_check_report.py"
    spec = importlib.util.spec_from_file_location("gpu_check_report", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    r = from_file(LLAMA3_8B, ["--tensor_parallel_degree", "1", "--sharding", ""], device="A100-40GB", gpus=1,
                  suggest_changes=False).to_json()
    records = [{"kind": "train", "step": s, "tokens_per_sec": 1000.0, "mfu": 0.3} for s in range(6, 9)]
    text = script.report(r, records, skip=5)
    assert "tokens/s                     1000       none" in text and "fits (plan): False" in text
    timed = script.report({**r, "eta_hours": 2.0}, records, skip=5)
    assert f"{r['tokens_per_step'] * r['max_steps'] / 7200:>10.0f}" in timed.splitlines()[1]
    # train's mfu beside the plan's prediction of it (model FLOPs over the predicted time), not the kernels' share
    fits = plan(LLAMA3_8B, device="H100", gpus=8)
    row = next(x for x in script.report(fits, records, skip=5).splitlines() if x.startswith("mfu"))
    assert row == f"{'mfu (as train logs it)':22} {0.3:>10.1%} {fits['logged_mfu']:>10.1%}"
    assert fits["logged_mfu"] < fits["mfu"] and "none" in next(
        x for x in text.splitlines() if x.startswith("mfu"))  # (no time, no prediction)
