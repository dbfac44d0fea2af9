"""Attention's time and peak memory per rank under context parallelism vs one process, at growing lengths (CPU).

Why: context parallelism exists so that one sequence's attention does not have to fit one device. This times
the attention of one layer, forward + backward, on one sequence of S tokens: in one process with the kernels
`train` runs there (the fused CPU block-causal kernel, `use_flash_attention: true`; and the materialising
`sdpa_mask`, `false`), and on `--cp` processes under the real launcher, each holding S/cp tokens
(`distributed.steps.context`: ring attention, blocks through Paddle's ops, K/V and dK/dV blocks passed between
neighbours with gloo's blocking send/recv). Peak memory is the process's peak RSS above its RSS before the
first call (each measurement runs in a fresh process, so the peak is this length's own). Prints one row per length:
milliseconds and MiB, and cp's ratio to one process.

    python benchmarks/context_attention.py [--seqs 1024,2048,4096,8192] [--cp 2] [--heads 8] [--kv_heads 2]
        [--head_dim 64] [--reps 3] [--math_max 4096] [--json]
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def worker(a) -> None:
    """One measurement: this process's (or this rank's) attention at --seq, printed as one JSON line."""
    import numpy as np

    from pretrain_cli import runtime

    paddle = runtime.import_paddle()
    from pretrain_cli.ops import kernels
    from pretrain_cli.run_config import KernelConfig

    rank, cp = 0, a.cp
    if a.path == "context":
        import paddle.distributed as dist

        from pretrain_cli.distributed.steps.context import context_attention, cp_group
        from pretrain_cli.run_layout import ParallelConfig

        dist.init_parallel_env()
        rank = dist.get_rank()
        ring = cp_group(ParallelConfig(world_size=cp, rank=rank, cp_degree=cp))
        attend, _ = context_attention(ring, cp, rank, kernels.block_forward)
    else:
        attend = kernels.select(KernelConfig(attention="flash" if a.path == "cpu" else "math")).attention
    rng = np.random.default_rng(rank)
    n = a.seq // cp

    def tensor(heads):
        return paddle.to_tensor(rng.standard_normal((1, n, heads, a.head_dim)).astype("float32"), stop_gradient=False)

    q, k, v = tensor(a.heads), tensor(a.kv_heads), tensor(a.kv_heads)
    before = _rss_mib()
    times = []
    for _ in range(a.reps + 1):
        start = time.perf_counter()
        out = attend(q, k, v)
        out.sum().backward()
        times.append(time.perf_counter() - start)
        q.clear_gradient(), k.clear_gradient(), v.clear_gradient()
        del out
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"path": a.path, "seq": a.seq, "rank": rank, "ms": 1e3 * sorted(times[1:])[len(times[1:]) // 2],
                      "peak_mib": peak - before}), flush=True)


def _measure(a, path: str, seq: int) -> list[dict]:
    args = [str(Path(__file__).resolve()), "--worker", "--path", path, "--seq", str(seq), "--cp",
            str(a.cp if path == "context" else 1), "--heads", str(a.heads), "--kv_heads", str(a.kv_heads),
            "--head_dim", str(a.head_dim), "--reps", str(a.reps)]
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"), OMP_NUM_THREADS="1")
    with tempfile.TemporaryDirectory() as tmp:
        if path == "context":
            cmd = [sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node", str(a.cp), "--log_dir",
                   tmp, *args]
        else:
            cmd = [sys.executable, *args]
        proc = subprocess.run(cmd, env=env, cwd=tmp, capture_output=True, text=True, timeout=1800)
        text = proc.stdout + "".join(p.read_text() for p in Path(tmp).glob("workerlog.*"))
    rows = [json.loads(line) for line in text.splitlines() if line.startswith('{"path"')]
    if proc.returncode or not rows:
        raise SystemExit(f"{path} at {seq}: exit {proc.returncode}\n{text[-3000:]}")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seqs", default="1024,2048,4096,8192")
    ap.add_argument("--cp", type=int, default=2)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--kv_heads", type=int, default=2)
    ap.add_argument("--head_dim", type=int, default=64)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--math_max", type=int, default=4096, help="longest sequence for the materialising path")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--path", default="cpu", help=argparse.SUPPRESS)
    ap.add_argument("--seq", type=int, default=0, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        worker(a)
        return
    results = []
    for seq in [int(x) for x in a.seqs.split(",")]:
        row = {"seq": seq}
        for path in ("cpu", "math", "context"):
            if path == "math" and seq > a.math_max:
                row[path] = None
                continue
            ranks = _measure(a, path, seq)
            row[path] = {"ms": max(r["ms"] for r in ranks), "peak_mib": max(r["peak_mib"] for r in ranks)}
        results.append(row)
        if not a.json:
            c, m, x = row["cpu"], row["math"], row["context"]
            math = f"{m['ms']:8.1f} ms {m['peak_mib']:7.1f} MiB" if m else f"{'(skipped: --math_max)':>24}"
            print(f"seq {seq:6d}: one process CPU kernel {c['ms']:8.1f} ms {c['peak_mib']:7.1f} MiB | math {math} | "
                  f"cp{a.cp} per rank {x['ms']:8.1f} ms {x['peak_mib']:7.1f} MiB | cp / CPU kernel: time "
                  f"{x['ms'] / c['ms']:.2f}x, memory {x['peak_mib'] / max(c['peak_mib'], 1e-9):.2f}x", flush=True)
    if a.json:
        print(json.dumps({"cp": a.cp, "heads": a.heads, "kv_heads": a.kv_heads, "head_dim": a.head_dim,
                          "results": results}, indent=1))


if __name__ == "__main__":
    main()
