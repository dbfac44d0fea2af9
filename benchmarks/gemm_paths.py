"""The training step's GEMMs under each MKL code path Paddle's MKL can take here, next to torch's and OpenBLAS's.

Why: `runtime.mkl_cpu_type` decides `MKL_DEBUG_CPU_TYPE` per CPU (MKL 2019 reads it once, at its first
call, so each path needs its own process). This times the forward, input-gradient and weight-gradient GEMM
of every Linear of one decoder layer plus the LM head of a benchmark config (`benchmarks/configs/`), in
Paddle's own MKL (`libmklml_intel.so`, row-major `cblas_sgemm`, the layouts `paddle.matmul` uses) and in
torch's `matmul` and numpy's OpenBLAS (the library numpy's wheel bundles, whose runtime dispatch picks its
own kernels per CPU: the check that no other GEMM library beats the floor's MKL here), each in a fresh process, the
processes alternated `--rounds` times, and prints GFLOP/s per path, the median over rounds, and each path's ratio to
the one the runtime picks. It also prints what those GEMMs cost in one training step (layers × one layer's + the
head's, in ms): the step's time from `train_throughput.py` minus that is what the step spends outside its projection,
MLP and head GEMMs.

    python benchmarks/gemm_paths.py --config bench|small [--paths auto,5,7,torch,torch-bf16,openblas] [--rounds 3]
        [--threads T]

A path this CPU cannot run (type 7 = AVX-512 kernels on a CPU without AVX-512) is skipped, not tried:
it would die on an illegal instruction.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))
sys.path.insert(0, str(HERE))

from step_timing import load_config  # noqa: E402  (benchmarks/ is on the path from here on)


def gemm_set(cfg: dict) -> list[tuple[int, int, int, int, int]]:
    """(trans_a, trans_b, m, n, k) of one layer's Linears and the head: y = x·W, dx = dy·Wᵀ, dW = xᵀ·dy."""
    m, a = cfg["model"], cfg["arguments"]
    tokens = a["per_device_train_batch_size"] * a["max_seq_length"]
    hidden, inter, vocab = m["hidden_size"], m["intermediate_size"], m["vocab_size"]
    head_dim = hidden // m["num_attention_heads"]
    q, kv = m["num_attention_heads"] * head_dim, m["num_key_value_heads"] * head_dim
    linears = [(hidden, q), (hidden, kv), (hidden, kv), (q, hidden), (hidden, 2 * inter), (inter, hidden),
               (hidden, vocab)]
    calls = []
    for k_in, n_out in linears:
        calls += [(0, 0, tokens, n_out, k_in), (0, 1, tokens, k_in, n_out), (1, 0, k_in, n_out, tokens)]
    return calls


def _time(run, reps: int = 7) -> float:
    run()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        run()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def mkl_runner(calls: list, mats: list, threads: int):
    """run_calls(lo, hi): calls[lo:hi] through Paddle's own MKL (`libmklml_intel.so`, row-major `cblas_sgemm`, the
    layouts `paddle.matmul` uses) on the numpy operands `mats`, into outputs made here. Shared with
    `step_regions.py`, which times the step's regions against the same calls."""
    import numpy as np
    import paddle

    libs = Path(paddle.__file__).parent / "libs"
    ctypes.CDLL(str(libs / "libiomp5.so"), mode=ctypes.RTLD_GLOBAL).omp_set_num_threads(threads)
    mkl = ctypes.CDLL(str(libs / "libmklml_intel.so"), mode=ctypes.RTLD_GLOBAL)
    fp = ctypes.POINTER(ctypes.c_float)
    outs = [np.empty((m, n), np.float32) for _, _, m, n, _ in calls]

    def run_calls(lo, hi):
        for (ta, tb, m, n, k), (x, w), c in zip(calls[lo:hi], mats[lo:hi], outs[lo:hi]):
            mkl.cblas_sgemm(101, 112 if ta else 111, 112 if tb else 111, m, n, k, ctypes.c_float(1.0),
                            x.ctypes.data_as(fp), m if ta else k, w.ctypes.data_as(fp), k if tb else n,
                            ctypes.c_float(0.0), c.ctypes.data_as(fp), n)
    return run_calls


def operands(calls: list) -> list:
    """Random fp32 (x, w) per call of `gemm_set`, in the layout each call reads (transposed ones stored so)."""
    import numpy as np

    rng = np.random.default_rng(0)
    return [(rng.standard_normal((k, m) if ta else (m, k), dtype=np.float32),
             rng.standard_normal((n, k) if tb else (k, n), dtype=np.float32)) for ta, tb, m, n, k in calls]


