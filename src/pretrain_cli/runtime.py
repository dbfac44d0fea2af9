"""Process-wide setup that must happen before `import paddle`.

Paddle reads its math-library environment once, at import or at the first matmul
(see docs/PERFORMANCE.md): MKL 2019 picks its code path by CPU vendor and takes a slow generic one
on AMD unless `MKL_DEBUG_CPU_TYPE` names a path (`mkl_cpu_type`), and `import paddle` pins
`OMP_NUM_THREADS=1` when it is unset (also in `paddle.distributed.launch`, whose workers inherit it:
`decide_threads`).
Every entry point calls `setup_env()` first and imports Paddle through `import_paddle()`,
so no module sets environment variables at import time.
"""
from __future__ import annotations

import contextlib
import ctypes
import faulthandler
import gc
import io
import os
import re
import signal
import sys
import threading
import warnings

from pretrain_cli import start_signals

_DONE = False


def default_threads(local_processes: int = 1) -> int:
    """Threads per process: the cores this process may use, divided among the processes on this node."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return max(1, cores // max(1, local_processes))


def gpu_build_installed() -> bool:
    """Whether a GPU build of Paddle is installed, without paying for `import paddle`."""
    import importlib.metadata

    for dist in ("paddlepaddle-gpu", "paddlepaddle_gpu"):
        try:
            importlib.metadata.distribution(dist)
            return True
        except importlib.metadata.PackageNotFoundError:
            continue
    return False


_GPU_NAME: list = []  # the driver's GPU name, once looked up (None: no GPU)


def gpu_name() -> str | None:
    """This process's GPU as the driver names it ("NVIDIA A100-SXM4-80GB"), or None without a GPU build or a
    GPU. Imports Paddle (on a GPU build only) and asks the driver once per process: `orchestration.prepare`'s target
    and the trainer's MFU read the same answer."""
    if not _GPU_NAME:
        name = None
        if gpu_build_installed():
            paddle = import_paddle()
            if paddle.is_compiled_with_cuda() and paddle.device.cuda.device_count() > 0:
                name = paddle.device.cuda.get_device_name()
        _GPU_NAME.append(name)
    return _GPU_NAME[0]


_GPU_CAPABILITY: list = []  # the driver's compute capability, once looked up (None: no GPU)


def gpu_capability() -> tuple[int, int] | None:
    """This process's GPU's CUDA compute capability (`paddle.device.cuda.get_device_capability()`), or None without a
    GPU build or a GPU: what `config.resolve` judges bf16 and flash attention by (`planning.hardware.pre_ampere`)."""
    if not _GPU_CAPABILITY:
        cap = None
        if gpu_build_installed():
            import_paddle()  # the environment first
            import paddle  # (a plain import, so tests/unit/test_gpu_api.py checks the call below)

            if paddle.is_compiled_with_cuda() and paddle.device.cuda.device_count() > 0:
                cap = tuple(paddle.device.cuda.get_device_capability())
        _GPU_CAPABILITY.append(cap)
    return _GPU_CAPABILITY[0]


def _cpuinfo_head() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            return f.read(8192)
    except OSError:
        return ""


# MKL's AVX-512 kernels are its Skylake-server ones: they need these five extensions, no more
_AVX512_CORE = frozenset({"avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl"})


def mkl_cpu_type(cpuinfo: str | None = None) -> str | None:
    """The `MKL_DEBUG_CPU_TYPE` this CPU wants, or None to leave MKL's own choice.

    MKL 2019 (Paddle's) trusts its dispatch only on Intel: there it picks AVX-512 itself, and forcing a
    path would only lose (type 5 halved matmul speed on an AVX-512 Xeon). On AMD it runs a generic path,
    4x slower per thread, unless told: 5 is its AVX2 path, 7 its AVX-512 one, which on an AVX-512 AMD
    CPU ran the training step's GEMMs 1.5-17 % faster than 5 on Zen 4 in every alternated run
    (docs/PERFORMANCE.md §3.9) and the whole step 1.8x as fast on Zen 5, whose AVX-512 units are full
    width (§1.0d). Type 7 on a CPU without AVX-512 would die on an illegal instruction, so it
    is chosen only when every extension those kernels use is in the CPU's flags.
    """
    text = _cpuinfo_head() if cpuinfo is None else cpuinfo
    if "AuthenticAMD" not in text:
        return None
    return "7" if has_avx512_core(text) else "5"


