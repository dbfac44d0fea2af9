"""The context-parallel terms of the memory and speed models: what attention keeps per token under ring
attention, the transient working set of one attention call, and the ring's traffic (`distributed.steps.context`,
`distributed.comms.ring`). `s` is a `planning.memory.Setup`. No Paddle.
"""
from __future__ import annotations

from pretrain_cli.ops.block_attention import ROW_TILE


def context_core_per_token(s) -> float:
    """Attention's bytes kept per local token per layer under context parallelism (`distributed.steps.context`): the
    head-major q and the output, fp32 log-sum-exp per head, and the rank's own K and V (ring attention passes
    the other ranks' blocks through, it keeps none of them). No `[s, s]` scores are kept: each block's are
    recomputed in backward. Under tensor parallelism each tp rank rings its own heads: ÷ tp."""
    cfg, c = s.model, s.compute_bytes
    h, kv = cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim
    return (c * (2 * h + 2 * kv) + 4 * cfg.num_attention_heads) / s.tp


def context_working_bytes(s) -> float:
    """The transient peak of one context-parallel attention call: one block's fp32 scores, probabilities and
    their gradient `[b, heads, rows, chunk]` (chunk = max_seq_length / 2cp, rows = at most `ROW_TILE` of them),
    and the ring's two K/V blocks (the one computed, the one arriving) with, in backward, their two fp32 dK/dV
    accumulators; a block is one rank's `seq_len` tokens, whatever cp is. Each tp rank's heads only: ÷ tp."""
    cfg, c = s.model, s.compute_bytes
    chunk = s.seq_len // 2
    block = 3 * 4 * s.micro_batch * cfg.num_attention_heads * min(chunk, ROW_TILE) * chunk
    return (block + 2 * (c + 4) * s.micro_batch * s.seq_len * 2 * cfg.num_key_value_heads * cfg.head_dim) / s.tp


def context_traffic_bytes(model, micro_batch: int, seq_len: int, cp: int, compute_bytes: int, recompute,
                          tp: int = 1) -> float:
    """Bytes one rank sends per micro-batch for ring attention (`distributed.comms.ring`): per layer C−1 K/V blocks in
    forward ((cp−1)/cp of the sequence's K and V; again when `full`/`full_attn` recompute reruns the forward), C−1
    again in backward and C fp32 dK/dV blocks travelling with them. `seq_len` is the whole sequence; under tensor
    parallelism a rank's ring carries its own heads' K and V (÷ tp)."""
    if cp <= 1:
        return 0.0
    kv = micro_batch * seq_len * 2 * model.num_key_value_heads * model.head_dim / tp  # the sequence's K and V here
    forwards = 2 if recompute in ("full", "full_attn") else 1
    return model.num_hidden_layers * kv / cp * ((forwards + 1) * (cp - 1) * compute_bytes + cp * 4)


def mtp_shift_bytes(model, micro_batch: int, seq_len: int, cp: int) -> float:
    """Bytes one rank sends per micro-batch for the multi-token prediction modules' next tokens under context
    parallelism (`distributed.steps.context_shift.NextTokens`: each depth all-gathers the input ids and the labels,
    int64, over the cp group, forward only: they carry no gradient, and recompute reruns decoder layers only):
    2 × depths × (C−1) × b × S/C × 8, `seq_len` S the whole sequence. Small beside the ring's K/V (one value a token
    where a block carries 2·kv_heads·head_dim), but a collective per field and depth each micro-batch; uncounted
    before. The loss sums over the cp group (`context_sums`) are a few scalars a depth: not counted."""
    depths = model.num_nextn_predict_layers or 0
    if cp <= 1 or not depths:
        return 0.0
    return 2.0 * depths * (cp - 1) * micro_batch * (seq_len / cp) * 8
