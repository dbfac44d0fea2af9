"""benchmarks/checkpoint_save.py's bookkeeping (the run itself takes minutes of launcher jobs: not a test):
what the save added to rank 0's RSS, from either code's metrics.jsonl. The old tree it compares against comes
from the repository's history, which a test must not need (a shallow clone or a source archive has none):
the benchmark itself checks what it extracts."""
import json

from bench_scripts import load

bench = load("checkpoint_save")


def _metrics(out, with_save_peak: bool):
    out.mkdir(parents=True)
    (out / "checkpoint-2").mkdir()
    (out / "checkpoint-2" / "model.safetensors").write_bytes(b"x" * 1024)
    save = {"kind": "checkpoint", "step": 2, "stall_seconds": 1.5}
    if with_save_peak:  # this code's record carries rank 0's peak right after the save
        save["host_memory_peak_gib"] = 2.25
    recs = [{"kind": "train", "step": 1, "host_memory_peak_gib": 1.5},
            {"kind": "train", "step": 2, "host_memory_peak_gib": 2.0}, save,
            {"kind": "train", "step": 3, "host_memory_peak_gib": 4.5}]
    (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    return out


def test_save_numbers_take_the_peak_after_the_save_from_either_code(tmp_path):
    new = bench.save_numbers(_metrics(tmp_path / "new", True))
    assert new["save_seconds"] == 1.5 and new["rank0_training_peak_gib"] == 2.0
    assert new["rank0_save_rss_gib"] == 0.25 and new["checkpoint_gib"] == round(1024 / 2**30, 3)
    old = bench.save_numbers(_metrics(tmp_path / "old", False))  # the old record has none: step 3's peak
    assert old["rank0_peak_after_save_gib"] == 4.5 and old["rank0_save_rss_gib"] == 2.5
