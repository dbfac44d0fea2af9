"""`plan` and `train` read one resolved run configuration: the attention and recompute `plan` models are the ones
`train` runs, one hardware rule (the device, its attention, its MFU peak) serves both, and the FLOPs, the CPU's
peak and the MFU the trainer reports (the decisions themselves: test_run_config.py)."""
import pytest
from run_helpers import model_config, resolve_run

from plan_helpers import plan


def test_plan_models_the_attention_and_recompute_that_train_runs(tmp_path):
    import json

    cfg = tmp_path / "a.json"
    cfg.write_text(json.dumps({"model_name_or_path": "qwen2.5-0.5b", "output_dir": "o", "input_dir": "d",
                               "do_train": True, "max_steps": 10, "bf16": True, "max_seq_length": 2048,
                               "per_device_train_batch_size": 4}))
    reports = {}
    for flash in ("true", "false"):
        for recompute in ("true", "false"):
            over = ["--use_flash_attention", flash, "--recompute", recompute]
            r = plan(str(cfg), over, device="A100-80GB", suggest_changes=False)
            run = resolve_run(*over, "--bf16", "--max_seq_length", "2048", "--per_device_train_batch_size", "4",
                              device="gpu", gpu_name="A100-80GB", model="qwen2.5-0.5b")
            assert r["attention"] == run.kernels.attention
            assert r["recompute"] == run.recompute_granularity
            reports[flash, recompute] = r["memory_breakdown_gib"]["activations"]
    assert reports["true", "false"] < reports["false", "false"]  # flash drops the scores
    assert reports["false", "true"] < reports["false", "false"]
    # the flash suggestion exists because the run would materialise the scores
    r = plan(str(cfg), ["--use_flash_attention", "false", "--per_device_train_batch_size", "64"],
             device="A100-80GB")
    assert any(s["change"] == {"use_flash_attention": True} for s in r["suggestions"])


def test_plan_of_a_cpu_file_says_which_device_it_plans_and_how_to_plan_this_machine():
    """`plan configs/demo_cpu.json --device A100-80GB` names the device planned, not its kind ("planning for gpu as
    --device asks"); without --device, plan plans the file's cpu (`planned.own_device`)."""
    from pretrain_cli.config.parser import parse_config
    from pretrain_cli.config.resolve import resolve
    from pretrain_cli.run_config import Target
    from run_helpers import BASE

    args = parse_config(None, BASE)  # device cpu
    run = resolve(args, model_config(), Target("gpu", 1, gpu_name="A100-80GB", planned=True))
    note = [n for n in run.notes if n.startswith("device:")]
    assert note == ["device: the file says 'cpu'; planning for A100-80GB (plan's --device); "
                    "`plan --device cpu` plans this machine"]
    assert "as --device asks" not in " ".join(run.notes)


def test_plan_and_train_apply_one_hardware_rule(monkeypatch):
    """On a GPU that predates Ampere (no bf16 tensor cores: no flash-attn-2), `train`'s target, named by the
    driver, resolves the attention `plan --device V100` models, and the trainer's MFU peak is the plan's."""
    from run_helpers import BASE

    from pretrain_cli import runtime
    from pretrain_cli.config.parser import parse_config
    from pretrain_cli.orchestration import targets
    from pretrain_cli.config.resolve import resolve
    from pretrain_cli.run_config import Target
    from pretrain_cli.training import metrics

    monkeypatch.setattr(runtime, "gpu_build_installed", lambda: True)
    monkeypatch.setattr(runtime, "gpu_name", lambda: "Tesla V100-SXM2-32GB")
    train_target = targets.launcher_target()
    assert train_target.device == "gpu" and train_target.gpu_name == "Tesla V100-SXM2-32GB"
    args = parse_config(None, [*BASE, "--use_flash_attention", "true", "--fp16", "--device", "gpu"])
    trained = resolve(args, model_config(), train_target)
    planned = resolve(args, model_config(), Target("gpu", 1, 0, 0, "V100-32GB", planned=True))
    assert trained.kernels.attention == planned.kernels.attention == "math"
    assert any("predates Ampere" in n for n in trained.notes)
    assert metrics.resolve_peak("gpu", "float16", None)[0] == 125.0  # the table's V100 fp16 peak, as `plan` reads it
    assert metrics.resolve_peak("gpu", "bfloat16", None) == (  # no peak: the plan's reason, then what to set
        None, "V100-32GB has no bf16 peak in pretrain_cli.planning.hardware: no MFU (set peak_tflops to report one)")
    assert metrics.resolve_peak("gpu", "bfloat16", 90.0) == (90.0, "peak_tflops from the argument file")


