"""The one place that chooses and imports attention/norm/RoPE/SwiGLU kernels.

Model code calls `kernels.attention(...)` etc. and never knows whether a fused op runs.
`select()` decides once: a fused or flash kernel asked for on a device that cannot run it
falls back to the reference path with ONE warning, instead of an ImportError mid-run
(PaddleNLP's `fused_ln`) or a SIGILL (Paddle's CPU `fused_rms_norm`, PADDLE_CPU.md §3).
Paddle's fused GPU ops are therefore never called on CPU; there the fused kernels are our own
(`cpu_ops`, csrc/), with Paddle's plain ops as the fallback.

Layouts: q `[bsz, seq_len, n_heads, head_dim]`, k/v `[bsz, seq_len, n_kv_heads, head_dim]`,
cos/sin `[seq_len, head_dim]` (HF rotate-half layout).
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Callable

from pretrain_cli.ops import cpu_ops
from pretrain_cli.ops.cpu_ops import (attention_cpu, cross_entropy_cpu, rms_norm_cpu, rope_cpu,
                                  swiglu_packed_cpu)

_MASKS: dict = {}  # (q_len, k_len, place) -> bool causal mask, reused across layers and steps


# ---------------------------------------------------------------- reference paths (any device)
def rms_norm_reference(x, weight, eps: float):
    """fp32 statistics regardless of the input dtype, then cast back (PaddleNLP/HF semantics)."""
    import paddle

    x32 = x.astype("float32")
    var = paddle.mean(paddle.square(x32), axis=-1, keepdim=True)  # [..., 1]
    return (x32 * paddle.rsqrt(var + eps)).astype(weight.dtype) * weight


_ROTATIONS: dict = {}  # (head_dim, dtype, place) -> [head_dim, head_dim] rotate-half matrix


def _rotation(head_dim: int, dtype, place):
    """R with `x @ R == concat([-x2, x1])` (HF rotate_half), exact: one ±1 per column.

    Folded into the per-position RoPE matrix (`rope_reference`), it replaces slice+neg+concat,
    whose backward (SliceGrad: a zero-filled full tensor per slice) was the single largest
    non-matmul cost of a CPU step (docs/PERFORMANCE.md).
    """
    import numpy as np
    import paddle

    key = (head_dim, str(dtype), str(place))
    if key not in _ROTATIONS:
        half = head_dim // 2
        r = np.zeros([head_dim, head_dim], dtype=np.float32)
        r[np.arange(half) + half, np.arange(half)] = -1.0  # out[:half] = -x[half:]
        r[np.arange(half), np.arange(half) + half] = 1.0  # out[half:] = x[:half]
        _ROTATIONS[key] = paddle.to_tensor(r, place=place).astype(dtype)
    return _ROTATIONS[key]


def _rope_one(x, mats):
    """`x[b, p] @ M[p]` for every position p: one batched GEMM over positions."""
    import paddle

    bsz, seq_len, heads, head_dim = x.shape
    xt = x.transpose([1, 0, 2, 3]).reshape([seq_len, bsz * heads, head_dim])  # [seq_len, bsz*heads, head_dim]
    out = paddle.matmul(xt, mats).reshape([seq_len, bsz, heads, head_dim])  # [seq_len, bsz, heads, head_dim]
    return out.transpose([1, 0, 2, 3])  # [bsz, seq_len, heads, head_dim]


_ROPE_MATS: dict = {}  # (id(cos), id(sin)) -> (cos, sin, M): M per cached cos/sin table pair


def _build_rope_mats(cos, sin):
    import paddle

    seq_len, head_dim = cos.shape
    rot = _rotation(head_dim, "float32", cos.place)
    cos32, sin32 = cos.astype("float32"), sin.astype("float32")
    return paddle.diag_embed(cos32) + rot.unsqueeze(0) * sin32.unsqueeze(1)  # [seq_len, head_dim, head_dim]


def _rope_mats(cos, sin):
    """M[p] for a cos/sin pair, built once per table and shared by every layer and step.

    `RotaryEmbedding` caches its (cos, sin) tensors per length, so the same objects come back each
    call; tables that need no gradient (all of them in this project) are keyed by identity (the
    entry keeps the tensors alive, so ids cannot be reused). Anything else is built per call.
    """
    if not (cos.stop_gradient and sin.stop_gradient):
        return _build_rope_mats(cos, sin)
    key = (id(cos), id(sin))
    hit = _ROPE_MATS.get(key)
    if hit is None or hit[0] is not cos or hit[1] is not sin:
        mats = _build_rope_mats(cos, sin)
        mats.stop_gradient = True
        hit = _ROPE_MATS[key] = (cos, sin, mats)
        if len(_ROPE_MATS) > 16:  # generation walks offsets: keep the cache small
            _ROPE_MATS.pop(next(iter(_ROPE_MATS)))
    return hit[2]


def rope_reference(q, k, cos, sin):
    """HF rotate-half RoPE in fp32 as one per-position GEMM: `x·cos + rotate_half(x)·sin = x @ M[p]`.

    M[p] = diag(cos_p) + R·diag(sin_p) (R = the rotate-half matrix) is built once per cos/sin table
    (`_rope_mats`) and shared by q, k, every layer and every step. Two broadcast multiplies, an add and slice/concat per tensor (and their
    backward, SliceGrad being the worst) become one small GEMM each way: ~2.5× faster on CPU,
    equal to the elementwise form to ~5e-7 (docs/PERFORMANCE.md).
    """
    mats = _rope_mats(cos, sin)  # [seq_len, head_dim, head_dim]
    q_out = _rope_one(q.astype("float32"), mats)
    k_out = _rope_one(k.astype("float32"), mats)
    return q_out.astype(q.dtype), k_out.astype(k.dtype)


def swiglu_reference(gate, up):
    import paddle.nn.functional as F

    return F.silu(gate) * up


def gate_up_packed(x, gate_w, up_w, gate_b=None, up_b=None):
    """`x @ [gate_w | up_w]` (+ biases) as one GEMM: `[..., 2·inter]` laid out [gate | up].

    The concat of two `[hidden, inter]` weights costs far less than a second GEMM's fixed overhead
    (docs/PERFORMANCE.md). A kernel, not model code, so a parallel layout can supply its own (each rank
    concatenates its own pieces).
    """
    import paddle

    w = paddle.concat([gate_w, up_w], axis=1)  # [hidden, 2*inter]
    out = paddle.matmul(x, w)  # [..., 2*inter]
    if gate_b is not None:
        out = out + paddle.concat([gate_b, up_b])  # [2*inter]
    return out


def swiglu_packed(gate_up):
    """silu(gate)·up from one `[..., 2·inter]` tensor laid out [gate | up] (one GEMM, one kernel).

    `paddle.incubate.nn.functional.swiglu` is a plain elementwise kernel that runs on CPU too
    (PADDLE_CPU §3); with the packed GEMM it cut the MLP fwd+bwd ~1.6× on CPU.
    """
    import paddle.nn.functional as F

    return F.swiglu(gate_up)


def repeat_kv(x, n_rep: int):
    """KV head j serves query heads j·n_rep … j·n_rep+n_rep−1 (HF `repeat_kv` order)."""
    if n_rep == 1:
        return x
    import paddle

    return paddle.repeat_interleave(x, n_rep, axis=2)  # [bsz, seq_len, n_kv_heads*n_rep, head_dim]


def attention_math(q, k, v):
    """Naive causal attention with an fp32 softmax: the ground truth the other paths are tested against."""
    import paddle
    import paddle.nn.functional as F

    bsz, seq_len, n_heads, head_dim = q.shape
    k_len = k.shape[1]
    n_rep = n_heads // k.shape[2]
    k, v = repeat_kv(k, n_rep), repeat_kv(v, n_rep)
    qt = q.transpose([0, 2, 1, 3])  # [bsz, n_heads, seq_len, head_dim]
    kt = k.transpose([0, 2, 1, 3])  # [bsz, n_heads, seq_len, head_dim]
    vt = v.transpose([0, 2, 1, 3])  # [bsz, n_heads, seq_len, head_dim]
    scores = paddle.matmul(qt, kt, transpose_y=True).astype("float32") / math.sqrt(head_dim)
    # bottom-right aligned: query i sits at position k_len − seq_len + i (a KV cache has k_len > seq_len)
    mask = paddle.triu(paddle.full([seq_len, k_len], float("-inf"), dtype="float32"), 1 + k_len - seq_len)
    probs = F.softmax(scores + mask, axis=-1).astype(q.dtype)  # [bsz, n_heads, seq_len, seq_len]
    out = paddle.matmul(probs, vt)  # [bsz, n_heads, seq_len, head_dim]
    return out.transpose([0, 2, 1, 3])  # [bsz, seq_len, n_heads, head_dim]


def _causal_bool_mask(q_len: int, k_len: int, place):
    """`[q_len, k_len]` bool, True = visible; query row i sits at position k_len − q_len + i.

    Built once per shape and reused across layers and steps (sdpa's CPU path rebuilds a float
    triangle on every call).
    """
    import paddle

    key = (q_len, k_len, str(place))
    if key not in _MASKS:
        rows = paddle.arange(q_len).reshape([q_len, 1]) + (k_len - q_len)  # [q_len, 1]
        _MASKS[key] = paddle.arange(k_len).reshape([1, k_len]) <= rows  # [q_len, k_len]
    return _MASKS[key]


_ADD_MASKS: dict = {}  # (q_len, k_len, dtype, place) -> additive causal mask (0 visible, −inf hidden)


def _causal_add_mask(q_len: int, k_len: int, dtype, place):
    """`[q_len, k_len]` float: 0 where `_causal_bool_mask` is True, −inf elsewhere; cached per shape."""
    import paddle

    key = (q_len, k_len, str(dtype), str(place))
    if key not in _ADD_MASKS:
        visible = _causal_bool_mask(q_len, k_len, place)
        m = paddle.where(visible, paddle.zeros([1], dtype=dtype), paddle.full([1], float("-inf"), dtype=dtype))
        m.stop_gradient = True
        _ADD_MASKS[key] = m
    return _ADD_MASKS[key]


def attention_sdpa_mask(q, k, v):
    """CPU default: the math of Paddle's CPU sdpa with a cached bool mask applied by `where`.

    On CPU `F.scaled_dot_product_attention` is Python matmul+softmax anyway; writing it out
    keeps the mask cached, lets `q_len < k_len` (a KV cache) align the mask bottom-right, skips
    the mask for one-token decode steps, and broadcasts GQA K/V instead of materialising
    `repeat_kv` (sdpa's expand + ExpandGrad: 1.5–6 % of a CPU step, depending on load).
    """
    import paddle
    import paddle.nn.functional as F

    bsz, q_len, n_heads, head_dim = q.shape
    k_len, n_kv = k.shape[1], k.shape[2]
    n_rep = n_heads // n_kv
    qt = (q * (1.0 / math.sqrt(head_dim))).transpose([0, 2, 1, 3])  # [bsz, n_heads, q_len, head_dim]
    kt = k.transpose([0, 2, 1, 3])  # [bsz, n_kv, k_len, head_dim]
    vt = v.transpose([0, 2, 1, 3])  # [bsz, n_kv, k_len, head_dim]
    # GQA by batch broadcasting: query heads [j·n_rep, (j+1)·n_rep) share KV head j; no K/V copy,
    # and the broadcast grad sums per head exactly as expand's grad does (bit-identical dK/dV).
    qt = qt.reshape([bsz, n_kv, n_rep, q_len, head_dim])  # [bsz, n_kv, n_rep, q_len, head_dim]
    kt = kt.unsqueeze(2)  # [bsz, n_kv, 1, k_len, head_dim]
    vt = vt.unsqueeze(2)  # [bsz, n_kv, 1, k_len, head_dim]
    scores = paddle.matmul(qt, kt, transpose_y=True)  # [bsz, n_kv, n_rep, q_len, k_len]
    if q_len > 1:
        # + 0 / + (−inf): same output, dK and dV as `where(mask, scores, −inf)` (dQ to ~1e-26), but a
        # broadcast add needs no expand of mask and fill (where's CPU path materialises both)
        scores = scores + _causal_add_mask(q_len, k_len, scores.dtype, q.place)
    probs = F.softmax(scores.astype("float32"), axis=-1).astype(q.dtype)
    out = paddle.matmul(probs, vt)  # [bsz, n_kv, n_rep, q_len, head_dim]
    out = out.reshape([bsz, n_heads, q_len, head_dim])  # [bsz, n_heads, q_len, head_dim]
    return out.transpose([0, 2, 1, 3])  # [bsz, q_len, n_heads, head_dim]


def attention_sdpa_causal(q, k, v):
    """GPU path: mask=None + is_causal lets Paddle dispatch to flash-attn-2 for fp16/bf16."""
    import paddle.nn.functional as F

    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


# ---------------------------------------------------------------- fused paths (GPU only)
def rms_norm_fused(x, weight, eps: float):  # pragma: no cover - GPU only
    from paddle.incubate.nn.functional import fused_rms_norm

    return fused_rms_norm(x, weight, None, eps, x.ndim - 1)[0]


def rope_fused(q, k, cos, sin):  # pragma: no cover - GPU only
    from paddle.incubate.nn.functional import fused_rotary_position_embedding

    seq_len, head_dim = cos.shape
    cos = cos.reshape([1, seq_len, 1, head_dim]).astype(q.dtype)  # [1, seq_len, 1, head_dim]
    sin = sin.reshape([1, seq_len, 1, head_dim]).astype(q.dtype)  # [1, seq_len, 1, head_dim]
    # use_neox_rotary_style=False is front-half/back-half pairing = HF rotate-half (REFERENCE §4.6)
    q_out, k_out, _ = fused_rotary_position_embedding(q, k, None, sin=sin, cos=cos,
                                                      use_neox_rotary_style=False)
    return q_out, k_out


def swiglu_fused(gate, up):  # pragma: no cover - GPU only
    from paddle.incubate.nn.functional import swiglu

    return swiglu(gate, up)


# ---------------------------------------------------------------- loss
def cross_entropy_reference(logits, labels, ignore_index: int):
    """Per-row loss `[N]` from logits `[N, V]`; 0 for rows whose label is `ignore_index`."""
    import paddle.nn.functional as F

    return F.cross_entropy(logits, labels, ignore_index=ignore_index, reduction="none").reshape([-1])  # [N]


# ---------------------------------------------------------------- selection
@dataclass(frozen=True)
class Kernels:
    """Resolved kernel per op; the names are what runs (for logs), the callables do the work."""

    attention_name: str = "sdpa_mask"
    rms_norm_name: str = "reference"
    rope_name: str = "reference"
    swiglu_name: str = "reference"
    attention: Callable = attention_sdpa_mask
    rms_norm: Callable = rms_norm_reference
    rope: Callable = rope_reference
    swiglu: Callable = swiglu_reference
    # MLP runs one GEMM on [gate | up] weights concatenated at forward time (names unchanged)
    pack_mlp: bool = True
    gate_up: Callable = gate_up_packed
    swiglu_packed: Callable = swiglu_packed
    # decode steps (q_len < k_len) need a bottom-right causal mask; sdpa's is_causal is top-left
    attention_cached: Callable = attention_sdpa_mask
    cross_entropy: Callable = cross_entropy_reference  # (logits [N, V], labels [N], ignore_index) -> [N]

    def describe(self) -> str:
        return (f"attention={self.attention_name} rms_norm={self.rms_norm_name} "
                f"rope={self.rope_name} swiglu={self.swiglu_name}{' (packed gate|up GEMM)' if self.pack_mlp else ''}")


_ATTN = {"math": attention_math, "sdpa_mask": attention_sdpa_mask, "sdpa_causal": attention_sdpa_causal,
         "cpu": attention_cpu}
_FUSED = {"rms_norm": rms_norm_fused, "rope": rope_fused, "swiglu": swiglu_fused}
_REF = {"rms_norm": rms_norm_reference, "rope": rope_reference, "swiglu": swiglu_reference}
# swiglu on two tensors has no CPU kernel: the packed MLP path (the default) uses `swiglu_packed_cpu`
_CPU = {"rms_norm": rms_norm_cpu, "rope": rope_cpu, "swiglu": swiglu_reference}


def _gpu_available(device: str) -> bool:
    if not str(device).lower().startswith(("gpu", "cuda")):
        return False
    import paddle

    return paddle.is_compiled_with_cuda()


@dataclass(frozen=True)
class Request:
    """What a run asks for (the fields of `config.run_config.KernelConfig`); the default is the fast path."""

    attention: str = "flash"  # "flash": never materialise the scores; "math": materialise them
    rms_norm: str = "reference"
    rope: str = "reference"
    swiglu: str = "reference"
    cpu_ops: bool = True


def select(request=None, device: str = "cpu") -> Kernels:
    """Map a request (a `KernelConfig` or `Request`) to what `device` can run; warn once listing every fallback.

    attention "flash": flash-attn through Paddle's SDPA on GPU, the fused block-causal kernel on CPU;
    attention "math": the `[b, heads, s, s]` scores materialised, on every device (`attention_sdpa_mask`).
    On CPU the fused kernels of `cpu_ops` serve every other op (and any `fused` request) when they build;
    `cpu_ops=False` (`cpu_fused_ops: false`) or a failed build leaves Paddle's own ops.
    """
    kc = request or Request()
    gpu = _gpu_available(device)
    if kc.attention not in ("flash", "math"):
        raise ValueError(f"unknown attention kernel {kc.attention!r}")
    for op in ("rms_norm", "rope", "swiglu"):
        if getattr(kc, op) not in ("fused", "reference"):
            raise ValueError(f"unknown {op} kernel {getattr(kc, op)!r}")
    fallbacks: list[str] = []
    cpu = not gpu and kc.cpu_ops and cpu_ops.load() is not None
    if not gpu and kc.cpu_ops and not cpu:
        fallbacks.append(f"fused CPU kernels unavailable ({cpu_ops.load_error()}) → Paddle's ops")
    if kc.attention == "math":
        attn = "sdpa_mask"
    elif gpu:
        attn = "sdpa_causal"
    else:
        attn = "cpu" if cpu else "sdpa_mask"
        if not cpu:
            fallbacks.append("memory-light attention → sdpa_mask, which holds the [b, heads, s, s] scores (on CPU "
                             "the block-causal kernel is one of the fused CPU kernels)")
    chosen = {}
    for op in ("rms_norm", "rope", "swiglu"):
        want = getattr(kc, op)
        if cpu:
            want = "cpu"
        elif want == "fused" and not gpu:
            fallbacks.append(f"fused {op} → reference (Paddle's fused GPU ops need a GPU build and a GPU)")
            want = "reference"
        chosen[op] = want
    if fallbacks:
        warnings.warn(
            f"kernels on {device!r}: {'; '.join(fallbacks)}. Results are identical; speed and memory differ",
            RuntimeWarning, stacklevel=2,
        )
    table = {"fused": _FUSED, "reference": _REF, "cpu": _CPU}
    return Kernels(
        attention_name=attn, rms_norm_name=chosen["rms_norm"], rope_name=chosen["rope"],
        swiglu_name=chosen["swiglu"], attention=_ATTN[attn],
        rms_norm=table[chosen["rms_norm"]]["rms_norm"], rope=table[chosen["rope"]]["rope"],
        swiglu=table[chosen["swiglu"]]["swiglu"],
        swiglu_packed=swiglu_packed_cpu if cpu else swiglu_packed,
        cross_entropy=cross_entropy_cpu if cpu else cross_entropy_reference,
        attention_cached=attention_cpu if cpu else attention_sdpa_mask,
    )


# ---------------------------------------------------------------- compiled forward
def compile_forward(model):
    """Opt-in `paddle.jit.to_static` (SOT) of the model's forward; same parameters, same losses.

    SOT traces Python bytecode and falls back to eager on what it cannot capture, so the
    model code needs no changes; on CPU the captured graph runs ~1.4× faster (PADDLE_CPU §9).
    Backward, clipping and the optimizer stay eager. Returns the same Layer object.
    """
    import paddle

    return paddle.jit.to_static(model, full_graph=False)
