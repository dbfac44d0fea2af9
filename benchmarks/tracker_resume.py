"""How long a resume spends on its record files before its first step, against the length of the run's history.

Why: rank 0 opens metrics.jsonl and the trackers (VisualDL, TensorBoard) before the first step, while the other
ranks of a launch wait for it. Writing the history into the trackers again took ~1 s per 1,000 records with
TensorBoard and ~0.4 s with VisualDL (15 minutes for a run of 10^6 log steps); a resume now cuts the files back
to its checkpoint's mark (`training.record_files`), whatever their length.

    python benchmarks/tracker_resume.py [--records 1000000] [--report_to visualdl tensorboard] [--anew] [--json]

It builds an output directory in a temporary one: metrics.jsonl with `--records` train records (an eval record
every 50, ~680 bytes a train record as a real run writes them), the trackers' files written by the run's own
writer for the first 1,000 records and then grown to a real run's size by repeating their bytes (a resume reads
only the bytes before its mark, so their content past that is never read), the mark of a checkpoint 50 steps
before the end, and the records an interrupted run logged after it. Then it times `MetricsWriter`'s opening of
that directory as a resume from the checkpoint: with the mark (now), or `--anew` without it (what every resume
did before: the history written into new tracker files; try --records 100000, ~1-2.5 min).
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

WRITTEN = 1000  # records the trackers' own writers write; the rest of their files repeats these bytes
BEHIND = 50  # steps logged after the checkpoint the resume continues from


def train_record(step: int) -> dict:
    """A train record's values as a run logs them (the fields of `Trainer._log`)."""
    return {"loss": 5.0 + 1.0 / step, "learning_rate": 3e-4, "global_step": step, "eta": "1:23:45",
            "interval_runtime": 0.0512, "interval_samples_per_second": 156.25, "interval_tokens_per_second_per_device":
            2500.0, "interval_hardware_tflops_per_device": 0.0021, "interval_steps_per_second": 19.53,
            "tokens_per_sec": 5000.0, "tokens_per_sec_per_replica": 2500.0, "model_tflops_per_device": 0.001955,
            "mfu": 0.011766, "host_memory_gib": 0.4874, "host_memory_peak_gib": 0.4874, "grad_norm": 0.86,
            "tokens_seen": 256 * step, "consumed_samples": 8 * step, "batch_hash": "23a2e04e2daa",
            "progress_or_epoch": round(step / 2e6, 4)}


def _line(kind: str, step: int, values: dict) -> str:
    return json.dumps({"kind": kind, "step": step, "time": round(1.7e9 + step * 0.05, 3), **values}) + "\n"


def _grow(path: Path, size: int) -> None:
    """`path` to about `size` bytes by appending copies of its own records (a file of whole records)."""
    data = path.read_bytes()
    with open(path, "ab") as f:
        for _ in range(max(size // max(len(data), 1) - 1, 0)):
            f.write(data)


def build(root: Path, n: int, names: list) -> dict:
    """The output directory of a run with `n` log steps; returns the mark of its checkpoint at n - BEHIND."""
    from pretrain_cli.training import record_files
    from pretrain_cli.training.metrics import MetricsWriter

    writer = MetricsWriter(str(root), None, names, None, {"benchmark": "tracker_resume"})
    for s in range(1, WRITTEN + 1):
        writer.write("train", s, train_record(s))
    writer.close()
    keep = n - BEHIND
    with open(root / "metrics.jsonl", "a", encoding="utf-8") as f:
        for s in range(WRITTEN + 1, keep):
            f.write(_line("train", s, train_record(s)))
            if s % 50 == 0:
                f.write(_line("eval", s, {"eval_loss": 5.5, "eval_ppl": 244.69, "global_step": s}))
    per_record = {"vdlrecords": 760, "events.out.tfevents": 940}  # bytes per record in a real run's files
    files = {}
    for path in (root / "runs").iterdir():
        _grow(path, next(v for k, v in per_record.items() if path.name.startswith(k)) * keep)
        files.setdefault("visualdl" if path.name.startswith("vdl") else "tensorboard", {})[path.name] = \
            record_files.mark(path)
    marks = {"metrics": record_files.mark(root / "metrics.jsonl"), "files": files, "logdir": "runs"}
    with open(root / "metrics.jsonl", "a", encoding="utf-8") as f:  # the checkpoint's step, then the killed run's
        for s in range(keep, n + 1):
            f.write(_line("train", s, train_record(s)))
    for path in (root / "runs").iterdir():
        with open(path, "r+b") as f:  # what the killed run's trackers wrote after the mark (cut by the resume)
            head = f.read(BEHIND * 1000)
            f.seek(0, 2)
            f.write(head)
    return marks


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=1_000_000, help="log records in the run's history (1000000)")
    ap.add_argument("--report_to", nargs="+", default=["visualdl", "tensorboard"], help="visualdl tensorboard")
    ap.add_argument("--anew", action="store_true", help="without the mark: the history written again (before)")
    ap.add_argument("--json", action="store_true", help="one JSON object instead of the lines")
    args = ap.parse_args(argv)
    from pretrain_cli.training.metrics import MetricsWriter

    root = Path(tempfile.mkdtemp(prefix="tracker_resume."))
    try:
        t = time.perf_counter()
        marks = build(root, args.records, args.report_to)
        built = time.perf_counter() - t
        sizes = {p.name: p.stat().st_size for p in [root / "metrics.jsonl", *sorted((root / "runs").iterdir())]}
        wall, cpu = time.perf_counter(), time.process_time()
        writer = MetricsWriter(str(root), None, args.report_to, args.records - BEHIND, {"resumed": True}, (),
                               None if args.anew else marks)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        writer.close()
        result = {"records": args.records, "report_to": args.report_to, "anew": args.anew,
                  "resume_seconds": round(wall, 3), "resume_cpu_seconds": round(cpu, 3),
                  "files_mb": {k: round(v / 1e6, 1) for k, v in sizes.items()}, "built_seconds": round(built, 1)}
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if args.json:
        print(json.dumps(result))
    else:
        print(f"{args.records:,} records, report_to {' '.join(args.report_to)}, "
              f"{'history written again (no mark)' if args.anew else 'cut back to the mark'}: "
              f"{result['resume_seconds']} s ({result['resume_cpu_seconds']} CPU-s) to open the record files")
        print("files: " + ", ".join(f"{k} {v} MB" for k, v in result["files_mb"].items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