def has_avx512_core(cpuinfo: str | None = None) -> bool:
    """Whether the CPU has every AVX-512 extension MKL's AVX-512 kernels use."""
    text = _cpuinfo_head() if cpuinfo is None else cpuinfo
    flags = next((ln.split(":", 1)[1].split() for ln in text.splitlines() if ln.startswith("flags")), [])
    return _AVX512_CORE <= set(flags)


def keep_freed_memory() -> bool:
    """Keep freed tensor memory in the process instead of returning it to the OS.

    glibc serves every allocation above 128 KiB-32 MiB with a fresh `mmap` and unmaps it on free, so each
    step's activations, logits and gradients are page-faulted and zeroed by the kernel again: a
    [2048, 32000] logits GEMM ran at 155 GFLOP/s instead of 260, and a fresh 256 MB tensor took 258 ms
    instead of 55 (docs/PERFORMANCE.md). Paddle's CPU allocator asks glibc each time, so the fix is
    glibc's: no mmap for large blocks, no trimming of the heap top. The cost is that peak memory stays
    reserved until the process ends, which is what a training process wants anyway.
    `PRETRAIN_CLI_MALLOC=system` keeps glibc's defaults.
    """
    if os.environ.get("PRETRAIN_CLI_MALLOC", "").lower() == "system" or not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (e.g. musl): nothing to tune
        return False
    m_trim_threshold, m_mmap_max = -1, -4
    return bool(mallopt(m_mmap_max, 0)) and bool(mallopt(m_trim_threshold, 2**31 - 1))


# Set by scripts/launch.sh from the user's OMP_NUM_THREADS, or by the user: threads per process, always obeyed.
THREADS_VAR = "PRETRAIN_CLI_THREADS"
_THREADS: tuple[int, str] | None = None  # (threads, why), decided by setup_env


