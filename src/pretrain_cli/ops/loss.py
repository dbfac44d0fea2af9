"""Causal-LM loss: labels are already shifted (label t is the token after input t).

Cross-entropy in fp32 even when logits are bf16 (PaddleNLP does the same), summed and divided
by the number of counted tokens so padding (−100) never dilutes the mean.
"""
from __future__ import annotations

IGNORE_INDEX = -100


def causal_lm_loss_sum(logits, labels, cross_entropy=None):
    """(sum of token losses, number of counted tokens): for eval/accumulation across batches.

    `cross_entropy(logits [N, V], labels [N], ignore_index) -> [N]` is the model's kernel
    (`model.kernels.cross_entropy`: fused on CPU); None = Paddle's `F.cross_entropy`.
    """
    import paddle

    from pretrain_cli.ops.kernels import cross_entropy_reference

    vocab = logits.shape[-1]
    flat_logits = logits.astype("float32").reshape([-1, vocab])  # [bsz*seq_len, vocab]
    flat_labels = labels.astype("int64").reshape([-1])  # [bsz*seq_len]
    losses = (cross_entropy or cross_entropy_reference)(flat_logits, flat_labels, IGNORE_INDEX)  # [bsz*seq_len]
    count = paddle.sum((flat_labels != IGNORE_INDEX).astype("float32"))
    return paddle.sum(losses), count


def causal_lm_loss(logits, labels, cross_entropy=None):
    """Scalar fp32 mean over counted tokens; 0 (not NaN) when every label is ignored."""
    import paddle

    total, count = causal_lm_loss_sum(logits, labels, cross_entropy)
    return total / paddle.clip(count, min=1.0)


def loss_kernel(model):
    """The cross-entropy kernel `kernels.select` chose for this model (DataParallel/fleet wrap it in `_layers`)."""
    kernels = getattr(getattr(model, "_layers", model), "kernels", None)
    return getattr(kernels, "cross_entropy", None)
