"""Builds, caches and loads the fused CPU kernels in `csrc/`; the Python face of each op.

Paddle's CPU element-wise kernels are single-threaded and unfused (docs/PERFORMANCE.md), so the
CPU path compiles its own: g++ with OpenMP, linked against the Intel OpenMP runtime Paddle ships
for MKL so GEMMs and these kernels share one thread pool (two runtimes would spin against each
other on a 2-core machine). The library is built once per (source, flags, Paddle, compiler, CPU) into
the user cache, atomically and under a file lock so data-parallel ranks starting together build
it once. Any failure (no compiler, no headers, a non-Linux OS) means `load()` returns None and
`kernels.select` keeps the reference path, with one warning that says why. `cpu_fused_ops: false` (the one
switch) never loads them.
"""
from __future__ import annotations

import hashlib
import logging
import math
import os
import platform
import subprocess
import sys
import sysconfig
import time
import warnings
from pathlib import Path

from pretrain_cli import atomic

CSRC = Path(__file__).with_name("csrc")
# + the headers they include (common.h, causal_tiles.h): every *.h of csrc/ is part of the library's key
SOURCES = ("norm_mlp.cc", "rope.cc", "attention.cc", "loss.cc", "optim.cc", "linear.cc")
# -fno-math-errno: sqrt becomes one vector instruction (nothing reads errno; a negative still gives NaN)
CXXFLAGS = ["-O3", "-march=native", "-fno-math-errno", "-fopenmp", "-fPIC", "-std=c++17", "-w",
            "-D_GLIBCXX_USE_CXX11_ABI=1", "-DPADDLE_WITH_CUSTOM_KERNEL", "-DPADDLE_EXTENSION_NAME=pretrain_cli_cpu_ops"]
_STATE: dict = {}  # "ops": the loaded namespace, or "error": why not


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
    sources = [(CSRC / f).read_bytes() for f in SOURCES] + [h.read_bytes() for h in sorted(CSRC.glob("*.h"))]
    for part in (*sources, " ".join(cxxflags()).encode(), paddle.__version__.encode(),
                 str(Path(paddle.__file__).parent).encode(), cxx.encode(), _cpu_signature().encode()):
        h.update(part)
        h.update(b"\0")
    return cache_dir() / f"cpu_ops-{h.hexdigest()[:16]}.so"


def _build(paddle, so: Path) -> None:
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
            _failed(so).write_text(str(e).splitlines()[0][:300])
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


def _failed(so: Path) -> Path:
    """Marker of a failed build for exactly this key: later processes do not retry it (a new compiler,
    Paddle or source changes the key, so they would)."""
    return so.with_suffix(".failed")