def decide_threads(env=None, default: int | None = None, cores: int | None = None) -> tuple[int, str]:
    """(threads per process, why) from the environment this process was started with.

    `paddle.distributed.launch` imports Paddle itself, and `import paddle` sets `OMP_NUM_THREADS=1` in the
    launcher when it is unset; every worker inherits that 1, so "only when unset" left every launched CPU
    run on one thread. A worker of the launcher (its `PADDLE_TRAINER_ID` / `PADDLE_LOCAL_SIZE` are set) that
    sees exactly `OMP_NUM_THREADS=1` therefore treats it as the launcher's and takes its share of the cores:
    cores // processes on this node. Any other value is the user's and wins, and `PRETRAIN_CLI_THREADS`
    always wins (`scripts/launch.sh` copies a user's `OMP_NUM_THREADS` into it, so even 1 is kept there).
    """
    env = os.environ if env is None else env
    own = env.get(THREADS_VAR, "").strip()
    if own.isdigit() and int(own) >= 1:
        return int(own), f"{THREADS_VAR}={own}"
    local = env.get("PADDLE_LOCAL_SIZE", "").strip()
    launched = bool(env.get("PADDLE_TRAINER_ID", "").strip() or local)
    omp = env.get("OMP_NUM_THREADS", "").strip()
    if omp.isdigit() and int(omp) >= 1 and not (launched and omp == "1"):
        return int(omp), f"OMP_NUM_THREADS={omp}"
    procs = int(local) if local.isdigit() and int(local) >= 1 else 1
    if launched or default is None:
        n = max(1, (cores or _cores()) // procs)
        why = f"{cores or _cores()} cores / {procs} process{'es' if procs > 1 else ''} on this node"
        if launched and omp == "1":
            why += f"; the launcher's OMP_NUM_THREADS=1 replaced, {THREADS_VAR}=N chooses"
        return n, why
    return default, "the caller's default"


def _cores() -> int:
    return default_threads(1)


def threads() -> int:
    """The CPU threads this process computes with (`setup_env`'s decision)."""
    return (_THREADS if _THREADS is not None else decide_threads())[0]


def threads_line() -> str:
    """The log line naming the CPU threads this process computes with and why."""
    n, why = _THREADS if _THREADS is not None else decide_threads()
    return f"threads: {n} per process ({why})"


def setup_env(threads: int | None = None) -> None:
    """Set the CPU math environment and quiet Paddle's import noise, unless the user set them.

    `threads`: the caller's default when neither the user nor the launcher decides (`decide_threads`)."""
    global _DONE, _THREADS
    if _DONE:
        return
    user_mkl = "MKL_NUM_THREADS" in os.environ  # (the launcher sets only OMP_NUM_THREADS)
    _THREADS = decide_threads(default=threads)
    n = str(_THREADS[0])
    cpu_type = mkl_cpu_type()
    if cpu_type is not None:
        os.environ.setdefault("MKL_DEBUG_CPU_TYPE", cpu_type)
    os.environ["OMP_NUM_THREADS"] = n
    if not user_mkl:
        os.environ["MKL_NUM_THREADS"] = n
    keep_freed_memory()
    # glog INFO/WARNING lines and the "Modified FLAGS" banner say nothing a user can act on.
    os.environ.setdefault("GLOG_minloglevel", "2")
    os.environ.setdefault("GLOG_v", "0")
    warnings.filterwarnings("ignore", message=".*OMP_NUM_THREADS.*")
    # Paddle's C++-extension helper warns about a missing compiler cache when fleet utilities load.
    warnings.filterwarnings("ignore", message="No ccache found")
    # fleet on CPU: ranks outside a sub-group it builds, and NCCL's reduce_avg (a CPU build falls back by itself)
    warnings.filterwarnings("ignore", message="Current global rank .* is not in group")
    warnings.filterwarnings("ignore", message="nccl reduce_avg requires paddle compiled with cuda")
    _DONE = True


_FLAGS_BANNER = re.compile(r"=+ Modified FLAGS detected =+\n(?:FLAGS\(.*\)\n)*=+\n")


@contextlib.contextmanager
def without_flags_banner():
    """Drop the "Modified FLAGS detected" banner that Paddle's `init_parallel_env` / `fleet.init` print.

    It lists the flags that differ from their defaults, which in Paddle 3.3 is always the case
    (`import paddle` itself turns on FLAGS_enable_pir_in_executor): nothing a user can act on, printed by
    every rank into its workerlog. Everything else written to stderr meanwhile passes through.
    """
    buf = io.StringIO()
    try:
        with contextlib.redirect_stderr(buf):
            yield
    finally:
        rest = _FLAGS_BANNER.sub("", buf.getvalue())
        if rest:
            sys.stderr.write(rest)


def import_paddle():
    """Import Paddle after `setup_env()`; the only sanctioned way to get the module."""
    setup_env()
    first = "paddle" not in sys.modules
    # Paddle prints an OMP_NUM_THREADS advisory on stderr at import when threads > 1.
    buf = io.StringIO()
    # Paddle's import installs early a C++ handler that answers SIGTERM with `C++ Traceback ... FatalError:
    # Termination signal`, then runs for seconds more. A launcher stopping this rank after another rank's error
    # (rank 0's usage error, exit 2, found before this rank got here or while it waits in the rendezvous) left that
    # report in its log. So SIGTERM is held back during the import and then ends the process quietly, as by
    # default (the trainer installs its own graceful stop while it trains); one that came meanwhile does so as it is
    # released. Paddle's handlers of real crashes (SIGSEGV, SIGABRT, SIGILL) stay.
    # (Only the main thread can set a handler. What Python had set stays: an ignored SIGTERM stays ignored, and a
    # Python handler, the trainer's, is left alone.)
    if first:
        start_signals.hold_stop_signals()  # (a no-op under `train`'s own hold, from its first line)
    try:
        with start_signals.interrupt_kept(), contextlib.redirect_stderr(buf):
            import paddle  # noqa: F401
    except ImportError as e:  # a Ctrl-C during the import: Paddle raises an ImportError from the KeyboardInterrupt
        cause = e
        while cause is not None and not isinstance(cause, KeyboardInterrupt):
            cause = cause.__cause__ or cause.__context__
        if cause is not None:
            raise KeyboardInterrupt from None  # what the CLI answers with `error: interrupted`, 130
        raise
    finally:
        try:
            before = signal.getsignal(signal.SIGTERM)  # Python's view: Paddle's C++ handler is not in it
            main = threading.current_thread() is threading.main_thread()
            if main and before in (signal.SIG_DFL, signal.SIG_IGN, None):
                signal.signal(signal.SIGTERM, before or signal.SIG_DFL)
        finally:
            start_signals.release_stop_signals()  # SIGTERM's disposition is decided
    if first:
        # What the import made (modules, their functions and classes: ~0.5 M objects) lives as long as the process,
        # so the cyclic garbage collector is told to stop walking it: Paddle's to_static (SOT) runs a full
        # `gc.collect()` after translating each frame, ~90 for one model, each ~0.25 CPU-s over the import's objects.
        gc.freeze()
    paddle.base.core.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    # A native crash (SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT) first prints every thread's Python stack, then
    # Paddle's own report runs (faulthandler chains to the handler it replaces). Paddle's report alone can be
    # nothing: it is formatted on the heap, which the crash may have broken; faulthandler writes from its own buffer
    # and stack. Left alone when already on (pytest's own, writing where it chose). A crash after Python's own
    # finalization (native destructors at exit) reaches neither: `end_process` skips that teardown.
    if not faulthandler.is_enabled():
        faulthandler.enable(all_threads=True)
    return paddle


def process_group_up() -> bool:
    """Whether this process joined a distributed process group (Paddle imported and `init_parallel_env` done)."""
    dist = sys.modules.get("paddle.distributed")
    return dist is not None and dist.is_initialized()


def end_process(code: int) -> None:
    """End this process now with `code`, skipping the interpreter's and the native libraries' teardown.

    Why: a launched rank whose run had finished (its files written and closed, its last collective done, rank 0's
    final export seen) died at exit with SIGSEGV (exit -11) on gloo, its workerlog empty: the crash came after
    Python's own finalization, where not even faulthandler reports, in the native destructors of the process
    group's contexts and threads. The launcher then counts the whole run as failed (a dp2 x cp2 run of the test
    suite, once in a few hundred launches). Nothing the run needs is left at that point, so the teardown is
    skipped: log handlers and the standard streams are flushed, then `os._exit`.
    """
    import logging

    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed or broken pipe: nothing more to say on it
            pass
    os._exit(code)


# the words of a peer gone (gloo's socket, NCCL's `remote process exited or there was a network error`), a narrower
# test than COLLECTIVE_FAILURES for an errno-less OSError, which an NCCL setup failure of this rank or a socket's
# own timeout raises too (`cli`)
PEER_LOST = ("reset by peer", "closed by peer", "broken pipe", "gloo/transport/tcp", "remote process exited")
COLLECTIVE_FAILURES = ("gloo", "nccl", "timed out") + PEER_LOST[:3]


def collective_failure(e: Exception) -> bool:
    """Whether `e` is the collective library's error (gloo's or NCCL's: a peer gone, a timeout) rather than a bug of
    this rank: a lost rank on another host ends this one so, with nothing of this rank's own to say (`cli`), and
    to_static's compiled forward passes it on unchanged (`ops.compiled_forward`)."""
    text = f"{type(e).__name__} {e}".lower()
    return any(marker in text for marker in COLLECTIVE_FAILURES)
