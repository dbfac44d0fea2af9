"""Each interval record names the per-device peak its `mfu` is over (`peak_tflops_per_device`), so `mfu` records
of a run resumed on another layout (another peak per process) can be compared: in the log line, metrics.jsonl and
the trackers' scalars. The tiny runs that log it are tests/e2e/test_train_mfu_peak.py."""
import pytest

from pretrain_cli.training import metrics
from pretrain_cli.training.tracker_scalars import scalars


def _interval(peak):
    """One step of 4 x 32 tokens at 1e10 FLOPs/token taken as 10 s: 0.128 model TFLOPS, whatever the clock says."""
    t = metrics.Throughput(32, 4, 1, 1, 1e10, 1.3e10, peak)
    t.step()
    t.last -= 10.0  # (the interval's start; it ends when `interval` is called, microseconds later)
    return t.interval()


def test_the_record_carries_the_peak_mfu_is_over_right_after_mfu():
    out = _interval(0.3328)
    keys = list(out)
    assert keys[keys.index("mfu") + 1] == "peak_tflops_per_device" and keys[-1] == "peak_tflops_per_device"
    assert keys[:5] == ["interval_runtime", "interval_samples_per_second", "interval_tokens_per_second_per_device",
                        "interval_hardware_tflops_per_device", "interval_steps_per_second"]  # PaddleNLP's, first
    assert out["peak_tflops_per_device"] == 0.3328 and 0.38 < out["mfu"] < 0.39  # 0.128 / 0.3328
    # mfu is the model rate over that peak (both rounded to 6 places)
    assert out["mfu"] == pytest.approx(out["model_tflops_per_device"] / out["peak_tflops_per_device"], abs=2e-6)
    # the float the resolution left (cores x clock x FLOPs/cycle) is recorded to 6 significant digits, not its repr
    assert _interval(2 * 2.6 * 64 / 1e3)["peak_tflops_per_device"] == 0.3328
    assert _interval(989.4)["peak_tflops_per_device"] == 989.4


def test_without_a_peak_both_say_unknown_and_the_trackers_get_neither():
    out = _interval(None)
    assert out["mfu"] == "unknown" and out["peak_tflops_per_device"] == "unknown"
    tags = scalars({"kind": "train", "step": 1, "time": 0.0, **out})
    assert "train/mfu" not in tags and "train/peak_tflops_per_device" not in tags
    assert "train/model_tflops_per_device" in tags


def test_a_peak_passed_keeps_its_value_beside_the_unknown_mfu(caplog):
    """mfu above 1 is not printed (the peak is wrong); the record still says which peak that was."""
    out = _interval(1e-9)
    assert out["mfu"] == "unknown" and out["peak_tflops_per_device"] == 1e-9
    assert "cannot be true" in caplog.text


def test_the_log_line_and_the_trackers_show_it():
    out = _interval(0.3328)
    line = metrics.format_line({"loss": 6.1, "global_step": 4, **out})
    assert line.endswith(f"mfu: {round(out['mfu'], 4)}, peak_tflops_per_device: 0.3328")  # (4 places, as PaddleNLP)
    tags = scalars({"kind": "train", "step": 4, "time": 0.0, **out})
    assert tags["train/peak_tflops_per_device"] == 0.3328 and tags["train/mfu"] == out["mfu"]
