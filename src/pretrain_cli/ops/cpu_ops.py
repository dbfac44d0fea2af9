"""Loads the fused CPU kernels of `csrc/` (built by `cpu_build`); the Python face of each op.

Paddle's CPU element-wise kernels are single-threaded and unfused (docs/PERFORMANCE.md), so the CPU path compiles
its own (`cpu_build`: once per source, flags, Paddle, compiler and CPU, into the user cache). Any failure (no
compiler, no headers, a non-Linux OS) means `load()` returns None and `kernels.select` keeps the reference path,
with one warning that says why. `cpu_fused_ops: false` (the one switch) never loads them.
"""
from __future__ import annotations

import math
import sys
import warnings

from pretrain_cli.ops import cpu_build

_STATE: dict = {}  # "ops": the loaded namespace, or "error": why not


class _Ops:
    """Thin wrappers; each returns what the matching path on Paddle's ops returns (`ops.reference`, `ops.attention`,
    `ops.rope`)."""

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

    def linear_add_rms_norm(self, a, w, x, weight, eps: float):
        """(h = x + a·w, rms_norm(h)) (`w` `[in, out]`, `x` the product's shape)."""
        h, y, _ = self._run("pcl_linear_add_rms_norm", a, w, x, weight, float(eps))
        return h, y

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
        """`x *= g[0]` in place (fp32, threaded); returns x. Paddle hands a custom op a contiguous copy of a strided
        view, so on a view the scaling would be lost: refused."""
        if not x.is_contiguous():
            raise ValueError("scale_by_: x must be contiguous (it is scaled in place)")
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
        so = cpu_build.library_path(paddle)
        failed = cpu_build.failed_marker(so)
        if failed.is_file():
            raise RuntimeError(f"{failed.read_text().strip()} (cached in {failed}; delete it to retry)")
        if not so.is_file():
            cpu_build.build(paddle, so)
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


def linear_add_rms_norm_cpu(a, w, x, weight, eps: float):
    """`h = x + a·w` and the RMSNorm of h as one op: the attention's output projection writes where h goes, one row
    pass adds the residual and normalises, and the backward writes dh once for the residual and both GEMMs
    (Paddle's matmul, then `add_rms_norm`, wrote it twice and ran Paddle's matmul_grad)."""
    return load().linear_add_rms_norm(a, w, x, weight, eps)


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
    if position_ids is None:
        if "pos" not in _NO_POSITIONS:
            import paddle

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
