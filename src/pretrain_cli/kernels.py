"""The one place that chooses and imports attention/norm/RoPE/SwiGLU kernels.

Model code calls `kernels.attention(...)` etc. and never knows whether a fused op runs.
`select()` decides once: a fused or flash kernel asked for on a device that cannot run it
falls back to the reference path with ONE warning, instead of an ImportError mid-run
(PaddleNLP's `fused_ln`) or a SIGILL (Paddle's CPU `fused_rms_norm`, PADDLE_CPU.md §3).
Fused ops are therefore never called on CPU.

Layouts: q `[bsz, seq_len, n_heads, head_dim]`, k/v `[bsz, seq_len, n_kv_heads, head_dim]`,
cos/sin `[seq_len, head_dim]` (HF rotate-half layout).
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Callable

from pretrain_cli.config import KernelConfig

_MASKS: dict = {}  # (seq_len, place) -> bool causal mask, reused across layers and steps


# ---------------------------------------------------------------- reference paths (any device)
def rms_norm_reference(x, weight, eps: float):
    """fp32 statistics regardless of the input dtype, then cast back (PaddleNLP/HF semantics)."""
    import paddle

    x32 = x.astype("float32")
    var = paddle.mean(paddle.square(x32), axis=-1, keepdim=True)  # [..., 1]
    return (x32 * paddle.rsqrt(var + eps)).astype(weight.dtype) * weight


def _rotate_half(x):
    import paddle

    half = x.shape[-1] // 2
    return paddle.concat([-x[..., half:], x[..., :half]], axis=-1)


def rope_reference(q, k, cos, sin):
    """HF rotate-half RoPE; no permutation of q/k weights is ever needed."""
    seq_len, head_dim = cos.shape
    cos = cos.reshape([1, seq_len, 1, head_dim])  # [1, seq_len, 1, head_dim]
    sin = sin.reshape([1, seq_len, 1, head_dim])  # [1, seq_len, 1, head_dim]
    q32, k32 = q.astype("float32"), k.astype("float32")
    q_out = q32 * cos + _rotate_half(q32) * sin
    k_out = k32 * cos + _rotate_half(k32) * sin
    return q_out.astype(q.dtype), k_out.astype(k.dtype)


def swiglu_reference(gate, up):
    import paddle.nn.functional as F

    return F.silu(gate) * up


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
    n_rep = n_heads // k.shape[2]
    k, v = repeat_kv(k, n_rep), repeat_kv(v, n_rep)
    qt = q.transpose([0, 2, 1, 3])  # [bsz, n_heads, seq_len, head_dim]
    kt = k.transpose([0, 2, 1, 3])  # [bsz, n_heads, seq_len, head_dim]
    vt = v.transpose([0, 2, 1, 3])  # [bsz, n_heads, seq_len, head_dim]
    scores = paddle.matmul(qt, kt, transpose_y=True).astype("float32") / math.sqrt(head_dim)
    mask = paddle.triu(paddle.full([seq_len, seq_len], float("-inf"), dtype="float32"), 1)
    probs = F.softmax(scores + mask, axis=-1).astype(q.dtype)  # [bsz, n_heads, seq_len, seq_len]
    out = paddle.matmul(probs, vt)  # [bsz, n_heads, seq_len, head_dim]
    return out.transpose([0, 2, 1, 3])  # [bsz, seq_len, n_heads, head_dim]


def _causal_bool_mask(seq_len: int, place):
    import paddle

    key = (seq_len, str(place))
    if key not in _MASKS:
        _MASKS[key] = paddle.tril(paddle.ones([seq_len, seq_len], dtype="bool"))  # [seq_len, seq_len]
    return _MASKS[key]


def attention_sdpa_mask(q, k, v):
    """CPU default: sdpa with a cached boolean mask measured fastest on CPU (docs/MODELS.md).

    sdpa repeats GQA KV heads itself, so no repeat_interleave here.
    """
    import paddle.nn.functional as F

    mask = _causal_bool_mask(q.shape[1], q.place)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


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

    def describe(self) -> str:
        return (f"attention={self.attention_name} rms_norm={self.rms_norm_name} "
                f"rope={self.rope_name} swiglu={self.swiglu_name}")


_ATTN = {"math": attention_math, "sdpa_mask": attention_sdpa_mask, "sdpa_causal": attention_sdpa_causal}
_FUSED = {"rms_norm": rms_norm_fused, "rope": rope_fused, "swiglu": swiglu_fused}
_REF = {"rms_norm": rms_norm_reference, "rope": rope_reference, "swiglu": swiglu_reference}


def _gpu_available(device: str) -> bool:
    if not str(device).lower().startswith(("gpu", "cuda")):
        return False
    import paddle

    return paddle.is_compiled_with_cuda()


def select(kernel_cfg: KernelConfig | None = None, device: str = "cpu") -> Kernels:
    """Resolve the requested kernels for `device`; warn once listing every fallback."""
    kc = kernel_cfg or KernelConfig()
    gpu = _gpu_available(device)
    fallbacks = []
    if kc.attention not in ("flash", "sdpa", "math"):
        raise ValueError(f"unknown attention kernel {kc.attention!r}")
    if kc.attention == "math":
        attn = "math"
    elif gpu:
        attn = "sdpa_causal"
    else:
        attn = "sdpa_mask"
        if kc.attention == "flash":
            fallbacks.append("flash attention → sdpa")
    chosen = {"attention": attn}
    for op in ("rms_norm", "rope", "swiglu"):
        want = getattr(kc, op)
        if want not in ("fused", "reference"):
            raise ValueError(f"unknown {op} kernel {want!r}")
        if want == "fused" and not gpu:
            fallbacks.append(f"fused {op} → reference")
            want = "reference"
        chosen[op] = want
    if fallbacks:
        warnings.warn(
            f"kernels: {', '.join(fallbacks)} (fused/flash kernels need a GPU build of Paddle and a GPU; "
            f"device is {device!r}); results are identical, only speed differs",
            RuntimeWarning, stacklevel=2,
        )
    return Kernels(
        attention_name=attn, rms_norm_name=chosen["rms_norm"], rope_name=chosen["rope"],
        swiglu_name=chosen["swiglu"], attention=_ATTN[attn],
        rms_norm=(_FUSED if chosen["rms_norm"] == "fused" else _REF)["rms_norm"],
        rope=(_FUSED if chosen["rope"] == "fused" else _REF)["rope"],
        swiglu=(_FUSED if chosen["swiglu"] == "fused" else _REF)["swiglu"],
    )
