"""The one place that chooses and imports attention/norm/RoPE/SwiGLU kernels.

Model code calls `kernels.attention(...)` etc. and never knows whether a fused op runs.
`select()` decides once: a fused or flash kernel asked for on a device that cannot run it
falls back to the reference path with ONE warning, instead of an ImportError mid-run
(PaddleNLP's `fused_ln`) or a SIGILL (Paddle's CPU `fused_rms_norm`; ARCHITECTURE.md facts: fused ops).
Paddle's fused GPU ops are therefore never called on CPU; there the fused kernels are our own
(`cpu_ops`, csrc/), with Paddle's plain ops as the fallback.

Layouts: q `[bsz, seq_len, n_heads, head_dim]`, k/v `[bsz, seq_len, n_kv_heads, head_dim]`,
cos/sin `[seq_len, head_dim]` (HF rotate-half layout). Packed documents (`attention_mask_type: document`)
add `position_ids` (int64 `[bsz, seq_len]`: each token's row of the cos/sin table) to `rope` and
`doc_start` (int64 `[bsz, seq_len]`: the first position of each token's document) to `attention_document`;
the attention paths on Paddle's ops live in `ops.attention`, the other paths on Paddle's ops in `ops.reference`,
the GPU attention paths (flash-attn, flashmask, the flash blocks) and their head-width fallbacks in `ops.gpu_attention`.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Callable

from pretrain_cli.ops import cpu_ops
from pretrain_cli.ops.block_attention import block_forward
from pretrain_cli.ops.gpu_attention import attention_flashmask, attention_sdpa_causal, block_forward_flash
from pretrain_cli.ops.grouped import grouped_mlp_cpu, grouped_mlp_gpu
from pretrain_cli.ops.attention import attention_math, attention_sdpa_mask
from pretrain_cli.ops.cpu_ops import (adamw_cpu, add_rms_norm_cpu, attention_cpu, attention_cpu_document, attn_in_cpu,
                                      cross_entropy_cpu, embedding_cpu, global_sq_norm_cpu, linear_add_rms_norm_cpu,
                                      linear_residual_cpu, mlp_in_cpu, rms_norm_cpu, rope_cpu, swiglu_packed_cpu)
from pretrain_cli.ops.linear_loss import linear_cross_entropy_chunked, linear_cross_entropy_cpu
from pretrain_cli.ops.reference import (cross_entropy_reference, embedding_reference, gate_up_packed,
                                        global_sq_norm_reference, rms_norm_reference, swiglu_packed, swiglu_reference,
                                        whole_weight)
from pretrain_cli.ops.rope import rope_reference
from pretrain_cli.run_config import ATTENTION_PATHS, KernelConfig


# ---------------------------------------------------------------- fused paths (GPU only; CI runs them on CPU behind
# reference ops written from Paddle's documentation: tests/parity/test_gpu_branch.py)
def rms_norm_fused(x, weight, eps: float):  # pragma: no cover - GPU only
    from paddle.incubate.nn.functional import fused_rms_norm

    return fused_rms_norm(x, weight, None, eps, x.ndim - 1)[0]


def rope_fused(q, k, cos, sin, position_ids=None):  # pragma: no cover - GPU only
    from paddle.incubate.nn.functional import fused_rotary_position_embedding

    seq_len, head_dim = cos.shape
    cos = cos.reshape([1, seq_len, 1, head_dim]).astype(q.dtype)  # [1, seq_len, 1, head_dim]
    sin = sin.reshape([1, seq_len, 1, head_dim]).astype(q.dtype)  # [1, seq_len, 1, head_dim]
    # use_neox_rotary_style=False is front-half/back-half pairing = HF rotate-half
    # (ARCHITECTURE.md facts: fused RoPE layout); position_ids [bsz, seq_len] picks each token's table row (packed
    # documents restart at 0)
    q_out, k_out, _ = fused_rotary_position_embedding(q, k, None, sin=sin, cos=cos, position_ids=position_ids,
                                                      use_neox_rotary_style=False)
    return q_out, k_out


def swiglu_fused(gate, up):  # pragma: no cover - GPU only
    from paddle.incubate.nn.functional import swiglu

    return swiglu(gate, up)


@dataclass(frozen=True)
class StepKernels:
    """`adamw` None: Paddle's AdamW (a kernel per parameter); else `cpu_ops.adamw_cpu` (clipping folded in)."""

    name: str = "paddle"
    global_sq_norm: Callable = global_sq_norm_reference
    adamw: Callable | None = None