class _Ops:
    """Thin wrappers; each returns what the matching reference function in kernels.py returns."""

    def __init__(self, run):
        self._run = run

    def rms_norm(self, x, weight, eps: float):
        return self._run("pcl_rms_norm", x, weight, float(eps))[0]

    def add_rms_norm(self, x, a, weight, eps: float):
        """(x + a, rms_norm(x + a)): one pass forward, one backward (the gradient accumulation included)."""
        h, y, _ = self._run("pcl_add_rms_norm", x, a, weight, float(eps))
        return h, y

    def swiglu_packed(self, gate_up):
        return self._run("pcl_swiglu", gate_up)[0]

    def mlp_in(self, x, gate_w, up_w):
        """silu(x·gate_w) · (x·up_w) `[..., inter]` (weights `[hidden, inter]`): one GEMM on [gate_w | up_w], packed
        inside the op, then SwiGLU; the backward's three products likewise."""
        return self._run("pcl_mlp_in", x, gate_w, up_w)[0]

    def rope_heads_first(self, x, cos, sin, position_ids=None):
        """x `[bsz, seq_len, heads, head_dim]` -> rotated `[bsz, heads, seq_len, head_dim]`; token (b, p) uses
        table row p, or row `position_ids[b, p]` (int64) when given."""
        if position_ids is None:
            return self._run("pcl_rope", x, cos, sin)[0]
        return self._run("pcl_rope_pos", x, cos, sin, position_ids)[0]

    def attn_in(self, x, wq, wk, wv, cos, sin, pos, head_dim: int):
        """(rope(x·wq) `[B, H, S, D]`, rope(x·wk) `[B, G, S, D]`, x·wv `[B, S, G, D]`) from x `[B, S, hidden]`;
        `pos` int64 `[B, S]` table rows, or an empty int64 tensor for rows 0 … S-1."""
        return self._run("pcl_attn_in", x, wq, wk, wv, cos, sin, pos, int(head_dim))

    def embedding(self, ids, w):
        """`w[ids]`: int64 ids `[...]`, w `[vocab, hidden]` -> `[..., hidden]`."""
        return self._run("pcl_embedding", ids, w)[0]

    def linear_residual(self, a, w, r):
        """`r + a·w` (`w` `[in, out]`, `r` the product's shape)."""
        return self._run("pcl_linear_residual", a, w, r)[0]

    def causal_attention(self, q, k, v, scale: float):
        """q `[B, H, S, D]`, k `[B, G, SK, D]`, v `[B, SK, G, D]` -> out `[B, S, H, D]` (block-causal GEMMs, GQA
        by index; v and out token-major, as the projections lay them out)."""
        return self._run("pcl_causal_attention", q, k, v, float(scale))[0]

    def document_attention(self, q, k, v, doc_start, scale: float):
        """As `causal_attention` (S == SK), query i seeing only keys `doc_start[b, i]` … i (int64 `[B, S]`)."""
        return self._run("pcl_document_attention", q, k, v, doc_start, float(scale))[0]

    def cross_entropy(self, logits, labels, ignore_index: int):
        """Per-row loss `[N]` (0 for ignored rows) from logits `[N, V]` and int64 labels `[N]`."""
        return self._run("pcl_cross_entropy", logits, labels, int(ignore_index))[0]

    def global_sq_norm(self, tensors):
        """Σ of squares over every (fp32, contiguous) tensor of the list: `[1]` fp32."""
        return self._run("pcl_global_sq_norm", list(tensors))[0]

    def adamw(self, params, grads, moment1, moment2, beta1_pow, beta2_pow, decay, lr, beta1, beta2, epsilon, coeff,
              grad_scale):
        """In-place AdamW over all parameters (lists, one entry per parameter; `decay` 0/1 per parameter)."""
        self._run("pcl_adamw", list(params), list(grads), list(moment1), list(moment2), list(beta1_pow),
                  list(beta2_pow), [int(d) for d in decay], float(lr), float(beta1), float(beta2), float(epsilon),
                  float(coeff), float(grad_scale))

    def linear_cross_entropy(self, h, w, labels, ignore_index: int, vocab_major: bool, chunk: int):
        """Loss sum `[1]` of `h [N, D] · w` + cross-entropy (`w` `[D, V]`, or `[V, D]` when `vocab_major`),
        `chunk` rows of logits at a time (ops/linear_loss.py)."""
        return self._run("pcl_linear_cross_entropy", h, w, labels, int(ignore_index), bool(vocab_major),
                         int(chunk))[0]

    def linear_cross_entropy_grad(self, h, w, labels, ignore_index: int, vocab_major: bool, chunk: int):
        """(loss sum `[1]`, d(sum)/dh, d(sum)/dw) in the same pass over the chunks."""
        return self._run("pcl_linear_cross_entropy_grad", h, w, labels, int(ignore_index), bool(vocab_major),
                         int(chunk))

    def scale_by_(self, x, g):
        """`x *= g[0]` in place (fp32, contiguous, threaded); returns x."""
        self._run("pcl_scale_by_", x, g)
        return x