def worker(cfg: dict, path: str, threads: int) -> dict:
    import numpy as np

    from pretrain_cli import runtime

    runtime.keep_freed_memory()  # as in training (and in the harness's compiled HF worker)
    calls = gemm_set(cfg)
    flops = sum(2 * m * n * k for _, _, m, n, k in calls)
    mats = operands(calls)
    if path == "openblas":  # numpy's sgemm; transposed operands are views it passes to BLAS with trans flags
        ops = [((x.T if ta else x), (w.T if tb else w), np.empty((m, n), np.float32))
               for (ta, tb, m, n, _), (x, w) in zip(calls, mats)]

        def run_calls(lo, hi):
            for x, w, c in ops[lo:hi]:
                np.matmul(x, w, out=c)
    elif path in ("torch", "torch-bf16"):
        import torch

        torch.set_num_threads(threads)
        # torch-bf16: the same products in bf16 (oneDNN's AMX kernels where the CPU has AMX): what a bf16 step's
        # GEMMs could cost here. Not a path of the product: Paddle's CPU wheel has no bf16 matmul kernel, and the
        # CPU step trains in fp32 (§4 of docs/PERFORMANCE.md).
        dtype = torch.bfloat16 if path == "torch-bf16" else torch.float32
        ops = [((torch.from_numpy(x).to(dtype).t() if ta else torch.from_numpy(x).to(dtype)),
                (torch.from_numpy(w).to(dtype).t() if tb else torch.from_numpy(w).to(dtype)),
                torch.empty(m, n, dtype=dtype))
               for (ta, tb, m, n, _), (x, w) in zip(calls, mats)]

        def run_calls(lo, hi):
            for x, w, c in ops[lo:hi]:  # transposed operands are views: BLAS reads them with its trans flags
                torch.matmul(x, w, out=c)
    else:
        run_calls = mkl_runner(calls, mats, threads)
    # one layer's GEMMs and the head's (`gemm_set` puts the head's three last), each timed on its own
    layer, head = _time(lambda: run_calls(0, len(calls) - 3)), _time(lambda: run_calls(len(calls) - 3, len(calls)))
    seconds = layer + head
    return {"path": path, "mkl_debug_cpu_type": os.environ.get("MKL_DEBUG_CPU_TYPE", "unset"),
            "gflops": round(flops / seconds / 1e9, 1), "ms": round(seconds * 1e3, 2),
            "step_ms": round((cfg["model"]["num_hidden_layers"] * layer + head) * 1e3, 2)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default="bench", help="bench | small | path/to/config.json")
    ap.add_argument("--paths", default="auto,5,7,torch",
                    help="auto = runtime.mkl_cpu_type's choice, a number = that MKL_DEBUG_CPU_TYPE, unset, torch, "
                         "torch-bf16 (the same GEMMs in bf16: AMX where the CPU has it; not a product path), "
                         "openblas (numpy's)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    cfg = load_config(a.config)
    threads = a.threads or len(os.sched_getaffinity(0))
    if a.worker:
        print(json.dumps(worker(cfg, a.worker, threads)))
        return 0
    from pretrain_cli import runtime

    chosen = runtime.mkl_cpu_type() or "unset"
    paths = []
    for p in a.paths.split(","):
        p = chosen if p == "auto" else p
        if p == "7" and not runtime.has_avx512_core():
            print("skipping MKL type 7: this CPU has no AVX-512 (it would die on an illegal instruction)")
            continue
        if p not in paths:
            paths.append(p)
    results: dict[str, list[float]] = {p: [] for p in paths}
    step_ms: dict[str, list[float]] = {p: [] for p in paths}
    for _ in range(a.rounds):
        for p in paths:
            env = {k: v for k, v in os.environ.items() if k not in ("MKL_DEBUG_CPU_TYPE", "OMP_NUM_THREADS")}
            env["OPENBLAS_NUM_THREADS"] = str(threads)  # read once, when numpy loads OpenBLAS
            if p not in ("torch", "torch-bf16", "unset", "openblas"):
                env["MKL_DEBUG_CPU_TYPE"] = p
            out = subprocess.run([sys.executable, __file__, "--config", a.config, "--threads", str(threads),
                                  "--worker", p], env=env, capture_output=True, text=True, check=True)
            row = json.loads(out.stdout.strip().splitlines()[-1])
            results[p].append(row["gflops"])
            step_ms[p].append(row["step_ms"])
    base = statistics.median(results[chosen]) if chosen in results else None
    print(f"{a.config}: one layer's Linears + the LM head, forward and both gradients, {threads} threads; "
          f"runtime.mkl_cpu_type() here = {chosen}")
    for p, vals in results.items():
        med = statistics.median(vals)
        name = {"torch": "torch matmul", "torch-bf16": "torch matmul, bf16", "openblas": "numpy OpenBLAS"}.get(
            p, f"paddle MKL type {p}")
        ratio = f"  {med / base:.3f}x the runtime's choice" if base else ""
        print(f"  {name:22} {med:7.1f} GFLOP/s (rounds: {', '.join(f'{v:.1f}' for v in vals)}){ratio}")
        print(f"  {'':22} one step's {cfg['model']['num_hidden_layers']} layers + head: "
              f"{statistics.median(step_ms[p]):.1f} ms of these GEMMs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
