"""The fused LM head + cross-entropy: the loss of `h · W` without ever holding the `[tokens, vocab]` logits.

At Qwen's 151,936-token vocabulary and 4 × 2048 tokens the fp32 logits alone are ~5 GB, their gradient as
much again: the largest activation of a small model. Both paths here go over the tokens in chunks of rows,
and for each chunk compute its logits, log-sum-exp and target logit and, when a gradient is wanted, turn the
chunk into `softmax − onehot` and accumulate `dh = P·Wᵀ` and `dW += hᵀ·P` right away. The gradients of the
loss SUM thus come out of the forward pass, and the backward only scales them by d(loss): three GEMMs of
tokens · hidden · vocab, as many as the unfused head + loss (a backward that recomputes the chunk logits
would need a fourth). What stays alive from forward to backward is dh (`[tokens, hidden]`) and dW
(the weight's size, fp32), instead of the logits.

- `linear_cross_entropy_cpu`: one C++ kernel (ops/csrc/loss.cc: MKL sgemm per chunk, threaded row passes).
- `linear_cross_entropy_chunked`: the same algorithm on Paddle's ops: the GPU path (fp16/bf16 chunk logits
  are cast to fp32 for the softmax), and the CPU reference the tests compare the kernel against.

Both take `h [N, hidden]`, the head weight (`[hidden, V]` as a Linear stores it, or the tied embedding
`[V, hidden]` with `vocab_major`), int64 labels `[N]` and return the fp32 sum of the token losses (rows whose
label is `ignore_index` count 0), a 0-d tensor. A gradient flows to h and to the weight, so a tied head's
gradient accumulates into the embedding like any second use of a parameter. There is no bias (Llama and
Qwen heads have none).
"""
from __future__ import annotations

import functools

from pretrain_cli.ops import cpu_ops

# logits held per chunk on the Paddle-op path: 8 Mi fp32 values (32 MiB) on CPU, 32 Mi (128 MiB) on GPU, where
# fewer chunks keep the kernel launches few. The C++ kernel holds one 128 MiB chunk: smaller ones were slower
# (2048 tokens at V = 32,000, head + loss forward and backward: 7.1 s at 8 Mi, 5.8 s at 16 Mi, 5.5 s at 32 Mi,
# unfused 6.0 s: dW is read and written once per chunk)
CHUNK_ELEMENTS = {"cpu": 1 << 23, "gpu": 1 << 25}
KERNEL_CHUNK_ELEMENTS = 1 << 25


