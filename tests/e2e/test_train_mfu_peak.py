"""A tiny run's log line and metrics.jsonl record name the peak their `mfu` is over, the start-up `flops:` line's;
with no known peak both say unknown (in-process through the real CLI entry, tiny model, CPU)."""
import json
import re

from pretrain_cli.cli import main as cli_main
from pretrain_cli.planning import hardware

from e2e_helpers import write_config


def _train(tmp_path, corpus, capsys) -> tuple[list, list[str], list[dict]]:
    """(the log lines' (mfu, peak_tflops_per_device) pairs, its start-up `flops:` line, the train records)."""
    cfg = write_config(tmp_path, corpus, max_steps=2, save_steps=1000, logging_steps=1)
    assert cli_main(["train", cfg]) == 0
    out = capsys.readouterr().out
    printed = re.findall(r"mfu: ([^,\s]+), peak_tflops_per_device: ([^,\s]+)", out)
    flops = [line for line in out.splitlines() if "- flops: " in line]
    records = [r for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()
               if (r := json.loads(line))["kind"] == "train"]
    return printed, flops, records


def test_the_log_line_and_metrics_jsonl_carry_the_start_up_lines_peak(corpus, tmp_path, capsys):
    printed, flops, records = _train(tmp_path, corpus, capsys)
    assert len(flops) == 1 and [r["step"] for r in records] == [1, 2]
    said = float(re.search(r"mfu against an assumed fp32 peak of ([\d.]+) GFLOP/s", flops[0]).group(1))
    peaks = {r["peak_tflops_per_device"] for r in records}
    assert len(peaks) == 1 and round(peaks.pop() * 1e3, 1) == said
    assert [p for _, p in printed] == [str(round(r["peak_tflops_per_device"], 4)) for r in records]
    assert all(isinstance(r["mfu"], float) and 0 < r["mfu"] <= 1 for r in records)


def test_without_a_known_peak_mfu_and_its_peak_both_say_unknown(corpus, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(hardware, "cpu_peak_tflops", lambda **kw: (None, "this CPU reports no clock or vector flags"))
    printed, flops, records = _train(tmp_path, corpus, capsys)
    assert len(flops) == 1 and "flops: mfu unknown (this CPU reports no clock or vector flags" in flops[0]
    assert printed == [("unknown", "unknown")] * 2
    assert [(r["mfu"], r["peak_tflops_per_device"]) for r in records] == [("unknown", "unknown")] * 2
