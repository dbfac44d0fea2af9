"""The floor's GEMM assumption re-checked: MKL's packed-weight GEMM against plain `cblas_sgemm` at the step's shapes.

Why: the floor (step_floor.py, docs/PERFORMANCE.md §4) times each Linear's GEMMs as plain `cblas_sgemm` calls. MKL
also offers `cblas_sgemm_pack` + `cblas_sgemm_compute`: the weight packed once into MKL's panel layout and reused.
The weight changes every step, so a step would pack each weight once per use: the forward reads W and the input
gradient reads Wᵀ (two packed forms), and the weight gradient xᵀ·dy does not read W at all; so there is no reuse
across a Linear's three GEMMs, only the question whether pack + compute beats sgemm's own packing per call. This
times, for the GEMMs that read a weight (`gemm_paths.gemm_set`'s y = x·W and dx = dy·Wᵀ), both forms alternately
in one process with the product's MKL path and threads, and prints ms per step and their ratio (pack included).

    python benchmarks/gemm_packed.py --config bench|small [--threads T] [--reps 9]
"""
from __future__ import annotations

import argparse
import ctypes
import os
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))
sys.path.insert(0, str(HERE))

from gemm_paths import gemm_set  # noqa: E402
from step_timing import load_config  # noqa: E402

ROW_MAJOR, NO_TRANS, TRANS, PACKED, B_MATRIX = 101, 111, 112, 151, 162  # MKL's CBLAS enum values


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default="bench", help="bench | small | path/to/config.json")
    ap.add_argument("--threads", type=int, default=None, help="threads (default: the product's, all cores)")
    ap.add_argument("--reps", type=int, default=9, help="alternated reps; the median is reported")
    a = ap.parse_args(argv)
    import numpy as np

    from pretrain_cli import runtime

    runtime.setup_env(a.threads)  # the product's MKL_DEBUG_CPU_TYPE and thread count
    paddle = runtime.import_paddle()
    cfg = load_config(a.config)
    libs = Path(paddle.__file__).parent / "libs"
    mkl = ctypes.CDLL(str(libs / "libmklml_intel.so"), mode=ctypes.RTLD_GLOBAL)
    mkl.cblas_sgemm_pack_get_size.restype = ctypes.c_size_t
    fp, one, zero = ctypes.POINTER(ctypes.c_float), ctypes.c_float(1.0), ctypes.c_float(0.0)
    rng = np.random.default_rng(0)
    calls = [c for c in gemm_set(cfg) if c[0] == 0]  # (trans_a, trans_b, m, n, k): the two that read the weight
    work = []
    for _, tb, m, n, k in calls:
        x = rng.standard_normal((m, k), dtype=np.float32)
        w = rng.standard_normal((n, k) if tb else (k, n), dtype=np.float32)
        packed = np.empty(mkl.cblas_sgemm_pack_get_size(B_MATRIX, m, n, k) // 4 + 16, np.float32)
        work.append((tb, m, n, k, x, w, packed, np.empty((m, n), np.float32), np.empty((m, n), np.float32)))

    def plain(lo, hi):
        for tb, m, n, k, x, w, _, c, _ in work[lo:hi]:
            mkl.cblas_sgemm(ROW_MAJOR, NO_TRANS, TRANS if tb else NO_TRANS, m, n, k, one, x.ctypes.data_as(fp), k,
                            w.ctypes.data_as(fp), k if tb else n, zero, c.ctypes.data_as(fp), n)

    def pack_compute(lo, hi):
        for tb, m, n, k, x, w, packed, _, c in work[lo:hi]:
            mkl.cblas_sgemm_pack(ROW_MAJOR, B_MATRIX, TRANS if tb else NO_TRANS, m, n, k, one, w.ctypes.data_as(fp),
                                 k if tb else n, packed.ctypes.data_as(fp))
            mkl.cblas_sgemm_compute(ROW_MAJOR, NO_TRANS, PACKED, m, n, k, x.ctypes.data_as(fp), k,
                                    packed.ctypes.data_as(fp), k if tb else n, zero, c.ctypes.data_as(fp), n)

    layers, head = cfg["model"]["num_hidden_layers"], len(work) - 2  # the head's two GEMMs come last
    times: dict[str, list[float]] = {"sgemm": [], "pack+compute": []}
    for fn in (plain, pack_compute):
        fn(0, len(work))  # warm-up
    for _ in range(a.reps):
        for name, fn in (("sgemm", plain), ("pack+compute", pack_compute)):
            t0 = time.perf_counter()
            fn(0, head)
            t1 = time.perf_counter()
            fn(head, len(work))
            times[name].append(layers * (t1 - t0) + time.perf_counter() - t1)  # one step's weight-reading GEMMs
    for tb, m, n, k, _, _, _, c, c2 in work:
        np.testing.assert_allclose(c2, c, rtol=1e-3, atol=1e-2)  # the same products
    ms = {name: statistics.median(t) * 1e3 for name, t in times.items()}
    print(f"{a.config}: forward + input-gradient GEMMs per step: sgemm {ms['sgemm']:.1f} ms, "
          f"pack + compute {ms['pack+compute']:.1f} ms, ratio {ms['pack+compute'] / ms['sgemm']:.3f} "
          f"(MKL_DEBUG_CPU_TYPE={os.environ.get('MKL_DEBUG_CPU_TYPE', 'unset')})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