def select_step(request=None, device: str = "cpu") -> StepKernels:
    """`optimizer: fused` (`config.resolve`: CPU, fp32, whole parameters on every rank) → the multi-tensor CPU
    step if the fused CPU kernels built, else Paddle's with one warning; the GPU keeps Paddle's optimizer."""
    kc = request or KernelConfig()
    if kc.optimizer != "fused" or _gpu_available(device) or not kc.cpu_ops:
        return StepKernels()
    if cpu_ops.load() is None:
        warnings.warn(f"optimizer on {device!r}: the fused AdamW step needs the fused CPU kernels "
                      f"({cpu_ops.load_error()}) → Paddle's AdamW; results are identical", RuntimeWarning, stacklevel=2)
        return StepKernels()
    return StepKernels("fused_cpu", global_sq_norm_cpu, adamw_cpu)


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
    # (x, a, weight, eps) -> (x + a, rms_norm(x + a)): the residual add fused into the norm after it (CPU);
    # None: the add, then `rms_norm` (Paddle's add, and on GPU the fused norm; distributed tensors add as they are)
    add_rms_norm: Callable | None = None
    rope: Callable = rope_reference
    swiglu: Callable = swiglu_reference
    # MLP runs one GEMM on [gate | up] weights concatenated at forward time (names unchanged)
    pack_mlp: bool = True
    gate_up: Callable = gate_up_packed
    swiglu_packed: Callable = swiglu_packed
    # (x, gate_w, up_w) -> swiglu(x @ [gate_w | up_w]) as one op (CPU, no biases); None: `gate_up`, then
    # `swiglu_packed` (GPU, and distributed tensors, whose layouts supply their own `gate_up`)
    mlp_in: Callable | None = None
    # (x, wq, wk, wv, cos, sin, position_ids) -> the roped q, k and v as `rope` and the projections give them, as one
    # op (CPU, no biases, no qk_norm); None: the three Linears, then `rope` (GPU, distributed tensors)
    attn_in: Callable | None = None
    # (a, w, r) -> r + a·w: the dense MLP's down projection and the layer's residual add as one op (CPU, no bias);
    # None: the Linear, then Paddle's add (GPU, distributed tensors, and `tp`, whose row-parallel down projection
    # sums its output over the group before the add)
    linear_residual: Callable | None = None
    # (a, w, x, norm_weight, eps) -> (x + a·w, rms_norm(x + a·w)): the attention's output projection, the layer's
    # first residual add and the post-attention norm as one op (CPU, no bias); None wherever `linear_residual` is
    # (`tp`'s row-parallel o_proj sums its output over the group before the add; distributed tensors) and under
    # `full_attn` recompute (`KernelConfig.fuse_o_proj`: o_proj stays inside the recomputed attention)
    linear_add_rms_norm: Callable | None = None
    # decode steps (q_len < k_len) need a bottom-right causal mask; sdpa's is_causal is top-left
    attention_cached: Callable = attention_sdpa_mask
    cross_entropy: Callable = cross_entropy_reference  # (logits [N, V], labels [N], ignore_index) -> [N]
    # packed samples under `attention_mask_type: document`: (q, k, v, doc_start) -> out
    attention_document_name: str = "sdpa_mask"
    attention_document: Callable = attention_sdpa_mask
    # the LM head + loss without [tokens, vocab] logits (ops.linear_loss); None: logits + `cross_entropy`
    linear_cross_entropy_name: str = "off"
    linear_cross_entropy: Callable | None = None  # (h [N, hidden], weight, labels [N], ignore_index, vocab_major)
    # one query block against one key block with its log-sum-exp (context parallelism, `ops.block_attention`):
    # flash attention's on GPU, Paddle's ops elsewhere; (q, k, v, visible, causal) -> (out, lse)
    attention_block_name: str = "reference"
    attention_block: Callable = block_forward
    # a weight read whole by the embedding lookup and the tied head's matmul (ZeRO-3 keeps it in pieces)
    whole_weight: Callable = whole_weight
    # (ids, weight) -> weight[ids]: the token embedding (CPU: its gradient on every thread; distributed tensors:
    # Paddle's lookup)
    embedding: Callable = embedding_reference
    # a MoE layer's experts over rows sorted by expert (`ops.grouped`): (x, counts, weights, swiglu_packed) -> out
    grouped_mlp_name: str = "cpu_grouped"
    grouped_mlp: Callable = grouped_mlp_cpu
    # a call that passes `position_ids` sees this share of a sequence rope_span x as long (context parallelism's
    # chunks: its positions run over the whole sequence), so the RoPE table covers that many positions
    rope_span: int = 1
    # a MoE block's dispatch, (x, routing, experts, num_experts, capacity_factor) -> (out, counts, dropped); None:
    # `models.moe.dispatch_local` (one device). The layout steps that move or split experts choose theirs here
    # (`distributed.steps.order.build_kernels`), before the model exists
    moe_dispatch: Callable | None = None
    # the expert counts `[experts]` of this rank's tokens -> the data ranks' sum (the global balance scope, the
    # balancing bias); None: this process's tokens are the whole batch
    reduce_counts: Callable | None = None
    # the ranks holding other tokens of this rank's sequences (context parallelism's `context_sums.SequenceSums`:
    # `ranks`, `sum` with its gradient, `counts` without): the router losses' sums over a sequence's or a
    # micro-batch's tokens are taken over them, and so are the multi-token prediction losses' (`models.mtp`);
    # None: this process holds whole sequences
    sequence_sums: object | None = None
    # (t [bsz, len], fill) -> each position's next value, `fill` past the sequence's end: what multi-token prediction
    # reads (`models.mtp`); context parallelism's crosses its chunks (`steps.context_shift.NextTokens`); None: this
    # process holds whole sequences (`models.mtp.shift_left`)
    next_tokens: Callable | None = None

    def describe(self) -> str:
        return (f"attention={self.attention_name} (documents: {self.attention_document_name}) "
                f"rms_norm={self.rms_norm_name} rope={self.rope_name}{self._attn_in_note()} "
                f"swiglu={self.swiglu_name}{self._mlp_note()} "
                f"head+loss={self.linear_cross_entropy_name}")

    def _attn_in_note(self) -> str:
        notes = ["q|k|v GEMMs + RoPE as one op"] if self.attn_in is not None else []
        if self.linear_add_rms_norm is not None:
            notes.append("o GEMM + residual add + norm as one op")
        return f" ({'; '.join(notes)})" if notes else ""

    def _mlp_note(self) -> str:
        if self.mlp_in is not None:
            down = "; down GEMM + residual add as one op" if self.linear_residual is not None else ""
            return f" (gate|up GEMM + SwiGLU as one op{down})"
        return " (packed gate|up GEMM)" if self.pack_mlp else ""


