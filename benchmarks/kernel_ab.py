"""One fused CPU kernel on and off, alternated step by step in ONE process: our real bench step with the kernel
table as selected (A) and with one of its optional entries set to None (B, the path the model takes without it).

Why: on shared VMs separate processes drift by ±3 % between runs minutes apart (docs/PERFORMANCE.md §4), which
hides any single fusion worth ~1 % of a step. Here both variants share the process, the model, the optimizer
state, the allocator and the machine's moment; they alternate every step (ABBA order), and the ratio of each
adjacent pair's times is taken, so drift cancels. The entries that can be None: `mlp_in` (the gate|up GEMM +
SwiGLU op, §3.12), `add_rms_norm` (the residual add inside the norm, §3.11; both sides then run o_proj as its own
Linear, since §3.18's op holds that pass otherwise), `attn_in` (the q/k/v GEMMs + RoPE op, §3.13),
`linear_residual` (the down projection + residual add, §3.15), `linear_add_rms_norm` (o_proj + residual add + the
post-attention norm, §3.18); `embedding` (the lookup with its gradient on every thread, §3.17) switches to Paddle's.

    python benchmarks/kernel_ab.py --config bench --entry mlp_in --pairs 40 [--threads T]
"""
from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))
sys.path.insert(0, str(HERE))

from step_timing import load_config  # noqa: E402  (benchmarks/ is on the path from here on)
from train_throughput import build_our_step  # noqa: E402

OPTIONAL = ("mlp_in", "add_rms_norm", "attn_in", "linear_residual", "linear_add_rms_norm", "embedding")


def pair_ratios(with_s: list[float], without_s: list[float]) -> dict:
    """Step times of the two variants (same length, taken in alternation) → medians and the median of the
    per-pair ratios without / with (> 1: the kernel pays); a pure function so the arithmetic is tested apart."""
    ratios = [b / a for a, b in zip(with_s, without_s)]
    return {"with_ms": round(statistics.median(with_s) * 1e3, 2),
            "without_ms": round(statistics.median(without_s) * 1e3, 2),
            "pair_ratio_median": round(statistics.median(ratios), 4),
            "pairs_faster_with": sum(r > 1 for r in ratios), "pairs": len(ratios)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default="bench", help="bench | small | path/to/config.json")
    ap.add_argument("--entry", default="mlp_in", choices=OPTIONAL, help="the kernel-table entry switched off in B")
    ap.add_argument("--pairs", type=int, default=40)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=None)
    a = ap.parse_args(argv)
    a.mkl_cpu_type, a.set_json, a.to_static, a.cpu_ops = "auto", None, False, "on"
    trainer, data, _, _, _ = build_our_step(load_config(a.config), a)
    model = trainer.raw_model
    with_k = model.kernels
    from pretrain_cli.ops.reference import embedding_reference

    off = {"embedding": embedding_reference}.get(a.entry)  # None, or for an entry that always has a path, Paddle's
    if getattr(with_k, a.entry) is off:
        raise SystemExit(f"kernel_ab: {a.entry} is not selected on this machine ({with_k.describe()}): "
                         "nothing to compare")
    if a.entry == "add_rms_norm":  # the add-norm runs only where o_proj is not fused into it (§3.18): both sides so
        with_k = dataclasses.replace(with_k, linear_add_rms_norm=None)
    without_k = dataclasses.replace(with_k, **{a.entry: off})
    holders = [layer for layer in model.sublayers(include_self=True) if hasattr(layer, "kernels")]

    def step(kernels) -> float:
        for layer in holders:  # every layer reads its table at each forward
            layer.kernels = kernels
        t = time.perf_counter()
        trainer.train_step(data)
        return time.perf_counter() - t

    for _ in range(a.warmup):
        step(with_k), step(without_k)
    with_s, without_s = [], []
    for i in range(a.pairs):  # ABBA: neither variant always runs first
        order = ((with_k, with_s), (without_k, without_s)) if i % 2 == 0 else ((without_k, without_s), (with_k, with_s))
        for kernels, times in order:
            times.append(step(kernels))
    r = pair_ratios(with_s, without_s)
    print(f"{a.config}: {a.entry} on {r['with_ms']} ms, off {r['without_ms']} ms per step (medians); off / on per "
          f"adjacent pair: median {r['pair_ratio_median']}, on faster in {r['pairs_faster_with']} of {r['pairs']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
