"""Process-wide setup that must happen before `import paddle`.

Paddle reads its math-library environment once, at import or at the first matmul
(see docs/PERFORMANCE.md): MKL 2019 takes a slow generic path on AMD CPUs unless
`MKL_DEBUG_CPU_TYPE=5` (on Intel with AVX-512 the same setting halves matmul speed, so it is
set on AMD only), and `import paddle` pins `OMP_NUM_THREADS=1` when it is unset.
Every entry point calls `setup_env()` first and imports Paddle through `import_paddle()`,
so no module sets environment variables at import time.
"""
from __future__ import annotations

import os
import warnings

_DONE = False


def default_threads() -> int:
    """Threads per process: the cores this process may use, divided among local ranks."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    local = int(os.environ.get("PADDLE_LOCAL_SIZE", "1") or 1)
    return max(1, cores // max(1, local))


def is_amd() -> bool:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            return "AuthenticAMD" in f.read(4096)
    except OSError:
        return False


def setup_env(threads: int | None = None) -> None:
    """Set the CPU math environment and quiet Paddle's import noise, unless the user set them."""
    global _DONE
    if _DONE:
        return
    n = str(threads or default_threads())
    if is_amd():  # MKL 2019 takes its slow generic path on AMD; on AVX-512 Intel type 5 would force AVX2
        os.environ.setdefault("MKL_DEBUG_CPU_TYPE", "5")
    os.environ.setdefault("OMP_NUM_THREADS", n)
    os.environ.setdefault("MKL_NUM_THREADS", os.environ["OMP_NUM_THREADS"])
    # glog INFO/WARNING lines and the "Modified FLAGS" banner say nothing a user can act on.
    os.environ.setdefault("GLOG_minloglevel", "2")
    os.environ.setdefault("GLOG_v", "0")
    warnings.filterwarnings("ignore", message=".*OMP_NUM_THREADS.*")
    # Paddle's C++-extension helper warns about a missing compiler cache when fleet utilities load.
    warnings.filterwarnings("ignore", message="No ccache found")
    _DONE = True


def import_paddle():
    """Import Paddle after `setup_env()`; the only sanctioned way to get the module."""
    setup_env()
    import io
    import contextlib

    # Paddle prints an OMP_NUM_THREADS advisory on stderr at import when threads > 1.
    buf = io.StringIO()
    with contextlib.redirect_stderr(buf):
        import paddle  # noqa: F401
    paddle.base.core.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    return paddle
