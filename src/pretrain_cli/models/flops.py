"""Parameter counts and training FLOPs per token, from the config alone (no Paddle).

The headline number is the GQA-aware PaLM/torchtitan form (ARCHITECTURE.md facts: FLOPs per token): it counts the
matmuls that are actually done, including the LM-head matmul of a tied model, and excludes
recompute so MFU is comparable across runs. `hardware=True` adds the recomputed forward
(hardware utilisation). PaddleNLP's formula is kept beside it because users compare logs;
its `4sh²` term assumes MHA, which over-counts GQA models by 6–9 %.
"""
from __future__ import annotations

from pretrain_cli.models.config import ModelConfig
from pretrain_cli.models.families import family
from pretrain_cli.models.recompute import GRANULARITIES


def _mla_params(cfg: ModelConfig) -> int:
    """Multi-head latent attention (`models.mla`): the q path (one q_proj, or q_a_proj + its norm + q_b_proj),
    kv_a_proj_with_mqa + kv_a_layernorm, kv_b_proj, o_proj; `attention_bias` on the down-projections and o_proj."""
    h, heads, bias = cfg.hidden_size, cfg.num_attention_heads, cfg.attention_bias
    q_low, kv_a = cfg.q_lora_rank, cfg.kv_lora_rank + cfg.qk_rope_head_dim
    q = h * heads * cfg.qk_head_dim if q_low is None else (
        h * q_low + (q_low if bias else 0) + q_low + q_low * heads * cfg.qk_head_dim)
    kv = h * kv_a + (kv_a if bias else 0) + cfg.kv_lora_rank + cfg.kv_lora_rank * heads * (
        cfg.qk_nope_head_dim + cfg.v_head_dim)
    return q + kv + heads * cfg.v_head_dim * h + (h if bias else 0)


def _attn_params(cfg: ModelConfig) -> int:
    if cfg.mla:
        return _mla_params(cfg)
    h, d = cfg.hidden_size, cfg.head_dim
    q, kv = cfg.num_attention_heads * d, cfg.num_key_value_heads * d
    fam = family(cfg.model_type)
    qkv_bias, o_bias, _ = fam.biases(cfg)
    qk_norm = 2 * d if fam.qk_norm else 0  # Qwen3: one [head_dim] weight each for q_norm and k_norm
    return h * q + 2 * h * kv + q * h + (q + 2 * kv if qkv_bias else 0) + (h if o_bias else 0) + qk_norm


def _mlp_params(cfg: ModelConfig, idx: int = 0, active: bool = False) -> int:
    """Layer `idx`'s MLP: dense SwiGLU, or (sparse layer) the router, the routed experts (only the top-k of them
    when `active`) and Qwen2-MoE's shared expert with its [1, hidden] gate."""
    h = cfg.hidden_size
    if not cfg.is_sparse_layer(idx):
        i = cfg.intermediate_size
        return 3 * h * i + ((2 * i + h) if family(cfg.model_type).biases(cfg)[2] else 0)
    experts = cfg.num_experts_per_tok if active else cfg.num_experts
    shared = 3 * h * cfg.shared_expert_intermediate_size + h if family(cfg.model_type).shared_expert else 0
    # DeepSeek: ungated shared experts (its e_score_correction_bias is a buffer, not counted, as transformers')
    shared += 3 * h * cfg.moe_intermediate_size * cfg.n_shared_experts
    return h * cfg.num_experts + experts * 3 * h * cfg.moe_intermediate_size + shared


def _layer_params(cfg: ModelConfig, idx: int = 0, active: bool = False) -> int:
    return _attn_params(cfg) + _mlp_params(cfg, idx, active) + 2 * cfg.hidden_size  # two RMSNorm weights


