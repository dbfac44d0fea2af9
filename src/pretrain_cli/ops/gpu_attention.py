"""The GPU attention paths (flash-attn through Paddle's SDPA, flashmask for packed documents, context parallelism's
flash blocks) and the head-width fallbacks each takes where flash-attn refuses the width on this GPU.

Kept apart from the kernel table (`ops.kernels`, which picks these for a GPU run and is what model code calls):
this is the one place a GPU run's attention meets flash-attn's limits at run time, by the rule `config` judges a
run by too (`ops.flash_width`), with one warning per reason the scores materialise. GPU only: CI runs these on CPU
behind stand-ins of Paddle's ops (tests/parity/test_gpu_branch.py, tests/unit/test_gpu_emulation.py).
Layouts as in kernels.py; `block_forward_flash` takes `ops.block_attention`'s (one query block, one key block).
"""
from __future__ import annotations

import warnings

from pretrain_cli import runtime
from pretrain_cli.ops import flash_width
from pretrain_cli.ops.attention import attention_sdpa_mask
from pretrain_cli.ops.block_attention import block_forward


# ---------------------------------------------------------------- attention through Paddle's SDPA (GPU: flash-attn-2)
def one_dtype(q, k, v):
    """q and k in v's dtype. Under AMP O1 the q/k RMSNorm weights (Qwen3) stay fp32, so the normed q and k come
    out fp32 while v (a white-listed linear's output) is half: `scaled_dot_product_attention` then takes the
    math path that materialises `[b, h, s, s]` (nn/functional/sdpa.py 3.3.1: `check_dtypes_low_precision_fa`
    wants one half dtype), and `flashmask_attention`, on neither of AMP's lists (amp/amp_lists.py 3.3.1), is
    promoted to fp32, for which its GPU kernel is not registered. A no-op when the dtypes agree (fp32, O2)."""
    if q.dtype != v.dtype:
        q = q.astype(v.dtype)
    if k.dtype != v.dtype:
        k = k.astype(v.dtype)
    return q, k, v


_REFUSED: set = set()  # the reasons already warned about (the rule itself: `ops.flash_width`, `config` reads it too)


def _capability(head_dim: int, backward: bool = True):
    """This process's GPU's compute capability (`runtime.gpu_capability`) where the width leaves flash-attn's refusal
    to the GPU (`flash_width.capability_decides`), else None: the device is asked only where the answer counts."""
    return runtime.gpu_capability() if flash_width.capability_decides(head_dim, backward) else None


def _words(head_dim: int, why: tuple[str, str]) -> str:
    where, reason = why
    return f"head_dim {head_dim}{' on ' + where if where else ''} ({reason})"


def _backward(*tensors) -> bool:
    """Whether autograd may take a backward through this call (as `ops.linear_loss`): not under `paddle.no_grad`
    (eval, generate, context parallelism's ring, whose backward is its own) nor of tensors that need no gradient.
    The kernels decide it themselves, so a forward alone takes flash-attn where only its backward refuses. Reentrant
    recompute (`recompute(..., use_reentrant=True)`) runs its forward under `paddle.no_grad` and again with gradients
    in the backward: where config left flash on at 193-256 (the capability unknown to it), the forward runs flash-attn
    and, on a GPU other than compute capability 8.0 / 9.0 (whose flash-attn backward takes 193-256: flash again),
    the re-run the math path, so the activations differentiated equal the forward's only to rounding."""
    import paddle

    return paddle.is_grad_enabled() and not all(t.stop_gradient for t in tensors)


def gpu_path(head_dim: int, sdpa: bool = False, backward: bool = True) -> tuple[str, str]:
    """(`flash_width.path` on this process's GPU: flash, mem_efficient or math; the `where` of flash-attn's refusal,
    "" for a width no GPU takes or none) from `flash_width.judge`, asked once, with one warning per reason a process
    where the scores materialise: `config.compute.flash_width` judged the width already on the GPU it knew (the math
    path, which `plan` counts, said in its note), so this fires where it could not: another GPU than planned, one of
    unknown capability, a caller that resolved no model."""
    capability = _capability(head_dim, backward)
    chosen, why = flash_width.judge(head_dim, capability, sdpa, backward)
    if chosen == "math":
        words = _words(head_dim, why)
        if words not in _REFUSED:
            _REFUSED.add(words)
            # the widest head this GPU takes: asked here too (once per reason) where the width alone refused
            capability = capability or runtime.gpu_capability()
            warnings.warn(f"attention on GPU: flash-attn refuses {words}, so this process materialises the [b, heads, "
                          f"s, s] attention scores, which its kernels were not resolved for (config judged another "
                          f"GPU, one of unknown capability, or no model); "
                          f"{flash_width.fix(why[0], capability=capability, backward=backward)}", RuntimeWarning,
                          stacklevel=3)
    return chosen, why[0] if why else ""


