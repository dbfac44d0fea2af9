"""The peak RSS of real CPU `train` runs against what `check` predicts for them (`orchestration.host_fit`).

Each row trains the README's demo file (configs/demo_cpu.json: tiny-qwen2, 256 tokens, the CPU kernels) for 2 steps
on a token file made here, with the row's `--key value` changes, in a fresh `pretrain-cli train` under
`/usr/bin/time -f %M` (the kernel's peak RSS of the process, what the out-of-memory killer weighs), and prints it next
to `host_fit.planned_gib` (plan's steady-state or start-up peak + `RUNTIME_GIB`). One process at a time: keep the
rows small on a shared machine (the largest default row peaks at ~4.2 GiB).

    python benchmarks/cpu_run_memory.py                       # the default rows, a markdown table
    python benchmarks/cpu_run_memory.py --rows '--per_device_train_batch_size 32' '--recompute true'
"""
from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
ROWS = ["--per_device_train_batch_size 1", "--per_device_train_batch_size 8", "--per_device_train_batch_size 64",
        "--per_device_train_batch_size 256", "--per_device_train_batch_size 16 --max_seq_length 1024",
        "--per_device_train_batch_size 128 --use_fused_linear_cross_entropy false",
        "--per_device_train_batch_size 128 --use_flash_attention false",
        "--per_device_train_batch_size 128 --recompute true --recompute_granularity core_attn",
        "--per_device_train_batch_size 128 --recompute true --recompute_granularity full_attn",
        "--per_device_train_batch_size 64 --recompute true", "--per_device_train_batch_size 256 --recompute true",
        "--per_device_train_batch_size 64 --cpu_fused_ops false"]


def _files(tmp: Path) -> Path:
    """The demo file without its tokenizer, on 400 random documents of 512 ids (vocabulary 2,048)."""
    sys.path.insert(0, str(REPO / "tests" / "unit"))
    from data_helpers import write_mmidx_reference

    rng = np.random.default_rng(0)
    write_mmidx_reference(str(tmp / "data"), [rng.integers(3, 2048, size=512) for _ in range(400)])
    cfg = json.loads((REPO / "configs" / "demo_cpu.json").read_text())
    cfg.pop("tokenizer_name_or_path")
    cfg.update(input_dir=str(tmp / "data"), output_dir=str(tmp / "out"), split="100,0,0", max_steps=2,
               do_eval=False, do_predict=False, save_steps=1000, logging_steps=1, overwrite_output_dir=True)
    path = tmp / "demo.json"
    path.write_text(json.dumps(cfg))
    return path


def row(cfg: Path, change: str) -> dict:
    from pretrain_cli.orchestration import host_fit
    from pretrain_cli.orchestration.prepare import prepare
    from pretrain_cli.run_config import Target

    argv = shlex.split(change)
    spec = prepare(str(cfg), argv, Target(device="cpu"))
    predicted = host_fit.planned_gib(spec.run, spec.model_cfg)
    out = subprocess.run(["/usr/bin/time", "-f", "%M", str(Path(sys.executable).parent / "pretrain-cli"), "train",
                          str(cfg), *argv], capture_output=True, text=True)
    if out.returncode:
        raise RuntimeError(f"{change}: exit {out.returncode}: {out.stderr[-2000:]}")
    measured = int(out.stderr.strip().splitlines()[-1]) / 2**20  # KiB -> GiB
    return {"change": change, "predicted_gib": predicted, "measured_gib": measured, "error": measured / predicted - 1,
            "band": host_fit.measured_error(spec.run)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", nargs="+", default=ROWS, help="each row's `--key value` changes to the demo file")
    p.add_argument("--json", action="store_true")
    ns = p.parse_args()
    with tempfile.TemporaryDirectory() as d:
        cfg = _files(Path(d))
        if not ns.json:
            print("| changes to the demo file (2 steps) | predicted GiB | peak RSS GiB | error |\n|---|---|---|---|")
        for change in ns.rows:
            r = row(cfg, change)
            print(json.dumps(r) if ns.json else
                  f"| {r['change']} | {r['predicted_gib']:.2f} | {r['measured_gib']:.2f} | {r['error']:+.1%} |",
                  flush=True)


if __name__ == "__main__":
    main()
