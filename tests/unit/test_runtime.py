"""runtime: big tensors must come from the heap, not a fresh mmap per allocation (keep_freed_memory), and
MKL is told the code path an AMD CPU can run (mkl_cpu_type).

mallopt is process-wide, so each malloc case runs in its own interpreter (no Paddle import: ~0.1 s each).
"""
import json
import os
import subprocess
import sys

import pytest

PROBE = r"""
import ctypes, json, sys
from pretrain_cli import runtime

class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]

libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
libc.mallinfo2.restype = MallInfo2
tuned = runtime.keep_freed_memory()
before = libc.mallinfo2()
p = libc.malloc(64 << 20)  # a 64 MiB activation-sized block
live = libc.mallinfo2()
libc.free(p)
after = libc.mallinfo2()
print(json.dumps({"tuned": tuned, "mmapped_live": live.hblkhd - before.hblkhd, "heap_free_after": after.fordblks}))
"""


def _probe(env_extra: dict) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PRETRAIN_CLI_MALLOC"} | env_extra
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def test_large_blocks_stay_in_the_heap():
    r = _probe({})
    assert r["tuned"] is True
    assert r["mmapped_live"] == 0  # served from the heap, not a fresh mmap
    assert r["heap_free_after"] >= 64 << 20  # and kept for the next step after free


def test_system_malloc_opt_out_keeps_glibc_defaults():
    r = _probe({"PRETRAIN_CLI_MALLOC": "system"})
    assert r["tuned"] is False
    assert r["mmapped_live"] >= 64 << 20  # glibc's default: one mmap per big block


@pytest.mark.filterwarnings("ignore:Currently not a parallel execution environment")
def test_flags_banner_is_dropped_and_everything_else_passes(capsys):
    from pretrain_cli import runtime

    runtime.import_paddle()
    import paddle.distributed as dist

    dist.init_parallel_env()  # one process: Paddle prints its banner, warns and returns
    assert "Modified FLAGS detected" in capsys.readouterr().err  # (what the wrapper is for)
    with runtime.without_flags_banner():
        dist.init_parallel_env()
        sys.stderr.write("a real problem\n")
    err = capsys.readouterr().err
    assert "Modified FLAGS" not in err and "FLAGS_enable_pir_in_executor" not in err and "a real problem\n" in err


def _cpuinfo(vendor: str, flags: str) -> str:
    return f"processor\t: 0\nvendor_id\t: {vendor}\nmodel name\t: test CPU\nflags\t\t: {flags}\n\nprocessor\t: 1\n"


ZEN4_FLAGS = "fpu sse sse2 avx avx2 fma avx512f avx512dq avx512ifma avx512cd avx512bw avx512vl avx512_bf16 avx512vbmi"


@pytest.mark.parametrize("vendor, flags, expected", [
    ("AuthenticAMD", ZEN4_FLAGS, "7"),  # AVX-512 AMD (Zen 4): MKL's AVX-512 kernels
    ("AuthenticAMD", "fpu sse sse2 avx avx2 fma", "5"),  # AVX2 AMD (Zen 2/3): the AVX2 kernels
    ("AuthenticAMD", "avx2 fma avx512f avx512dq avx512cd avx512vl", "5"),  # no avx512bw: type 7 would SIGILL
    ("GenuineIntel", ZEN4_FLAGS, None),  # Intel: MKL's own dispatch (forcing 5 halves an AVX-512 Xeon)
    ("GenuineIntel", "avx2 fma", None),
])
def test_mkl_cpu_type_follows_vendor_and_avx512(vendor, flags, expected):
    from pretrain_cli import runtime

    assert runtime.mkl_cpu_type(_cpuinfo(vendor, flags)) == expected


def test_a_users_mkl_cpu_type_is_kept():
    env = dict(os.environ, MKL_DEBUG_CPU_TYPE="4")
    code = "import os; from pretrain_cli import runtime; runtime.setup_env(); print(os.environ['MKL_DEBUG_CPU_TYPE'])"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "4"