def attention_sdpa_causal(q, k, v):
    """GPU path: mask=None + is_causal lets Paddle dispatch to flash-attn-2 for fp16/bf16 (q, k, v of one dtype).
    A head width flash-attn refuses (`gpu_path`): sdpa picks its memory-efficient kernel itself over 256 (a
    multiple of 8) and its math path where the width is not a multiple of 8 (`check_head_dim_size_flash`,
    `check_head_dim_size_mem_efficient`); `attention_sdpa_mask` runs where sdpa would still pick flash-attn (193-256
    off compute capability 8.0 / 9.0 with a backward to come: it would stop the run; a forward alone runs flash)."""
    import paddle.nn.functional as F

    q, k, v = one_dtype(q, k, v)
    chosen, where = gpu_path(q.shape[-1], sdpa=True, backward=_backward(q, k, v))
    if chosen == "math" and where:  # the GPU's refusal, which sdpa does not check: it would pick flash-attn
        return attention_sdpa_mask(q, k, v)
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def attention_flashmask(q, k, v, doc_start):  # pragma: no cover - GPU only
    """Document-masked flash attention (fp16/bf16): `flashmask_attention` with one column-wise bound.

    With `causal=True` and `startend_row_indices` `[bsz, 1, seq_len, 1]`, rows at and below index r of key
    column j are masked; r = the end of key j's document, which is the number of rows whose document starts
    at or before j (starts are sorted). GQA is handled by the op. A head width flash-attn refuses
    (`gpu_path`) takes `attention_sdpa_mask` with the same documents: the kernel would stop the run.
    """
    import paddle
    from paddle.nn.functional import flashmask_attention

    q, k, v = one_dtype(q, k, v)
    if gpu_path(q.shape[-1], backward=_backward(q, k, v))[0] != "flash":
        return attention_sdpa_mask(q, k, v, doc_start)
    bsz, seq_len = doc_start.shape
    cols = paddle.arange(seq_len, dtype="int64").unsqueeze(0).expand([bsz, seq_len])  # [bsz, seq_len]
    ends = paddle.searchsorted(doc_start, cols, right=True, out_int32=True)  # [bsz, seq_len]
    return flashmask_attention(q, k, v, ends.reshape([bsz, 1, seq_len, 1]), causal=True)


def block_forward_flash(q, k, v, visible=None, causal: bool = False):  # pragma: no cover - GPU only
    """GPU: flash attention's own per-block output and lse (fp16/bf16) when the block is fully visible or the
    causal diagonal, in fp16/bf16; a document mask, fp32 or a width flash-attn's forward refuses takes
    `block_forward` (the block's scores materialised). The ring's backward is `block_backward`'s, never flash-attn's,
    and its forward runs under `paddle.no_grad`: so 193-256 runs flash on every GPU flash-attn runs on.
    A causal block must be square: the kernel aligns a non-square causal mask top-left (flash_fwd_kernel.h of
    PaddlePaddle/flash-attention), which `distributed.steps.context._tiles` never asks for."""
    import paddle

    q, k, v = one_dtype(q, k, v)
    d = q.shape[-1]
    if ((visible is not None and not causal) or q.dtype not in (paddle.float16, paddle.bfloat16)
            or gpu_path(d, backward=_backward(q, k, v))[0] != "flash"):
        return block_forward(q, k, v, visible, causal)  # flash attention: fp16/bf16, a head width it takes
    bsz, n_kv, n_rep, q_len, _ = q.shape
    k_len = k.shape[3]
    if causal and q_len != k_len:
        raise ValueError(f"a causal flash-attention block must be square (top-left alignment); got {q_len} query "
                         f"rows against {k_len} keys")
    qf = q.reshape([bsz, n_kv * n_rep, q_len, d]).transpose([0, 2, 1, 3])  # [bsz, q_len, n_heads, d]
    kf = k.reshape([bsz, n_kv, k_len, d]).transpose([0, 2, 1, 3])  # [bsz, k_len, n_kv, d]
    vf = v.reshape([bsz, n_kv, k_len, d]).transpose([0, 2, 1, 3])  # [bsz, k_len, n_kv, d]
    out, _, lse, _ = paddle._C_ops.flash_attn(qf, kf, vf, None, None, 0.0, causal, False, True, "")
    out = out.transpose([0, 2, 1, 3]).reshape([bsz, n_kv, n_rep, q_len, d])  # [bsz, n_kv, n_rep, q_len, d]
    lse = lse[:, :, :q_len].reshape([bsz, n_kv, n_rep, q_len, 1]).astype("float32")  # [bsz, n_kv, n_rep, q_len, 1]
    return out, lse
