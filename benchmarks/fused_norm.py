"""The residual add + RMSNorm kernel (`pcl_add_rms_norm`) against Paddle's add and the RMSNorm kernel, fwd + bwd.

Why a microbenchmark: the saving is ~1 % of a step, below what a whole-step run resolves on a shared VM, while
both variants timed alternately in one process see the same load. Each rep runs `h = x + a`, `y = norm(h)` and
the backward of a loss that uses both h and y (as the decoder layer does: h is the residual, y the MLP's input),
so the unfused side pays the add, its add_grad and the accumulation of h's two gradients (docs/PERFORMANCE.md §3.11).

    python benchmarks/fused_norm.py [--threads 2] [--shape 8,256,256] [--reps 60]
"""
from __future__ import annotations

import argparse
import sys
import time

import numpy as np


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=None, help="threads (default: the product's, all cores)")
    ap.add_argument("--shape", default="8,256,256", help="activation shape (bench: 8,256,256; small: 4,512,512)")
    ap.add_argument("--reps", type=int, default=60, help="alternated reps of each variant")
    a = ap.parse_args(argv)
    from pretrain_cli import runtime

    runtime.setup_env(a.threads)
    paddle = runtime.import_paddle()
    from pretrain_cli.ops import kernels

    shape = [int(v) for v in a.shape.split(",")]
    x0, a0, w0 = paddle.randn(shape), paddle.randn(shape), paddle.rand(shape[-1:]) + 0.5
    gh, gy = paddle.randn(shape), paddle.randn(shape)

    def unfused(x, r, w):
        h = x + r
        return h, kernels.rms_norm_cpu(h, w, 1e-6)

    def fused(x, r, w):
        return kernels.add_rms_norm_cpu(x, r, w, 1e-6)

    def once(fn) -> float:
        x, r, w = (t.detach() for t in (x0, a0, w0))
        for t in (x, r, w):
            t.stop_gradient = False
        start = time.perf_counter()
        h, y = fn(x, r, w)
        paddle.autograd.backward([h, y], [gh, gy])
        float(x.grad.reshape([-1])[0])  # the backward has finished
        return time.perf_counter() - start

    times: dict[str, list[float]] = {"unfused": [], "fused": []}
    once(fused), once(unfused)  # warm-up
    for _ in range(a.reps):
        times["fused"].append(once(fused))
        times["unfused"].append(once(unfused))
    for name, t in times.items():
        print(f"{name:8} min {min(t) * 1e3:8.3f} ms  median {np.median(t) * 1e3:8.3f} ms")
    print(f"fused / unfused: min {min(times['fused']) / min(times['unfused']):.3f}, "
          f"median {np.median(times['fused']) / np.median(times['unfused']):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
