"""Causal-LM loss: labels are already shifted (label t is the token after input t).

Cross-entropy in fp32 even when logits are bf16 (PaddleNLP does the same), summed and divided
by the number of counted tokens so padding (−100) never dilutes the mean.
"""
from __future__ import annotations

IGNORE_INDEX = -100


def causal_lm_loss_sum(logits, labels):
    """(sum of token losses, number of counted tokens): for eval/accumulation across batches."""
    import paddle
    import paddle.nn.functional as F

    vocab = logits.shape[-1]
    flat_logits = logits.astype("float32").reshape([-1, vocab])  # [bsz*seq_len, vocab]
    flat_labels = labels.astype("int64").reshape([-1])  # [bsz*seq_len]
    losses = F.cross_entropy(flat_logits, flat_labels, ignore_index=IGNORE_INDEX, reduction="none")
    count = paddle.sum((flat_labels != IGNORE_INDEX).astype("float32"))
    return paddle.sum(losses), count


def causal_lm_loss(logits, labels):
    """Scalar fp32 mean over counted tokens; 0 (not NaN) when every label is ignored."""
    import paddle

    total, count = causal_lm_loss_sum(logits, labels)
    return total / paddle.clip(count, min=1.0)