def chunk_rows(vocab: int, device: str = "cpu", budget: int | None = None) -> int:
    """Rows per chunk for a vocabulary: the chunk's logits `[rows, vocab]` are the only ones held."""
    if budget is None:
        budget = CHUNK_ELEMENTS["gpu" if str(device).startswith(("gpu", "cuda")) else "cpu"]
    return max(16, min(4096, budget // max(int(vocab), 1)))


def _vocab(w, vocab_major: bool) -> int:
    return int(w.shape[0] if vocab_major else w.shape[1])


def _wants_grad(h, w) -> bool:
    import paddle

    return paddle.is_grad_enabled() and not (h.stop_gradient and w.stop_gradient)


def _apply(h, w, labels, loss_only, with_grad, ops=None):
    """`ops`: the fused CPU kernels when the CPU kernel runs (they scale the gradients in backward); the Paddle-op
    path never touches them, so `cpu_fused_ops: false` leaves Paddle's ops only."""
    if not _wants_grad(h, w):
        return loss_only(h, w, labels)
    from pretrain_cli.ops.linear_loss_layer import FusedLinearLoss

    return FusedLinearLoss.apply(h, w, labels, with_grad, ops)


# ---------------------------------------------------------------- CPU: the C++ kernel
def linear_cross_entropy_cpu(h, w, labels, ignore_index: int, vocab_major: bool):
    """fp32 only (CPU runs are fp32); one kernel call per pass, chunks of `chunk_rows(V)` rows inside."""
    ops = cpu_ops.load()
    chunk = chunk_rows(_vocab(w, vocab_major), budget=KERNEL_CHUNK_ELEMENTS)

    def loss_only(h, w, labels):
        return ops.linear_cross_entropy(h, w, labels, ignore_index, vocab_major, chunk).reshape([])

    def with_grad(h, w, labels):
        total, dh, dw = ops.linear_cross_entropy_grad(h, w, labels, ignore_index, vocab_major, chunk)
        return total.reshape([]), dh, dw

    return _apply(h, w, labels, loss_only, with_grad, ops)


# ---------------------------------------------------------------- GPU (and its CPU reference): Paddle's ops
def _chunks(h, w, labels, ignore_index: int, vocab_major: bool, grad: bool):
    """(loss sum, dh or None, dW fp32 or None), one chunk of rows at a time."""
    import paddle

    from pretrain_cli.ops.fp32 import autocast_off

    n, vocab = int(h.shape[0]), _vocab(w, vocab_major)
    rows = chunk_rows(vocab, "gpu" if h.place.is_gpu_place() else "cpu")
    wc = w if w.dtype == h.dtype else w.astype(h.dtype)  # one cast of the weight, not one per chunk
    # fp16: the gradients of the loss SUM come out here, before any loss scale: softmax − onehot in fp16 flushes
    # probabilities below ~6e-8 to 0 and rounds those below 6e-5 coarsely, so the two gradient GEMMs run in fp32,
    # with autocast off (under autocast a matmul runs in fp16 whatever its inputs: `ops.fp32`), and dh, dW stay
    # fp32 until backward has scaled them (bf16 has fp32's range: its GEMMs stay half). Whether the run computes in
    # fp16 is the logits' dtype: under O1 h comes fp32 out of the (promoted) norm and autocast makes the GEMM fp16
    fp16, wg = False, None  # wg: the fp32 gradient GEMMs' weight
    total = paddle.zeros([], dtype="float32")
    dhs, dw = [], None
    for c0 in range(0, n, rows):
        hc, lc = h[c0:c0 + rows], labels[c0:c0 + rows]  # [m, hidden], [m]
        logits = paddle.matmul(hc, wc, transpose_y=vocab_major)  # [m, V] in the compute dtype (autocast's)
        fp16 = logits.dtype == paddle.float16
        x = logits if logits.dtype == paddle.float32 else logits.astype("float32")  # [m, V]: the softmax in fp32
        valid = lc != ignore_index
        safe = paddle.where(valid, lc, paddle.zeros_like(lc))  # [m]
        lse = paddle.logsumexp(x, axis=-1)  # [m]
        target = paddle.take_along_axis(x, safe.unsqueeze(-1), axis=-1).squeeze(-1)  # [m]
        vf = valid.astype("float32")
        total = total + paddle.sum((lse - target) * vf)
        if not grad:
            continue
        # softmax − onehot, zero rows for ignored labels: in place on the chunk (no further [m, V] buffers)
        p = x.subtract_(lse.unsqueeze(-1)).exp_()  # [m, V]
        p = p.put_along_axis_(safe.unsqueeze(-1), -1.0, 1, reduce="add").multiply_(vf.unsqueeze(-1))
        if fp16:
            wg = w.astype("float32") if wg is None else wg
            with autocast_off():
                part = _grad_gemms(p, hc.astype("float32"), wg, vocab_major, dhs)
        else:
            part = _grad_gemms(p.astype(logits.dtype), hc, wc, vocab_major, dhs)
        part = part.astype("float32")  # [V, hidden] or [hidden, V]
        dw = part if dw is None else dw.add_(part)
        # unbound before the next chunk's GEMMs make their product: dW and one product at most, not a third head
        del part
    if not grad:
        return total, None, None
    keep = "float32" if fp16 else None  # fp16: cast by backward, after the scale (linear_loss_layer)
    dh = paddle.concat(dhs, axis=0).astype(keep or h.dtype) if dhs else paddle.zeros(h.shape, keep or h.dtype)
    dw = (dw if dw is not None else paddle.zeros(w.shape, dtype="float32")).astype(keep or w.dtype)  # dh [N, hidden]
    return total, dh, dw


def _grad_gemms(p, hc, w, vocab_major: bool, dhs: list):
    """A chunk's `dh = P·Wᵀ` (appended to `dhs`) and its share of dW, returned (`[V, hidden]` or `[hidden, V]`)."""
    import paddle

    dhs.append(paddle.matmul(p, w, transpose_y=not vocab_major))  # [m, hidden]
    return paddle.matmul(p, hc, transpose_x=True) if vocab_major else paddle.matmul(hc, p, transpose_x=True)


def _loss_sum(h, w, labels, ignore_index: int, vocab_major: bool):
    return _chunks(h, w, labels, ignore_index, vocab_major, False)[0]


def linear_cross_entropy_chunked(h, w, labels, ignore_index: int, vocab_major: bool):
    """Chunks of `chunk_rows(V, device)` rows; fp16/bf16 matmuls where the run computes in them.

    The passes are partials, not closures: to_static's SOT ran a closure called inside the autograd function with
    its cells for values (Paddle 3.3.1: `matmul(): argument (position 4) must be bool, but got cell`)."""
    loss_only = functools.partial(_loss_sum, ignore_index=ignore_index, vocab_major=vocab_major)
    with_grad = functools.partial(_chunks, ignore_index=ignore_index, vocab_major=vocab_major, grad=True)
    return _apply(h, w, labels, loss_only, with_grad)
