"""What `plan`'s ETA rests on, said where it is printed: `--mfu` is the kernels' share of peak on the FLOPs the
devices run, to which the speed model adds the bubble and the traffic; the `mfu` train logs has all of those inside
it, so plan prints its prediction as train logs it, and `--measured_mfu` times the run at a measured one, nothing
added. The traffic part names its largest term, its link (an assumed cross-node figure said so) and the overlap
assumed: none, but DataParallel's gradients behind the last backward."""
from pathlib import Path

import pytest
from plan_helpers import plan
from pretrain_cli.cli import main as cli_main
from pretrain_cli.orchestration.planned import from_file
from pretrain_cli.planning import hardware
from pretrain_cli.planning.report import format_report
from pretrain_cli.planning.speed import speed

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
LLAMA3_8B = str(CONFIGS / "llama-3-8b_pretrain.json")  # tp 2, sharding stage1, bf16 O2
QWEN_05B = str(CONFIGS / "qwen2.5-0.5b_pretrain.json")
RECOMPUTE_8K = ["--model_name_or_path", "meta-llama/Llama-3.1-8B", "--max_seq_length", "8192", "--recompute", "true"]


def _eta(capsys, *argv: str) -> list[str]:
    assert cli_main(["plan", *argv]) == 0
    out = capsys.readouterr().out.splitlines()
    i = next(i for i, x in enumerate(out) if x.startswith("ETA: "))
    return out[i:i + 2]


def test_the_predicted_mfu_as_train_logs_it_fed_back_as_measured_gives_the_same_eta(capsys):
    """Llama-3.1-8B at 8K with recompute on 8 H100: re-planning with --mfu set to the mfu train logs (what the docs
    advised) counts recompute, traffic and bubble twice (1.37x the measured time). The plan's own prediction as train
    logs it, given back as --measured_mfu, is the same time; the lines say which figure is which."""
    argv = [LLAMA3_8B, *RECOMPUTE_8K, "--device", "H100", "--gpus", "8", "--tokens", "100B"]
    r = from_file(LLAMA3_8B, [*RECOMPUTE_8K, "--max_steps", "1000"], device="H100", gpus=8)
    logged = r.logged_mfu
    step = speed(r)["step_seconds"]
    # train's logged mfu (training.metrics.Throughput) of a run whose steps take the planned step
    from pretrain_cli.orchestration.planned import _resolved, parse
    from pretrain_cli.planning.plan import target_device
    from pretrain_cli.training.metrics import Throughput

    args, cfg = parse(LLAMA3_8B, [*RECOMPUTE_8K, "--max_steps", "1000"])
    run = _resolved(args, cfg, target_device("H100", gpus=8), 8)
    train = Throughput.for_run(run, cfg, 989)
    assert train._mfu(r.tokens_per_step / step / 8) == pytest.approx(logged, abs=1e-6)  # (train rounds to 6 places)
    assert logged < 0.9 * r.mfu  # recompute and traffic: train would log less than the kernels' share
    measured = from_file(LLAMA3_8B, [*RECOMPUTE_8K, "--max_steps", "1000"], device="H100", gpus=8,
                         measured_mfu=logged)
    assert measured.eta_hours == pytest.approx(r.eta_hours, rel=1e-12) and measured.eta_traffic_hours is None
    twice = from_file(LLAMA3_8B, [*RECOMPUTE_8K, "--max_steps", "1000"], device="H100", gpus=8, mfu=logged)
    assert twice.eta_hours > 1.3 * r.eta_hours  # the old advice: --mfu = train's logged mfu
    eta, said = _eta(capsys, *argv)
    assert "x MFU 0.40, the kernels' share of peak: --mfu)" in eta
    assert said.startswith(f"  mfu as train logs it: {logged:.3f} predicted (model FLOPs over this time: traffic, "
                           "bubble and recompute inside it)") and "--measured_mfu" in said
    eta, said = _eta(capsys, *argv, "--measured_mfu", f"{logged:.3f}")
    hours = r.flops_per_token.model * 100_000_071_680 / (8 * 989e12 * float(f"{logged:.3f}")) / 3600
    assert eta == (f"ETA: {100_000_071_680 * r.flops_per_token.model:.3g} model FLOPs / (8 x 989 TFLOPS x measured "
                   f"mfu {logged:.3f}) = {hours:.2f} h ({hours / 24:.1f} days): train's logged mfu holds the traffic, "
                   f"bubble and recompute, so nothing is added")
    assert said == (f"  the speed model predicts mfu {logged:.3f} as train logs it (MFU 0.40 of the kernels, --mfu, "
                    "+ traffic)")


