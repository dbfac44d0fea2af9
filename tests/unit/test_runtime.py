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


def test_threads_under_the_launcher_are_the_cores_share_not_its_inherited_one():
    from pretrain_cli.runtime import decide_threads

    launched = {"PADDLE_TRAINER_ID": "0", "PADDLE_LOCAL_SIZE": "2", "OMP_NUM_THREADS": "1"}  # what the workers see
    n, why = decide_threads(launched, cores=8)
    assert n == 4 and "8 cores / 2 processes" in why and "launcher's OMP_NUM_THREADS=1 replaced" in why
    assert decide_threads(launched | {"PADDLE_LOCAL_SIZE": "1"}, cores=8)[0] == 8  # launch.sh's one CPU process
    assert decide_threads(launched | {"PADDLE_LOCAL_SIZE": "16"}, cores=8)[0] == 1  # never 0
    # a value the launcher did not set is the user's and wins; PRETRAIN_CLI_THREADS always wins (launch.sh
    # copies the user's OMP_NUM_THREADS there, so even a deliberate 1 survives the launcher)
    assert decide_threads(launched | {"OMP_NUM_THREADS": "3"}, cores=8) == (3, "OMP_NUM_THREADS=3")
    assert decide_threads(launched | {"PRETRAIN_CLI_THREADS": "1"}, cores=8) == (1, "PRETRAIN_CLI_THREADS=1")
    # outside a launcher: the user's OMP_NUM_THREADS (1 included), else every core or the caller's default
    assert decide_threads({"OMP_NUM_THREADS": "1"}, cores=8)[0] == 1
    assert decide_threads({}, cores=8)[0] == 8 and decide_threads({}, default=5, cores=8)[0] == 5


def test_setup_env_applies_and_logs_the_launched_thread_count():
    code = ("import os; from pretrain_cli import runtime; runtime.setup_env(); "
            "print(os.environ['OMP_NUM_THREADS'], os.environ['MKL_NUM_THREADS']); print(runtime.threads_line())")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PADDLE_", "PRETRAIN_CLI_", "MKL_NUM", "OMP_"))}
    env.update(PADDLE_TRAINER_ID="0", PADDLE_LOCAL_SIZE="1", OMP_NUM_THREADS="1")  # launch.sh's one CPU process
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    cores = len(os.sched_getaffinity(0))
    values, line = out.stdout.splitlines()
    assert values == f"{cores} {cores}"
    assert line.startswith(f"threads: {cores} per process (") and "launcher's OMP_NUM_THREADS=1" in line


def test_fleets_cpu_warnings_are_filtered(monkeypatch):
    """fleet warns on CPU about ranks outside a sub-group and NCCL's reduce_avg; neither asks anything of a user."""
    import warnings

    from pretrain_cli import runtime

    monkeypatch.setattr(runtime, "_DONE", False)
    monkeypatch.setattr(runtime, "_THREADS", runtime._THREADS)
    monkeypatch.setattr(os, "environ", dict(os.environ))  # setup_env's variables stay in this test
    monkeypatch.setattr(runtime, "keep_freed_memory", lambda: None)
    with warnings.catch_warnings(record=True) as seen:
        runtime.setup_env()
        warnings.warn("Current global rank 1 is not in group _default_pg10", UserWarning)
        warnings.warn("nccl reduce_avg requires paddle compiled with cuda and nccl>=2.10.0, please check", UserWarning)
        warnings.warn("something else", UserWarning)
    assert [str(w.message) for w in seen] == ["something else"]