_ATTN = {"math": attention_math, "sdpa_mask": attention_sdpa_mask, "sdpa_causal": attention_sdpa_causal,
         "cpu": attention_cpu}
# the document-masked path that goes with each causal one
_DOC_ATTN = {"sdpa_mask": ("sdpa_mask", attention_sdpa_mask), "sdpa_causal": ("flashmask", attention_flashmask),
             "cpu": ("cpu_document", attention_cpu_document)}
_FUSED = {"rms_norm": rms_norm_fused, "rope": rope_fused, "swiglu": swiglu_fused}
_REF = {"rms_norm": rms_norm_reference, "rope": rope_reference, "swiglu": swiglu_reference}
# swiglu on two tensors has no CPU kernel: the packed MLP path (the default) uses `swiglu_packed_cpu`
_CPU = {"rms_norm": rms_norm_cpu, "rope": rope_cpu, "swiglu": swiglu_reference}


def _gpu_available(device: str) -> bool:
    if not str(device).lower().startswith(("gpu", "cuda")):
        return False
    import paddle

    return paddle.is_compiled_with_cuda()


def select(request: KernelConfig | None = None, device: str = "cpu") -> Kernels:
    """Map a `KernelConfig` (`RunConfig.kernels`) to what `device` can run; warn once listing every fallback.

    attention "flash": flash-attn through Paddle's SDPA on GPU, the fused block-causal kernel on CPU;
    attention "math": the `[b, heads, s, s]` scores materialised, on every device (`attention_sdpa_mask`).
    Each has a document-masked partner (`attention_document`): flashmask on GPU, the same CPU kernel skipping
    every block before a document's start, and `attention_sdpa_mask` with a per-sample mask.
    On CPU the fused kernels of `cpu_ops` serve every other op (and any `fused` request) when they build;
    `cpu_ops=False` (`cpu_fused_ops: false`) or a failed build leaves Paddle's own ops.
    `fused_loss` (`use_fused_linear_cross_entropy`): the chunked LM head + loss, the C++ kernel on CPU and
    Paddle's ops elsewhere (also on CPU without the kernels: the memory saving does not depend on them).
    """
    kc = request or KernelConfig()
    gpu = _gpu_available(device)
    if kc.attention not in ATTENTION_PATHS:
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
    doc_name, doc_attn = _DOC_ATTN[attn]
    return Kernels(
        attention_name=attn, rms_norm_name=chosen["rms_norm"], rope_name=chosen["rope"],
        swiglu_name=chosen["swiglu"], attention=_ATTN[attn],
        rms_norm=table[chosen["rms_norm"]]["rms_norm"], rope=table[chosen["rope"]]["rope"],
        add_rms_norm=add_rms_norm_cpu if cpu else None,
        swiglu=table[chosen["swiglu"]]["swiglu"],
        swiglu_packed=swiglu_packed_cpu if cpu else swiglu_packed,
        mlp_in=mlp_in_cpu if cpu else None,
        attn_in=attn_in_cpu if cpu else None,
        linear_residual=linear_residual_cpu if cpu else None,
        linear_add_rms_norm=linear_add_rms_norm_cpu if cpu and kc.fuse_o_proj else None,
        embedding=embedding_cpu if cpu else embedding_reference,
        cross_entropy=cross_entropy_cpu if cpu else cross_entropy_reference,
        attention_cached=attention_cpu if cpu else attention_sdpa_mask,
        attention_document_name=doc_name, attention_document=doc_attn,
        # flash blocks only where the run's attention is flash: "math" is what resolve chose for fp32 and for a
        # GPU before Ampere, where the flash-attn kernel refuses to run (PaddlePaddle/flash-attention's
        # CHECK_FWD_EXECTUABLE: sm8x / sm90)
        attention_block_name="flash" if gpu and kc.attention == "flash" else "reference",
        attention_block=block_forward_flash if gpu and kc.attention == "flash" else block_forward,
        linear_cross_entropy_name=("cpu" if cpu else "chunked") if kc.fused_loss else "off",
        linear_cross_entropy=(linear_cross_entropy_cpu if cpu else linear_cross_entropy_chunked)
        if kc.fused_loss else None,
        grouped_mlp_name="batched_gemm" if gpu else "cpu_grouped",
        grouped_mlp=grouped_mlp_gpu if gpu else grouped_mlp_cpu,
    )