def test_measured_mfu_is_refused_with_fit_with_mfu_and_out_of_range(capsys):
    for extra, words in ((["--fit"], "--measured_mfu: measured on the file's layout, and --fit times other layouts"),
                         (["--mfu", "0.4"], "--measured_mfu and --mfu: give one"),
                         ([], "--measured_mfu: must be in (0, 1]")):
        value = "1.5" if not extra else "0.3"
        assert cli_main(["plan", LLAMA3_8B, "--device", "H100", "--gpus", "8", "--measured_mfu", value, *extra]) == 2
        err = capsys.readouterr().err
        assert words in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_the_traffic_part_names_its_largest_term_its_link_and_the_overlap_assumed(capsys):
    """Qwen2.5-0.5B without sharding on 16 H100: DataParallel's gradients cross the nodes. The line names them, says
    the 50 GB/s is assumed (--cross_node_gbps), and the part of them the last backward hides; given, the figure is
    not called assumed."""
    r = from_file(QWEN_05B, ["--sharding", "", "--tensor_parallel_degree", "1"], device="H100", gpus=16)
    sp = speed(r)
    acc, f = r.gradient_accumulation_steps, r.flops_per_token
    hidden = sp["compute_seconds"] / acc * (1 - f.model / 3 / f.hardware)  # the last micro-batch's backward
    assert sp["dp_overlapped_seconds"] == pytest.approx(hidden, rel=1e-12) and hidden > 0
    sent = r.traffic_gb_per_step["dp"] / 50
    assert sp["step_seconds"] == pytest.approx(sp["compute_seconds"] + sent - hidden, rel=1e-12)
    minutes = r.max_steps * hidden / 60
    eta = next(x for x in format_report(r).splitlines() if x.startswith("ETA: "))
    assert (f"(data-parallel gradients over cross-node 50 GB/s, an assumed figure: --cross_node_gbps; not "
            f"overlapped with compute, but for the {minutes:.2f} min of data-parallel gradients the last "
            f"micro-batch's backward hides (DataParallel's reducer))") in eta
    given = from_file(QWEN_05B, ["--sharding", "", "--tensor_parallel_degree", "1"], device="H100", gpus=16,
                      node=hardware.Node(8, 50.0))
    assert "over cross-node 50 GB/s; not overlapped" in format_report(given)
    # ZeRO-1 (fleet's, after the backward) hides nothing
    zero1 = from_file(QWEN_05B, ["--sharding", "stage1", "--tensor_parallel_degree", "1"], device="H100", gpus=16)
    assert speed(zero1)["dp_overlapped_seconds"] == 0 and "hides" not in format_report(zero1)


def test_the_cross_node_link_is_the_devices_generations_unless_given():
    """50 GB/s per GPU (8 x 400 Gb/s NDR) is a Hopper node's; an A100 node has 8 x 200 Gb/s HDR (25), a V100 DGX-2
    8 x 100 Gb/s EDR (12.5); a PCIe card its generation's; --cross_node_gbps wins."""
    want = {"H100": 50, "H800": 50, "H20": 50, "H100-PCIe": 50, "A100": 25, "A800": 25, "A10": 25, "L40S": 25,
            "V100": 12.5, "T4": 12.5}
    for name, gbps in want.items():
        links = hardware.links(hardware.lookup(name))
        assert links.cross_node_gbps == gbps, name
        assert links.cross_node_source.startswith("assumed") and "--cross_node_gbps" in links.cross_node_source
    given = hardware.links(hardware.lookup("A100"), hardware.Node(8, 12.0))
    assert (given.cross_node_gbps, given.cross_node_source) == (12.0, "--cross_node_gbps")
    r = plan(QWEN_05B, ["--sharding", "", "--tensor_parallel_degree", "1"], device="A100", gpus=16)
    assert r["device"]["links"]["cross_node_gbps"] == 25