def test_train_reads_the_cpu_peak_plan_reads_in_the_same_words(monkeypatch):
    """One place decides a CPU run's peak and its words (`hardware.resolve_peak`): the trainer's MFU line and
    `plan --device cpu`'s ETA, with a reason that already says what to set kept as it is, and a GPU machine's
    driver never asked for a CPU run's peak."""
    from pretrain_cli import runtime
    from pretrain_cli.planning import hardware
    from pretrain_cli.training import metrics

    monkeypatch.setattr(runtime, "gpu_name", lambda: pytest.fail("a CPU run's peak asked the GPU driver"))
    answer = [(0.5, f"{hardware.ASSUMED_PEAK} here")]
    monkeypatch.setattr(hardware, "cpu_peak_tflops", lambda processes=1: answer[0])
    assert metrics.resolve_peak("cpu", None, None) == hardware.resolve_peak(None, "cpu", None) == answer[0]
    assert metrics.resolve_peak("cpu", None, 2.0) == (2.0, "peak_tflops from the argument file")
    none = answer[0] = (None, f"this CPU reports no clock or vector flags: {hardware.NO_MFU}")
    assert metrics.resolve_peak("cpu", None, None) == none  # not "...: no MFU (...): no MFU (...)"


def test_hardware_flops_count_the_recomputed_forward():
    from pretrain_cli.models.flops import flops_per_token
    from pretrain_cli.training.metrics import Throughput

    cfg = model_config()
    plain = Throughput.for_run(resolve_run("--max_seq_length", "32"), cfg, None)
    full = Throughput.for_run(resolve_run("--max_seq_length", "32", "--recompute"), cfg, None)
    assert plain.hw_flops == plain.flops == full.flops
    assert full.hw_flops == flops_per_token(cfg, 32, recompute="full", hardware=True) > full.flops


ZEN4 = "processor\t: 0\ncpu MHz\t\t: 2596.150\nflags\t\t: fpu sse2 avx fma avx2 avx512f\n\nprocessor\t: 1\ncpu MHz\t\t: 2400.0\n"


def test_cpu_peak_is_the_cores_theoretical_bound_stated_as_an_assumption():
    """The same figure in every run on one machine (no timed matmul, which ranged 15.7-214.8 GFLOP/s on a
    shared machine): cores x the highest reported clock x FLOPs/cycle of the widest FMA flag."""
    from pretrain_cli.planning.hardware import cpu_peak_tflops

    peak, why = cpu_peak_tflops(ZEN4, cores=2, max_khz=[])
    assert peak == pytest.approx(2 * 2.59615 * 64 / 1e3)
    assert "assumed fp32 peak of 332.3 GFLOP/s = 2 core(s) x 2.60 GHz x 64 FLOP/cycle (avx512f" in why
    assert "set peak_tflops" in why
    assert cpu_peak_tflops(ZEN4, cores=1, max_khz=[3_700_000, 3_500_000])[0] == pytest.approx(3.7 * 64 / 1e3)
    avx2 = ZEN4.replace(" avx512f", "")
    assert cpu_peak_tflops(avx2, cores=1, max_khz=[])[0] == pytest.approx(2.59615 * 32 / 1e3)
    assert cpu_peak_tflops("processor\t: 0\n", cores=1, max_khz=[]) == (
        None, "this CPU reports no clock or vector flags: no MFU (set peak_tflops to report one)")


def test_the_hosts_cpu_facts_are_read_once_per_process(monkeypatch):
    """`plan --fit` reckons the CPU peak for every candidate layout: /proc/cpuinfo and sysfs's clocks are read at the
    first call only, and a caller that passes its own (`cpuinfo`, `max_khz`) reads neither."""
    import pathlib

    from pretrain_cli.planning import hardware

    reads, real_read, real_glob = [], pathlib.Path.read_text, pathlib.Path.glob

    def read_text(self, *args, **kwargs):
        reads.append(str(self))
        return real_read(self, *args, **kwargs)

    def glob(self, pattern, *args, **kwargs):
        reads.append(str(self))
        return real_glob(self, pattern, *args, **kwargs)

    monkeypatch.setattr(pathlib.Path, "read_text", read_text)
    monkeypatch.setattr(pathlib.Path, "glob", glob)
    hardware._host_cpuinfo.cache_clear()
    hardware._host_max_khz.cache_clear()
    assert hardware.cpu_peak_tflops(ZEN4, cores=1, max_khz=[])[0] == pytest.approx(2.59615 * 64 / 1e3)
    assert reads == []
    first = hardware.cpu_peak_tflops(cores=1)
    assert hardware.cpu_peak_tflops(cores=1) == first
    hardware.cpu_peak_tflops(cores=2)
    assert reads.count("/proc/cpuinfo") == 1 and reads.count("/sys/devices/system/cpu") == 1


def test_mfu_above_one_is_never_reported(caplog):
    from pretrain_cli.training.metrics import Throughput

    tp = Throughput(32, 4, 1, 1, flops_per_token=1e9, hw_flops_per_token=1e9, peak_tflops=1.0)
    assert tp._mfu(500.0) == 0.5  # 500 tokens/s x 1 GFLOP = 0.5 TFLOP/s of a 1 TFLOP/s peak
    with caplog.at_level("WARNING", logger="pretrain_cli"):
        assert tp._mfu(1500.0) == "unknown" and tp._mfu(2000.0) == "unknown"
    warned = [r.getMessage() for r in caplog.records if r.getMessage().startswith("mfu:")]
    assert len(warned) == 1 and "1.50 of the 1000.0 GFLOP/s peak cannot be true" in warned[0]
    assert Throughput(32, 4, 1, 1, 1e9, 1e9, None)._mfu(1e9) == "unknown"
