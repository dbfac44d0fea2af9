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


def _layer_params(cfg: ModelConfig) -> int:
    h, i = cfg.hidden_size, cfg.intermediate_size
    mlp = 3 * h * i + ((2 * i + h) if family(cfg.model_type).biases(cfg)[2] else 0)
    return _attn_params(cfg) + mlp + 2 * h  # two RMSNorm weights


def param_counts(cfg: ModelConfig) -> dict[str, int]:
    """Unique trainable parameters; a tied LM head is not counted twice."""
    embedding = cfg.vocab_size * cfg.hidden_size
    head = 0 if cfg.tie_word_embeddings else cfg.vocab_size * cfg.hidden_size
    total = embedding + cfg.num_hidden_layers * _layer_params(cfg) + cfg.hidden_size + head
    return {"total": total, "embedding": embedding, "non_embedding": total - embedding}


def _check_recompute(recompute: str | None) -> None:
    if recompute is not None and recompute not in GRANULARITIES:
        raise ValueError(f"recompute must be None or one of {GRANULARITIES}, got {recompute!r}")


def flops_per_token(cfg: ModelConfig, seq_len: int, recompute: str | None = None,
                    hardware: bool = False) -> float:
    """Training FLOPs per token: `6·N + 12·L·H·d_head·S` (fwd + bwd); under MLA `6·L·H·(d_qk + d_v)·S`.

    N = every parameter except the input embedding, plus the LM-head matmul when tied.
    Causal attention is counted in full (as PaLM and torchtitan do), and so is document-masked
    attention (`attention_mask_type: document`, which does less of it): MFU stays comparable across
    mask types, and the time a document mask saves shows as higher MFU. With `hardware=True` the forward
    recomputed under `recompute` is added.
    """
    _check_recompute(recompute)
    counts = param_counts(cfg)
    n = counts["non_embedding"] + (counts["embedding"] if cfg.tie_word_embeddings else 0)
    L, H = cfg.num_hidden_layers, cfg.num_attention_heads
    v_dim = cfg.v_head_dim if cfg.mla else cfg.head_dim  # MLA's value heads are narrower than its q/k heads
    attn_fwd = 2 * L * H * (cfg.qk_head_dim + v_dim) * seq_len  # QKᵀ and PV, forward only, per token
    total = 6 * n + 3 * attn_fwd
    if hardware and recompute:
        if recompute == "full":
            total += 2 * L * _layer_params(cfg) + attn_fwd
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