def test_a_native_crash_prints_the_python_stack_then_paddles_report(tmp_path):
    """`runtime.import_paddle` turns faulthandler on: a SIGSEGV prints where in Python it happened (written from
    faulthandler's own buffer, so it survives a broken heap, on which Paddle formats its report), then Paddle's own
    report still runs, and the process still dies of the signal (forked from a process that imported Paddle through
    it: tests/forkserver.py)."""
    import signal

    import forkserver

    code = ("import ctypes\nfrom pretrain_cli import runtime\nruntime.import_paddle()\n"
            "def read_address_zero():\n    ctypes.string_at(0)\nread_address_zero()\n")
    p = forkserver.run(["-c", code], cwd=tmp_path, timeout=120)
    assert p.returncode == -signal.SIGSEGV, p.stderr[-2000:]
    assert "Fatal Python error: Segmentation fault" in p.stderr and "in read_address_zero" in p.stderr, p.stderr
    assert "FatalError: `Segmentation fault` is detected" in p.stdout, p.stdout  # Paddle's report follows (on stdout)


def test_a_launched_rank_ends_with_its_code_its_logs_flushed_and_no_teardown(tmp_path):
    """`runtime.end_process` (what `cli.main` calls in a process that joined a process group): the exit code is
    the run's, a log file handler's buffered line and unterminated output reach their files, and nothing of the
    interpreter's teardown runs (an atexit hook stands for the native destructors that crashed a finished rank)."""
    import forkserver

    code = ("import atexit, logging, sys\nfrom pretrain_cli import runtime\n"
            "log = logging.getLogger('rank'); h = logging.FileHandler('rank.log'); log.addHandler(h)\n"
            "log.warning('last line')\n"
            "atexit.register(lambda: open('teardown-ran', 'w').close())\n"
            "assert not runtime.process_group_up()\n"
            "sys.stdout.write('no newline')\nruntime.end_process(3)\n")
    p = forkserver.run(["-c", code], cwd=tmp_path, timeout=120)
    assert p.returncode == 3, p.stderr[-2000:]
    assert p.stdout.endswith("no newline"), p.stdout
    assert (tmp_path / "rank.log").read_text() == "last line\n"
    assert not (tmp_path / "teardown-ran").exists()


def test_a_sigterm_during_paddles_import_ends_the_process_quietly(tmp_path):
    """A launcher stops a rank still importing Paddle (another rank's usage error came first): the rank dies of the
    SIGTERM with no `FatalError: Termination signal` report, though Paddle's import installs a handler that prints
    one. The signal is sent, as a launcher sends it, to the process, from a thread that waits for the import to be
    well past Paddle's core (a fresh interpreter: the import itself is what is tested)."""
    import signal

    code = ("import os, signal, sys, threading, time\nfrom pretrain_cli import runtime\n"
            "def stop_it():\n"
            "    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})  # delivered to the main thread\n"
            "    while 'paddle.nn' not in sys.modules:\n        time.sleep(0.001)\n"
            "    os.kill(os.getpid(), signal.SIGTERM)\n"
            "threading.Thread(target=stop_it, daemon=True).start()\n"
            "runtime.import_paddle()\ntime.sleep(30)\nprint('survived')\n")
    p = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert p.returncode == -signal.SIGTERM, p.stdout[-2000:] + p.stderr[-2000:]
    assert "FatalError" not in p.stdout + p.stderr and "survived" not in p.stdout, p.stdout[-2000:] + p.stderr[-2000:]


def test_a_later_import_keeps_the_sigterm_handler_python_set(tmp_path):
    """`runtime.import_paddle` again (Paddle imported already) leaves a Python SIGTERM handler (the trainer's
    graceful stop) and an ignored SIGTERM as they were (forked from a process that imported Paddle through it)."""
    import forkserver

    code = ("import signal\nfrom pretrain_cli import runtime\n"
            "def stop(*_):\n    pass\n"
            "signal.signal(signal.SIGTERM, stop)\nruntime.import_paddle()\n"
            "assert signal.getsignal(signal.SIGTERM) is stop\n"
            "signal.signal(signal.SIGTERM, signal.SIG_IGN)\nruntime.import_paddle()\n"
            "assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN\nprint('kept')\n")
    p = forkserver.run(["-c", code], cwd=tmp_path, timeout=120)
    assert p.returncode == 0 and "kept" in p.stdout, p.stderr[-2000:]
