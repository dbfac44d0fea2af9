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


def _line_keys(device: str, monkeypatch) -> list[str]:
    """The keys of the line `TrainLog._log` prints, in order, for a dense model's step 60 on `device` (GPU memory
    faked: the suite has no GPU)."""
    import sys
    from types import SimpleNamespace as NS

    from pretrain_cli.training import train_log

    lines = []
    monkeypatch.setattr(train_log, "log", NS(info=lines.append))
    cuda = NS(memory_allocated=lambda: 2**30, memory_reserved=lambda: 3 * 2**30, max_memory_allocated=lambda: 2**31,
              max_memory_reserved=lambda: 2**32)
    monkeypatch.setitem(sys.modules, "paddle", NS(device=NS(cuda=cuda)))

    class Trainer(train_log.TrainLog):
        def _record(self, kind, values):
            pass

    t = Trainer()
    t.state = NS(interval_loss=6.4, interval_steps=1, loss_sum=0.0, global_step=60, tokens_seen=122880,
                 consumed_samples=480, last_batch_hash="858f61f5dfd5")
    t.comm, t.schedule = NS(mean=lambda x: x), NS(lr_at=lambda step: 2.9e-3, phase=lambda step: None)
    t.throughput = metrics.Throughput(256, 8, 1, 1, 1e8, 1.3e8, 0.3323)
    t.throughput.step()
    t.loop, t.device = NS(max_steps=400, memory_metrics=True), device
    t.layout = NS(raw_model=NS(config=NS(sparse_layers=None, num_nextn_predict_layers=0)))
    t._log(0.46)
    (line,) = lines
    return [item.split(": ", 1)[0] for item in line.split(", ")]


def test_the_whole_line_has_the_documented_order(monkeypatch):
    """docs/TRAINING.md's example line (a CPU run) has the keys `_log` prints, in its order: PaddleNLP's first, in
    its order and adjacent (a grep for `global_step: 60, interval_runtime` finds the line), then ours; on a GPU the
    device memory keys PaddleNLP logs before `interval_runtime`, current and peak, where it logs them."""
    import re
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "TRAINING.md").read_text(encoding="utf-8")
    example = doc.split("## Log line", 1)[1].split("```", 2)[1]
    shown = [k.split(": ", 1)[0] for k in re.sub(r"\s*\n", " ", example.split("] - ", 1)[1]).strip().split(", ")]
    cpu = _line_keys("cpu", monkeypatch)
    paddlenlp = ["loss", "learning_rate", "global_step", "interval_runtime", "interval_samples_per_second",
                 "interval_tokens_per_second_per_device", "interval_hardware_tflops_per_device",
                 "interval_steps_per_second", "progress_or_epoch"]  # PaddleNLP's Trainer's, in its order
    assert cpu == shown and cpu[:9] == paddlenlp and cpu[9] == "eta"
    gpu = _line_keys("gpu", monkeypatch)
    assert gpu[3:7] == ["current_memory_allocated", "current_memory_reserved", "max_memory_allocated",
                        "max_memory_reserved"] and gpu[:3] + gpu[7:] == cpu
    assert "| `current_memory_allocated`, `current_memory_reserved`, `max_memory_allocated`, `max_memory_reserved` | " \
           "on GPU only (none on CPU, as in PaddleNLP), after `global_step`" in doc
