"""Where our training step exceeds its floor, region by region: each region's own time in the step (Paddle's
profiler) beside the floor's term for the same work (its GEMMs through Paddle's MKL, attention's triangle at the
matmul peak, AdamW's bytes at the stream rate: `step_floor.py`'s three terms, split the same way).

Why: `train_throughput.py --floor` says how far the step is from its floor (docs/PERFORMANCE.md §4), not where the
difference sits, and a kernel is worth writing only where a region's excess is. The step and the terms are
measured in one process, minutes apart at most, so a drifting VM moves both.

    python benchmarks/step_regions.py --config bench|small [--steps 8] [--threads T]

Each Linear's three GEMMs (forward, input and weight gradient) are timed as one sequence on operands of their own,
so every region's term is measured alike; `step_floor.py` times a whole layer's at once, whose operands crowd the
cache more: the sum of the GEMM terms is printed beside that figure. The regions follow the event names of the
kernels this machine selects (printed); with other kernels (`--cpu-ops off`) most time falls under "the rest".
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))
sys.path.insert(0, str(HERE))

from step_timing import load_config, matmul_peak_gflops, own_times, timed  # noqa: E402  (benchmarks/ on the path)

LINEARS = ("q", "k", "v", "o", "gate|up", "down", "head")  # gemm_paths.gemm_set's order, three calls each
# (region, profiler events whose own time is the region's (matched in "<type> <name>"), the Linears it multiplies)
REGIONS = (
    ("LM head + loss", ("Forward CausalLM", "FusedLinearLoss"), ("head",)),
    ("MLP (gate|up + SwiGLU, down + residual add)", ("Forward MLP", "pcl_mlp_in_grad", "pcl_linear_residual_grad"),
     ("gate|up", "down")),
    ("q|k|v projections + RoPE", ("Forward Attention", "pcl_attn_in_grad"), ("q", "k", "v")),
    ("o projection + residual add + norm", ("Forward DecoderLayer", "pcl_linear_add_rms_norm_grad"), ("o",)),
    ("attention", ("Forward CoreAttention", "pcl_causal_attention_grad"), ()),
)
REST = "the rest (norms, embedding, optimizer, Python)"


def regions(own: dict, gemm_s: dict, layers: int, attention_s: float, adamw_s: float) -> list[tuple[str, float, float]]:
    """(region, seconds in the step, seconds of its floor term) per region, then the rest against AdamW's term.
    `own`: {(type, name): own seconds per step}; `gemm_s`: {Linear: its three GEMMs' seconds}. A pure function,
    so the grouping is tested apart from the timing."""
    taken: set = set()
    rows = []
    for name, events, linears in REGIONS:
        keys = [key for key in own if key not in taken and any(e in f"{key[0]} {key[1]}" for e in events)]
        taken.update(keys)
        term = sum(gemm_s[lin] * (1 if lin == "head" else layers) for lin in linears) if linears else attention_s
        rows.append((name, sum(own[key] for key in keys), term))
    rows.append((REST, sum(t for key, t in own.items() if key not in taken), adamw_s))
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default="bench", help="bench | small | path/to/config.json")
    ap.add_argument("--steps", type=int, default=8, help="steps timed, then as many profiled")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None, help="default: the product's choice (runtime.setup_env)")
    a = ap.parse_args(argv)
    a.mkl_cpu_type, a.set_json, a.to_static, a.cpu_ops = "auto", None, False, "on"
    cfg = load_config(a.config)
    from gemm_paths import _time, gemm_set, mkl_runner, operands
    from step_floor import adamw_bytes, attention_gflop, stream_gbps
    from train_throughput import build_our_step

    trainer, data, _, _, _ = build_our_step(cfg, a)  # sets the product's environment before Paddle loads
    import os

    threads = int(os.environ["OMP_NUM_THREADS"])
    _, times = timed(lambda: trainer.train_step(data)[0], a.warmup, a.steps)
    step_s = sorted(times)[len(times) // 2]
    own, profiled = own_times(lambda: trainer.train_step(data), a.steps)

    calls = gemm_set(cfg)
    run_calls = mkl_runner(calls, operands(calls), threads)
    gemm_s = {lin: _time(lambda i=i: run_calls(3 * i, 3 * i + 3)) for i, lin in enumerate(LINEARS)}
    layers = cfg["model"]["num_hidden_layers"]
    n = len(calls)
    as_floor = layers * _time(lambda: run_calls(0, n - 3)) + _time(lambda: run_calls(n - 3, n))
    peak = matmul_peak_gflops("paddle")
    attention_s = attention_gflop(cfg) / peak
    opt = adamw_bytes(cfg)
    adamw_s = opt / (stream_gbps(opt // 28, threads) * 1e9)
    rows = regions(own, gemm_s, layers, attention_s, adamw_s)

    floor = sum(term for _, _, term in rows)
    over = sum(max(0.0, t - term) for _, t, term in rows)
    print(f"{a.config}: {threads} threads, kernels: {trainer.raw_model.kernels.describe()}")
    print(f"step {step_s * 1e3:.1f} ms (median of {a.steps}), {profiled * 1e3:.1f} ms profiled; the terms below sum "
          f"to {floor * 1e3:.1f} ms (ours at {floor / step_s:.2f} of it); GEMMs one Linear at a time "
          f"{sum(t for _, _, t in rows[:-2]) * 1e3:.1f} ms, a layer's at once as step_floor.py times them "
          f"{as_floor * 1e3:.1f} ms; attention at the {peak:.0f} GFLOP/s peak")
    print(f"the in-step column is profiled: it sums to {profiled * 1e3:.1f} ms, the profiler's own "
          f"{(profiled - step_s) * 1e3:.1f} ms falling mostly on the regions of many small ops (the rest)")
    print(f"{'region':48} {'in step':>9} {'floor term':>11} {'over':>8} {'of the excess':>14}")
    for name, t, term in rows:
        share = max(0.0, t - term) / over if over else 0.0
        print(f"{name:48} {t * 1e3:>7.1f}ms {term * 1e3:>9.1f}ms {(t - term) * 1e3:>6.1f}ms {share:>13.0%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