def test_small_traffic_is_left_out_and_the_total_is_in_the_parts_unit(monkeypatch):
    """A CPU try-out printed '= 0.92 min + traffic 0.00 min (...) = 0.02 h (0.9 min)': a traffic part under 0.5 %
    of the time is left out, and a total under an hour is in minutes, as its parts; under a minute (this one's,
    at a fixed assumed peak: 332 GFLOP/s, a 2-core AVX-512 host's, so the bound is no machine's) in seconds, not
    '0.13 min'."""
    monkeypatch.setattr(hardware, "cpu_memory_gib", lambda: 64.0)  # (it fits whatever this machine has)
    monkeypatch.setattr(hardware, "cpu_peak_tflops", lambda *a, **k: (
        0.332, f"{hardware.ASSUMED_PEAK} of 332.0 GFLOP/s = 2 core(s) x 2.59 GHz x 64 FLOP/cycle (avx512f)"))
    monkeypatch.setattr(hardware, "host_available_gib", lambda *a, **k: (64.0, "MemAvailable"))
    r = from_file(str(CONFIGS / "tiny_cpu.json"), ["--max_steps", "2000", "--sharding", "stage1"], device="cpu", gpus=2)
    assert 0 < r.eta_traffic_hours < 0.005 * r.eta_hours < r.eta_hours < 1 / 60
    eta = next(x for x in format_report(r).splitlines() if x.startswith("ETA: "))
    assert "traffic" not in eta and f"MFU 0.30, the kernels' share of peak: --mfu) = {r.eta_hours * 3600:.2f} s; " \
        "cpu: an estimate" in eta and " h" not in eta.split("; cpu:")[0] and " min" not in eta.split("; cpu:")[0]


def test_a_cpu_plan_that_does_not_fit_says_per_process_and_what_check_and_train_do(monkeypatch):
    """On CPU `check`/`train` refuse a clear excess and note a marginal one: 'so it cannot start' may be false."""
    monkeypatch.setattr(hardware, "cpu_memory_gib", lambda: 0.5)
    monkeypatch.setattr(hardware, "host_available_gib", lambda *a, **k: (0.5, "MemAvailable"))
    r = from_file(QWEN_05B, ["--tensor_parallel_degree", "1", "--sharding", ""], device="cpu", gpus=1,
                  suggest_changes=False)
    assert not r.fits and r.eta_hours is None and r.logged_mfu is None
    eta = next(x for x in format_report(r).splitlines() if x.startswith("ETA: "))
    assert eta == ("ETA: no time: as written the run does not fit 0.5 GiB per process (above): check and train will "
                   "refuse or note it; a suggestion that fits, planned, gives a time")


def test_at_measured_mfu_the_fp32_note_quotes_no_unmeasured_eta():
    """An fp32 file planned for A100 gets the bf16 note; without --measured_mfu it quotes fp32's ETA and bf16's, but
    at --measured_mfu (the ETA then the measured one) it quoted the unmeasured ETA beside it: now the key alone."""
    argv = ["--bf16", "false", "--fp16", "false"]
    tiny = QWEN_05B
    note = lambda r: next(n for n in r.notes if n.startswith("precision: WARNING"))  # noqa: E731
    plain = from_file(tiny, argv, device="A100", gpus=8)
    assert f"ETA {plain.eta_hours:.2f} h" in note(plain)
    measured = from_file(tiny, argv, device="A100", gpus=8, measured_mfu=0.3)
    assert "ETA" not in note(measured) and "set `bf16: true`" in note(measured)
    assert measured.eta_hours != plain.eta_hours


def test_the_moe_cpu_default_is_named_only_where_it_is_the_mfu():
    """A Mixture-of-Experts CPU plan says its MFU is the measured MoE default only without --mfu."""
    moe = str(CONFIGS / "qwen3-moe-tiny_cpu.json")
    eta = lambda r: next(x for x in format_report(r).splitlines() if x.startswith("ETA"))  # noqa: E731
    default = eta(from_file(moe, [], device="cpu"))
    given = eta(from_file(moe, [], device="cpu", mfu=0.3))
    assert "MFU 0.08" in default and "(peak and MFU assumed, a MoE's CPU default: docs/PLAN.md)" in default
    assert "MFU 0.30" in given and "MoE" not in given and len(default) < 250  # (it was 430)