def param_counts(cfg: ModelConfig) -> dict[str, int]:
    """Unique trainable parameters; a tied LM head is not counted twice. "active": the parameters one token
    passes through (a Mixture-of-Experts model's top-k experts per sparse layer; = "total" for a dense model)."""
    embedding = cfg.vocab_size * cfg.hidden_size
    head = 0 if cfg.tie_word_embeddings else cfg.vocab_size * cfg.hidden_size
    rest = embedding + cfg.hidden_size + head
    total = rest + sum(_layer_params(cfg, i) for i in range(cfg.num_hidden_layers))
    active = rest + sum(_layer_params(cfg, i, active=True) for i in range(cfg.num_hidden_layers))
    out = {"total": total, "embedding": embedding, "non_embedding": total - embedding, "active": active}
    # DeepSeek-V3's multi-token prediction modules (`models.mtp`), outside "total" as transformers leaves them
    # out: their own parameters ("mtp"; the embedding and head are shared) and what one token passes through
    L, h, k = cfg.num_hidden_layers, cfg.hidden_size, cfg.num_nextn_predict_layers
    out["mtp"] = sum(_layer_params(cfg, L + i) + 2 * h * h + 3 * h for i in range(k))
    out["mtp_active"] = sum(_layer_params(cfg, L + i, active=True) + 2 * h * h + 3 * h for i in range(k))
    return out


def _check_recompute(recompute: str | None) -> None:
    if recompute is not None and recompute not in GRANULARITIES:
        raise ValueError(f"recompute must be None or one of {GRANULARITIES}, got {recompute!r}")


def flops_per_token(cfg: ModelConfig, seq_len: int, recompute: str | None = None,
                    hardware: bool = False) -> float:
    """Training FLOPs per token: `6·N + 12·L·H·d_head·S` (fwd + bwd); under MLA `6·L·H·(d_qk + d_v)·S`; MTP
    modules add their active parameters, the head matmul and one layer's attention each.

    N = every parameter a token passes through (a MoE model: its top-k experts) except the input embedding,
    plus the LM-head matmul when tied.
    Causal attention is counted in full (as PaLM and torchtitan do), and so is document-masked
    attention (`attention_mask_type: document`, which does less of it): MFU stays comparable across
    mask types, and the time a document mask saves shows as higher MFU. With `hardware=True` the forward
    recomputed under `recompute` is added.
    """
    _check_recompute(recompute)
    counts = param_counts(cfg)
    n = counts["active"] - counts["embedding"] + (counts["embedding"] if cfg.tie_word_embeddings else 0)
    L, H = cfg.num_hidden_layers, cfg.num_attention_heads
    v_dim = cfg.v_head_dim if cfg.mla else cfg.head_dim  # MLA's value heads are narrower than its q/k heads
    attn_fwd = 2 * L * H * (cfg.qk_head_dim + v_dim) * seq_len  # QKᵀ and PV, forward only, per token
    total = 6 * n + 3 * attn_fwd
    if cfg.num_nextn_predict_layers:  # each MTP depth: its layer, projection and the (shared) head, and attention
        depth = cfg.num_nextn_predict_layers
        total += 6 * (counts["mtp_active"] + depth * cfg.vocab_size * cfg.hidden_size) + 3 * attn_fwd * depth / L
    if hardware and recompute:
        if recompute == "full":
            total += 2 * sum(_layer_params(cfg, i, active=True) for i in range(L)) + attn_fwd
        elif recompute == "full_attn":
            total += 2 * L * _attn_params(cfg) + attn_fwd
        else:  # core_attn
            total += attn_fwd
    return float(total)


def paddlenlp_flops_per_token(cfg: ModelConfig, seq_len: int, recompute: str | None = None) -> float:
    """PaddleNLP `caculate_llm_flops` (ARCHITECTURE.md facts: FLOPs per token), recompute included when given."""
    _check_recompute(recompute)
    s, h, i, L, V = seq_len, cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers, cfg.vocab_size
    qkvo, core = 4 * s * h * h, 2 * s * s * h
    t = qkvo + core + 3 * s * h * i + s * i
    r = {None: 0, "full": t, "full_attn": qkvo + core, "core_attn": core}[recompute]
    return 2.0 * (L * (3 * t + r) + 3 * s * h * V) / s
