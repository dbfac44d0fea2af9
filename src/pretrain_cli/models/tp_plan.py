"""The tensor-parallel plan: which parameter is split on which dimension, by HF name (Megatron's split).

One plan, read by both tensor-parallel forms (`distributed.steps.tensor_parallel.split_layers`, the `tp` layout step,
and `distributed.strategies.semi_auto`'s placements), by the checkpoint's pieces (each slice's box is its block of the
tensor on this dim) and by `planning.memory` (what a tp rank holds). Arithmetic only, like `models.stages`: no ranks.

Paddle's `nn.Linear` weight is `[in, out]`: a column-parallel projection (q/k/v, multi-head latent attention's
q_b/kv_b, gate/up) is split on its output, Paddle dim 1, its bias on dim 0; a row-parallel one (o, down) on its
input, Paddle dim 0, its bias whole (added once, after the sum). RMSNorm weights and RoPE are whole. The embedding
(`[vocab, hidden]`, dim 0) and the LM head (`[hidden, vocab]`, dim 1) are split over the vocabulary only where the
layout splits it (`vocab`: `ParallelConfig.vocab_parallel`).
"""
from __future__ import annotations

ATTENTION = ("q_proj", "k_proj", "v_proj")  # column-parallel: each rank its heads
# multi-head latent attention (`models.mla`): the per-head up-projections by heads; the down-projections
# (q_a_proj, kv_a_proj_with_mqa: the latents and the one RoPE key every head shares) and their norms whole
LATENT = ("q_proj", "q_b_proj", "kv_b_proj")
MLP = ("gate_proj", "up_proj")
COLUMN = ATTENTION + LATENT[1:] + MLP  # weight split on its output dim (Paddle dim 1)
ROW = ("o_proj", "down_proj")  # weight split on its input dim (Paddle dim 0)
VOCAB = {"model.embed_tokens.weight": 0, "lm_head.weight": 1}  # split over the vocabulary when `vocab`


def split_dim(name: str, vocab: bool = False) -> int | None:
    """The Paddle dim HF-named parameter `name` is split on under tensor parallelism, or None when it is whole."""
    if name in VOCAB:
        return VOCAB[name] if vocab else None
    parts = name.split(".")
    if len(parts) < 2:
        return None
    layer, key = parts[-2], parts[-1]
    if layer in COLUMN:
        return {"weight": 1, "bias": 0}.get(key)
    if layer in ROW and key == "weight":
        return 0
    return None