def load():
    """The fused CPU ops, or None (reason in `load_error()`); built on first use, then cached."""
    if "ops" in _STATE or "error" in _STATE:
        return _STATE.get("ops")
    if not sys.platform.startswith("linux"):
        _STATE["error"] = f"fused CPU ops are built on Linux only (this is {sys.platform})"
        return None
    import paddle
    from paddle import _C_ops

    try:
        so = library_path(paddle)
        if _failed(so).is_file():
            raise RuntimeError(f"{_failed(so).read_text().strip()} (cached in {_failed(so)}; delete it to retry)")
        if not so.is_file():
            _build(paddle, so)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            paddle.utils.cpp_extension.load_op_meta_info_and_register_op(str(so))
    except Exception as e:  # noqa: BLE001 - any build/load problem means: use the reference kernels
        _STATE["error"] = f"{type(e).__name__}: {e}".splitlines()[0][:300]
        return None
    _STATE["ops"] = _Ops(_C_ops._run_custom_op)
    return _STATE["ops"]


def load_error() -> str | None:
    return _STATE.get("error")


# ------------------------------------------------------------------ kernels.py's CPU entries
# Selected by `kernels.select` only after `load()` succeeded; layouts as in kernels.py.
def cross_entropy_cpu(logits, labels, ignore_index: int):
    """One threaded pass for max/log-sum-exp, one for the gradient; no [N, V] softmax kept (3.4x)."""
    return load().cross_entropy(logits, labels, ignore_index)


def global_sq_norm_cpu(grads):
    """Σ‖g‖² over all gradients as a 0-D fp32 tensor: one threaded pass, double partial sums per fixed chunk
    added in order (the same bits on any thread count)."""
    return load().global_sq_norm(grads).reshape([])


def adamw_cpu(params, grads, moment1, moment2, beta1_pow, beta2_pow, decay, lr, beta1, beta2, epsilon, coeff,
              grad_scale=1.0):
    """Paddle's AdamW update (`adamw_`/`adam_` arithmetic, bit for bit on this CPU's code path) over every
    parameter in one threaded pass, the clipping coefficient `grad_scale` folded into the gradient read.
    Parameters go in detached (the same storage): Paddle refuses in-place custom ops on trainable leaves."""
    load().adamw([p.detach() for p in params], grads, moment1, moment2, beta1_pow, beta2_pow, decay, lr, beta1,
                 beta2, epsilon, coeff, grad_scale)


def rms_norm_cpu(x, weight, eps: float):
    return load().rms_norm(x, weight, eps)


def add_rms_norm_cpu(x, a, weight, eps: float):
    """The decoder layer's `h = x + attn` and the post-attention norm of h in one threaded pass; the backward
    adds the residual's gradient to the norm's in the same pass (no separate add or gradient accumulation)."""
    return load().add_rms_norm(x, a, weight, eps)


def swiglu_packed_cpu(gate_up):
    return load().swiglu_packed(gate_up)


def mlp_in_cpu(x, gate_w, up_w):
    """The MLP up to its down projection as one op: Paddle's weight concat, matmul and SwiGLU (and in the backward
    their three gradients and the concat's split) become one forward and one backward call, and the packed
    `[hidden, 2·inter]` weight is never a tensor the autograd graph keeps."""
    return load().mlp_in(x, gate_w, up_w)


def embedding_cpu(ids, w):
    """The token embedding's lookup, its gradient zeroed and accumulated on every thread (Paddle's runs on one)."""
    return load().embedding(ids, w)


def linear_residual_cpu(a, w, r):
    """`r + a·w` as one op: the GEMM accumulates onto a copy of the residual and the backward copies the residual's
    gradient on every thread (Paddle's add and add_grad run on one)."""
    return load().linear_residual(a, w, r)


def rope_cpu(q, k, cos, sin, position_ids=None):
    """The kernel writes head-major `[bsz, heads, seq_len, head_dim]` (what attention's GEMMs read);
    the returned `[bsz, seq_len, heads, head_dim]` are views of it, so `attention_cpu`'s transpose back
    is free and the rotation, transpose and copy are one pass. `position_ids` `[bsz, seq_len]` picks each
    token's row of the cos/sin table (packed documents restart at 0) in the same pass."""
    ops = load()
    q_out = ops.rope_heads_first(q, cos, sin, position_ids).transpose([0, 2, 1, 3])  # [bsz, seq_len, n_heads, head_dim]
    k_out = ops.rope_heads_first(k, cos, sin, position_ids).transpose([0, 2, 1, 3])  # [bsz, seq_len, n_kv, head_dim]
    return q_out, k_out


