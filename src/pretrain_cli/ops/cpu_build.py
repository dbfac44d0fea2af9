"""Builds and caches the fused CPU kernels of `csrc/` (`cpu_ops` loads them).

The library is compiled with g++ and OpenMP, linked against the Intel OpenMP runtime Paddle ships for MKL so GEMMs
and these kernels share one thread pool (two runtimes would spin against each other on a 2-core machine). It is
built once per (source, flags, Paddle, compiler, CPU) into the user cache, atomically and under a file lock so
data-parallel ranks starting together build it once; a failed build leaves a marker, so later processes do not
retry the same key.
"""
from __future__ import annotations

import hashlib
import logging
import os
import platform
import subprocess
import sysconfig
import time
from pathlib import Path

from pretrain_cli import atomic

CSRC = Path(__file__).with_name("csrc")
SOURCES = ("norm_mlp.cc", "rope.cc", "attention.cc", "loss.cc", "optim.cc", "linear.cc")
# -fno-math-errno: sqrt becomes one vector instruction (nothing reads errno; a negative still gives NaN)
CXXFLAGS = ["-O3", "-march=native", "-fno-math-errno", "-fopenmp", "-fPIC", "-std=c++17", "-w",
            "-D_GLIBCXX_USE_CXX11_ABI=1", "-DPADDLE_WITH_CUSTOM_KERNEL", "-DPADDLE_EXTENSION_NAME=pretrain_cli_cpu_ops"]


def headers() -> list[Path]:
    """The headers the sources include (common.h and the kernels' shared pieces): every one is part of the
    library's key and of the installed package."""
    return sorted(CSRC.glob("*.h"))


def cache_dir() -> Path:
    root = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(root) / "pretrain-cli"


def _cpu_signature() -> str:
    """-march=native code is only valid on the CPU it was built for: key the cache by its flags."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            lines = [ln for ln in f.read(65536).splitlines() if ln.startswith(("model name", "flags"))]
        return "\n".join(sorted(set(lines)))
    except OSError:
        return platform.processor()


def cxxflags(machine: str | None = None) -> list[str]:
    """CXXFLAGS plus what the target adds. GCC's tuning for Intel's AVX-512 cores keeps loops at 256-bit
    vectors unless told otherwise; on a Xeon VM that left attention's softmax at half width
    (docs/PERFORMANCE.md §3.10). x86 only: other targets do not know the flag, and without AVX-512 it
    changes nothing."""
    x86 = (machine or platform.machine()).lower() in ("x86_64", "amd64")
    return [*CXXFLAGS, "-mprefer-vector-width=512"] if x86 else list(CXXFLAGS)


def _compiler() -> str:
    return os.environ.get("CXX", "g++")


def _commands(paddle, out: Path, objs: list[Path]) -> tuple[list[list[str]], list[str]]:
    """One compile per source (run in parallel: each parses Paddle's headers, ~7 s), then the link."""
    root = Path(paddle.__file__).parent
    libs, base, inc = root / "libs", root / "base", root / "include"
    includes = [f"-I{inc}", f"-I{inc / 'third_party'}", f"-I{sysconfig.get_paths()['include']}"]
    compiles = [[_compiler(), *cxxflags(), "-c", *includes, str(CSRC / src), "-o", str(obj)]
                for src, obj in zip(SOURCES, objs)]
    link = [_compiler(), "-shared", "-fPIC", *map(str, objs), "-o", str(out),
            f"-L{libs}", f"-L{base}", f"-Wl,-rpath,{libs}", f"-Wl,-rpath,{base}",
            "-Wl,--no-as-needed", "-l:libpaddle.so", "-l:libiomp5.so", "-l:libmklml_intel.so", "-Wl,--as-needed"]
    return compiles, link


def _run_all(commands: list[list[str]], timeout: float = 600) -> None:
    procs = [subprocess.Popen(c, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for c in commands]
    try:
        errors = [p.communicate(timeout=timeout)[1] for p in procs]
    finally:
        for p in procs:  # a timeout or an interrupt: no compiler outlives the build
            if p.poll() is None:
                p.kill()
                p.wait()
    for p, err in zip(procs, errors):
        if p.returncode != 0:
            first = next((ln for ln in err.splitlines() if "error" in ln), err.strip()[:200])
            raise RuntimeError(f"compiler failed: {first}")


def library_path(paddle) -> Path:
    """Where the library for this source, Paddle build, compiler and CPU lives (built or not)."""
    try:
        cxx = subprocess.run([_compiler(), "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        cxx = ""
    h = hashlib.sha256()
    sources = [(CSRC / f).read_bytes() for f in SOURCES] + [hdr.read_bytes() for hdr in headers()]
    for part in (*sources, " ".join(cxxflags()).encode(), paddle.__version__.encode(),
                 str(Path(paddle.__file__).parent).encode(), cxx.encode(), _cpu_signature().encode()):
        h.update(part)
        h.update(b"\0")
    return cache_dir() / f"cpu_ops-{h.hexdigest()[:16]}.so"


def build(paddle, so: Path) -> None:
    """Compile and link the library at `so`, once across processes (a file lock), published atomically."""
    import fcntl

    so.parent.mkdir(parents=True, exist_ok=True)
    with open(so.parent / "cpu_ops.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # ranks starting together: one builds, the others wait
        if so.is_file():
            return
        for stale in so.parent.glob("cpu_ops-*.tmp*"):  # left by a build that was killed (we hold the lock)
            stale.unlink(missing_ok=True)
        log = logging.getLogger("pretrain_cli")
        log.info(f"building the fused CPU kernels once (~{build_seconds():.0f} s here: {BUILD_CORE_SECONDS:.0f} "
                 f"core-seconds of g++ over this machine's free cores): {so}")
        start = time.monotonic()
        tmp = so.with_suffix(f".tmp{os.getpid()}")
        objs = [so.with_suffix(f".{Path(src).stem}.tmp{os.getpid()}.o") for src in SOURCES]
        try:
            compiles, link = _commands(paddle, tmp, objs)
            _run_all(compiles)
            _run_all([link])
            atomic.publish_file(tmp, so)  # fsync first: never publish a library that is not on disk
            log.info(f"built the fused CPU kernels in {time.monotonic() - start:.0f} s")
        except RuntimeError as e:  # the compiler or linker refused: the same key would fail the same way
            failed_marker(so).write_text(str(e).splitlines()[0][:300])
            raise
        finally:
            for f in (tmp, *objs):
                f.unlink(missing_ok=True)


BUILD_CORE_SECONDS = 40.0  # the compiles' CPU time (20 s on 2 idle cores: README.md, docs/PERFORMANCE.md)


def build_seconds(cores: int | None = None, load: float | None = None) -> float:
    """The build's expected wall time: its compiles run in parallel (one per source), each core shared with the
    load already there; 20 s on 2 idle cores, 40 s at load average 2 (measured 41 s), ~3.5 min at 19."""
    cores = cores or os.cpu_count() or 1
    load = os.getloadavg()[0] if load is None else load
    jobs = min(cores, len(SOURCES))
    return BUILD_CORE_SECONDS / jobs * max(1.0, (load + jobs) / cores)


def failed_marker(so: Path) -> Path:
    """Marker of a failed build for exactly this key: later processes do not retry it (a new compiler,
    Paddle or source changes the key, so they would)."""
    return so.with_suffix(".failed")
