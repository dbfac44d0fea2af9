"""The kernels' paths on Paddle's own ops, on any device: what `kernels.select` falls back to, what every fused
kernel is tested against, and, for the packed MLP GEMM and the weight a lookup reads whole, what a parallel layout
replaces (`distributed.steps.local_kernels`). The attention and RoPE paths of this kind live in `ops.attention` and
`ops.rope`."""
from __future__ import annotations


def rms_norm_reference(x, weight, eps: float):
    """fp32 statistics regardless of the input dtype, then cast back (PaddleNLP/HF semantics)."""
    import paddle

    x32 = x.astype("float32")
    var = paddle.mean(paddle.square(x32), axis=-1, keepdim=True)  # [..., 1]
    return (x32 * paddle.rsqrt(var + eps)).astype(weight.dtype) * weight


def add_rms_norm_reference(x, a, weight, eps: float):
    """The residual add and the norm that reads its sum: `(h, rms_norm(h))` with `h = x + a` (what the CPU kernel
    is checked against)."""
    h = x + a
    return h, rms_norm_reference(h, weight, eps)


def swiglu_reference(gate, up):
    import paddle.nn.functional as F

    return F.silu(gate) * up


def gate_up_packed(x, gate_w, up_w, gate_b=None, up_b=None):
    """`x @ [gate_w | up_w]` (+ biases) as one GEMM: `[..., 2·inter]` laid out [gate | up].

    The concat of two `[hidden, inter]` weights costs far less than a second GEMM's fixed overhead
    (docs/PERFORMANCE.md); `ops.grouped_gemm_layer.PackedGemm` makes it for the GEMM and drops it, so backward keeps
    x and the two parameters, not a `[hidden, 2·inter]` copy per layer and micro-batch. A kernel, not model code,
    so a parallel layout can supply its own (each rank concatenates its own pieces).
    """
    import paddle

    from pretrain_cli.ops.grouped_gemm_layer import packed_gemm

    out = packed_gemm(x, gate_w, up_w)  # [..., 2*inter]
    if gate_b is not None:
        out = out + paddle.concat([gate_b, up_b])  # [2*inter]
    return out


def swiglu_packed(gate_up):
    """silu(gate)·up from one `[..., 2·inter]` tensor laid out [gate | up] (one GEMM, one kernel).

    `paddle.incubate.nn.functional.swiglu` is a plain elementwise kernel that runs on CPU too
    (ARCHITECTURE.md facts: fused ops); with the packed GEMM it cut the MLP fwd+bwd ~1.6× on CPU.
    """
    import paddle.nn.functional as F

    return F.swiglu(gate_up)


# ---------------------------------------------------------------- loss
def whole_weight(w):
    """A weight an op reads whole, on one device: itself (`distributed.steps.local_kernels` gathers a sharded one)."""
    return w


def embedding_reference(ids, w):
    """`w[ids]` (Paddle's embedding)."""
    import paddle.nn.functional as F

    return F.embedding(ids, w)


def cross_entropy_reference(logits, labels, ignore_index: int):
    """Per-row loss `[N]` from logits `[N, V]`; 0 for rows whose label is `ignore_index`."""
    import paddle.nn.functional as F

    return F.cross_entropy(logits, labels, ignore_index=ignore_index, reduction="none").reshape([-1])  # [N]


# ---------------------------------------------------------------- optimizer step
def global_sq_norm_reference(grads):
    """Σ‖g‖² as a 0-D fp32 tensor: one `squared_l2_norm` per gradient (what ClipGradByGlobalNorm runs)."""
    import paddle

    sq_l2 = paddle._C_ops.squared_l2_norm
    squares = [sq_l2(g if g.dtype == paddle.float32 else g.astype("float32")) for g in grads]
    return paddle.add_n(squares).reshape([]) if squares else paddle.zeros([], dtype="float32")
