"""What a run's start costs each rank: its peak RSS and the wall time from launch to its first step, before and after
each rank started building only what it holds (docs/DISTRIBUTED.md, "What a rank holds while it starts").

Why: the old start built the whole fp32 model on every rank before its layout cut it (a ZeRO-3 shard, a TP slice,
a pipeline stage), so every rank's start-up peak was the whole model; now each rank creates only its own blocks.
For each preset and layout this launches the same 1-step run through the real launcher (`paddle.distributed.launch`,
CPU processes; one process without it) twice, side by side: with this tree's code and with the commit before the
change (`--old-rev`, default 0c93d7e, extracted with `git archive`; or `--old-src`, any tree's src/). Both are
measured the same way: the launcher runs `startup_probe.py` around the train script, which records, as
`Trainer.train` is entered (layout in place, no step taken), the process's VmHWM and its seconds since launch,
and then ends the run (the step, its save and the export are not what is measured).

    python benchmarks/startup.py [--presets qwen2.5-0.5b,llama-3.2-1b] [--layouts one:1,zero3:4,pp2:2,tp2:2]
                                 [--old-rev 0c93d7e | --old-src DIR/src] [--seq 64] [--json]

Memory: the old code's ZeRO-3 on 4 processes holds 4 whole fp32 models at once (llama-3.2-1b: ~20 GB); choose
layouts the machine can hold. Not a test: numbers depend on the machine and its load.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
LAYOUTS = {"one": {}, "zero3": {"sharding": "stage3"}, "tp2": {"tensor_parallel_degree": 2},
           "pp2": {"pipeline_parallel_degree": 2}}
BEFORE_REV = "0c93d7e"  # the last commit whose ranks built the whole model before laying it out


def launch(src: Path, cfg: dict, root: Path, name: str, nproc: int) -> list[dict]:
    """One run of `src`'s train script under the probe; every rank's record, by rank."""
    out, logs = root / name / "out", root / name / "log"
    logs.mkdir(parents=True, exist_ok=True)
    path = root / name / "cfg.json"
    path.write_text(json.dumps(dict(cfg, output_dir=str(out))))
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONPATH=str(src),
               STARTUP_PROBE_DIR=str(root / name), STARTUP_PROBE_EXIT="1",
               STARTUP_PROBE_SCRIPT=str(src.parent / "scripts" / "run_pretrain.py"))
    env.pop("PADDLE_TRAINER_ID", None)
    probe = str(HERE / "startup_probe.py")
    cmd = ([sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node", str(nproc), "--log_dir", str(logs),
            probe, str(path)] if nproc > 1 else [sys.executable, probe, str(path)])
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=str(root))
    rows = [json.loads(f.read_text()) for f in sorted((root / name).glob("probe_rank*.json"))]
    # every rank leaves right after its record; a rank whose peers left first may be stopped by its watchdog
    if len(rows) != nproc:
        tail = (logs / "workerlog.0").read_text(errors="replace")[-3000:] if (logs / "workerlog.0").is_file() else ""
        raise SystemExit(f"{name}: exit {p.returncode}, {len(rows)} of {nproc} records\n{p.stderr[-2000:]}\n{tail}")
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--presets", default="qwen2.5-0.5b,llama-3.2-1b")
    ap.add_argument("--layouts", default="one:1,zero3:4,pp2:2,tp2:2")
    ap.add_argument("--old-rev", default=BEFORE_REV)
    ap.add_argument("--old-src", default=None)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    sys.path.insert(0, str(REPO / "src"))
    sys.path.insert(0, str(HERE))
    from checkpoint_save import corpus, old_tree  # the same corpus writer and `git archive` extraction
    from pretrain_cli.config.presets import resolve_model_dir
    from pretrain_cli.models.config import ModelConfig

    report = {"seq": a.seq, "old": a.old_src or a.old_rev, "runs": {}}
    with tempfile.TemporaryDirectory(prefix="startup_bench_") as tmp:
        root = Path(tmp)
        old_src = Path(a.old_src) if a.old_src else old_tree(a.old_rev, root / "old")
        vocab = min(ModelConfig.from_file(str(resolve_model_dir(p, key="--presets"))).vocab_size
                    for p in a.presets.split(","))
        data = str(corpus(root, vocab))
        if not a.json:
            print(f"{'preset':14} {'layout':9} {'rank':>4} {'peak GiB before':>16} {'after':>7} {'ratio':>6} "
                  f"{'s to step 1 before':>19} {'after':>7} {'ratio':>6}")
        for preset in a.presets.split(","):
            base = {"model_name_or_path": preset, "input_dir": data, "device": "cpu", "split": "100,0,0",
                    "max_seq_length": a.seq, "do_train": True, "per_device_train_batch_size": 1, "max_steps": 1,
                    "save_steps": 1000, "logging_steps": 1, "report_to": ["none"], "disable_tqdm": True,
                    "overwrite_output_dir": True, "learning_rate": 1e-4, "warmup_steps": 0}
            for item in a.layouts.split(","):
                name, nproc = item.split(":")
                tag = f"{preset}/{name}x{nproc}"
                row = {which: launch(src, dict(base, **LAYOUTS[name]), root, f"{preset}_{name}{nproc}_{which}",
                                     int(nproc))
                       for which, src in (("after", REPO / "src"), ("before", old_src))}
                report["runs"][tag] = row
                if a.json:
                    continue
                for b, n in zip(row["before"], row["after"]):
                    print(f"{preset:14} {name + 'x' + nproc:9} {n['rank']:>4} {b['rss_peak_gib']:>16.3f} "
                          f"{n['rss_peak_gib']:>7.3f} {n['rss_peak_gib'] / b['rss_peak_gib']:>6.2f} "
                          f"{b['seconds_since_launch']:>19.1f} {n['seconds_since_launch']:>7.1f} "
                          f"{n['seconds_since_launch'] / b['seconds_since_launch']:>6.2f}", flush=True)
    if a.json:
        print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