_NO_POSITIONS: dict = {}  # the empty int64 tensor `attn_in` reads as "no position ids", made once


def attn_in_cpu(x, wq, wk, wv, cos, sin, position_ids=None):
    """The attention's q/k/v projections and RoPE as one op: Paddle's three matmuls, three reshapes and two RoPE
    ops (and in the backward their gradients and the sum of x's three) become one forward and one backward call.
    Returns what `rope_cpu` and the v projection give: q, k `[bsz, seq_len, heads, head_dim]` as views of the
    head-major buffers attention reads, v `[bsz, seq_len, n_kv, head_dim]`."""
    import paddle

    if position_ids is None:
        if "pos" not in _NO_POSITIONS:
            _NO_POSITIONS["pos"] = paddle.zeros([0], dtype="int64")
        position_ids = _NO_POSITIONS["pos"]
    q, k, v = load().attn_in(x, wq, wk, wv, cos, sin, position_ids, cos.shape[-1])
    return q.transpose([0, 2, 1, 3]), k.transpose([0, 2, 1, 3]), v  # [bsz, seq_len, heads, head_dim] views


ATTENTION_BLOCK = 64  # attention.cc's kBlock: the query rows of one block


def attention_probs_per_head(q_len: int, k_len: int) -> int:
    """The fp32 probabilities the attention kernel keeps per (sample, head) for its backward: attention.cc's
    `probs_per_head`, Σᵢ min(k_len, k_len − q_len + i + 64), each query block's `[rows, keys it multiplies]` one
    after another; a bound over causal and document blockings, ~q_len²/2 + 64·q_len when q_len == k_len (the
    planner's memory model reads it; a test checks it against the kernel's). In closed form: the rows
    i >= q_len − 64 see every key, the others k_len − q_len + 64 + i."""
    b = ATTENTION_BLOCK
    if q_len <= b:
        return q_len * k_len
    short = q_len - b  # the rows whose bound is below k_len
    return short * (k_len - q_len + b) + short * (short - 1) // 2 + b * k_len


def attention_cpu(q, k, v):
    """Causal GQA attention in one kernel pair: block-causal GEMMs (the masked upper triangle is never
    multiplied), scale + mask + softmax fused, K/V shared by index (no repeat); bottom-right aligned,
    so it serves KV-cache decoding too. 1.4x the stacked-GEMM form at 4 x 512 (docs/PERFORMANCE.md)."""
    ops = load()
    head_dim = q.shape[-1]
    # q, k from `rope_cpu` are views of head-major buffers: these transposes give them back for free
    qt = q.transpose([0, 2, 1, 3])  # [bsz, n_heads, q_len, head_dim]
    kt = k.transpose([0, 2, 1, 3])  # [bsz, n_kv, k_len, head_dim]
    scale = 1.0 / math.sqrt(head_dim) if head_dim > 0 else 0.0  # 0: the kernel reports the empty head_dim
    # v `[bsz, k_len, n_kv, head_dim]` is read as the projection wrote it; out comes back token-major, contiguous
    return ops.causal_attention(qt, kt, v, scale)  # [bsz, q_len, n_heads, head_dim]: the caller's merge is a view


def attention_cpu_document(q, k, v, doc_start):
    """`attention_cpu` for packed samples: query i sees keys `doc_start[b, i]` … i only (int64 `[bsz, seq_len]`,
    the first position of its document). Row blocks are cut at document starts and their GEMMs begin at the
    document's first key, so every block before it is skipped, forward and backward: faster than causal on
    short documents; the fp32 probabilities kept for backward are the same size."""
    ops = load()
    head_dim = q.shape[-1]
    qt = q.transpose([0, 2, 1, 3])  # [bsz, n_heads, seq_len, head_dim]
    kt = k.transpose([0, 2, 1, 3])  # [bsz, n_kv, seq_len, head_dim]
    scale = 1.0 / math.sqrt(head_dim) if head_dim > 0 else 0.0
    return ops.document_attention(qt, kt, v, doc_start, scale)  # [bsz, seq_len, n_heads, head_dim]
