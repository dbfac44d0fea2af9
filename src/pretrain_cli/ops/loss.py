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

    from pretrain_cli.ops.reference import cross_entropy_reference

    vocab = logits.shape[-1]
    flat_logits = logits.astype("float32").reshape([-1, vocab])  # [bsz*seq_len, vocab]
    flat_labels = labels.astype("int64").reshape([-1])  # [bsz*seq_len]
    losses = (cross_entropy or cross_entropy_reference)(flat_logits, flat_labels, IGNORE_INDEX)  # [bsz*seq_len]
    return paddle.sum(losses), count_tokens(flat_labels)


def head_loss_sum(h, weight, labels, linear_cross_entropy, vocab_major: bool):
    """`causal_lm_loss_sum` of the logits `h · weight` (`weight.T` when `vocab_major`, the tied embedding)
    through a fused head + loss kernel (`ops.linear_loss`), which never holds those logits."""
    flat_h = h.reshape([-1, h.shape[-1]])  # [bsz*seq_len, hidden]
    flat_labels = labels.astype("int64").reshape([-1])  # [bsz*seq_len]
    total = linear_cross_entropy(flat_h, weight, flat_labels, IGNORE_INDEX, vocab_major)
    return total, count_tokens(flat_labels)


def count_tokens(labels):
    """fp32 number of labels that count (not IGNORE_INDEX)."""
    import paddle

    return paddle.sum((labels != IGNORE_INDEX).astype("float32"))


def mean_loss(total, count):
    """Scalar fp32 mean over counted tokens; 0 (not NaN) when every label is ignored."""
    import paddle

    return total / paddle.clip(count, min=1.0)
