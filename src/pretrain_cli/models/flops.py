"""Parameter counts and training FLOPs per token, from the config alone (no Paddle).

A Mixture-of-Experts model (`num_experts` > 0: Qwen3-MoE, Qwen2-MoE) has every expert's parameters in its total
but only the `num_experts_per_tok` routed experts, the router and the shared expert in its active count, and its
FLOPs per token are those of the active parameters (`experts`, `param_counts`' "active").

The headline number is the GQA-aware PaLM/torchtitan form (ARCHITECTURE.md facts: FLOPs per token): it counts the
matmuls that are actually done, including the LM-head matmul of a tied model, and excludes
recompute so MFU is comparable across runs. `hardware=True` adds the recomputed forward
(hardware utilisation). PaddleNLP's formula is kept beside it because users compare logs;
its `4sh²` term assumes MHA, which over-counts GQA models by 6–9 %.
"""
from __future__ import annotations

from dataclasses import dataclass

from pretrain_cli.models.config import ModelConfig
from pretrain_cli.models.families import family
from pretrain_cli.models.recompute import GRANULARITIES


def _attn_params(cfg: ModelConfig) -> int:
    h, d = cfg.hidden_size, cfg.head_dim
    q, kv = cfg.num_attention_heads * d, cfg.num_key_value_heads * d
    fam = family(cfg.model_type)
    qkv_bias, o_bias, _ = fam.biases(cfg)
    qk_norm = 2 * d if fam.qk_norm else 0  # Qwen3: one [head_dim] weight each for q_norm and k_norm
    return h * q + 2 * h * kv + q * h + (q + 2 * kv if qkv_bias else 0) + (h if o_bias else 0) + qk_norm


@dataclass(frozen=True)
class Experts:
    """A Mixture-of-Experts model's expert shape, from the HF keys (transformers' Qwen3-MoE / Qwen2-MoE): `routed`
    experts of width `width` per sparse layer, `top_k` of them per token, a shared expert of `shared_width` (Qwen2-MoE;
    0 for none) with its sigmoid gate, and which layers are sparse (`sparse[i]`)."""

    routed: int
    top_k: int
    width: int
    shared_width: int
    sparse: tuple

    @property
    def sparse_layers(self) -> int:
        return sum(self.sparse)

    def expert_params(self, h: int) -> int:
        """One routed expert's parameters: gate, up and down projections (no bias)."""
        return 3 * h * self.width

    def shared_params(self, h: int) -> int:
        """The router [E, h], and the shared expert with its [1, h] gate: what every token of a sparse layer uses."""
        return self.routed * h + (3 * h * self.shared_width + h if self.shared_width else 0)


def experts(cfg: ModelConfig) -> Experts | None:
    """The expert shape, or None for a dense model; which layers are sparse is the config's rule
    (`ModelConfig.is_sparse_layer`: transformers' Qwen3MoeDecoderLayer / Qwen2MoeDecoderLayer)."""
    if not family(cfg.model_type).moe or cfg.num_experts <= 0:
        return None
    key = (cfg.model_type, cfg.num_hidden_layers, cfg.num_experts, cfg.num_experts_per_tok, cfg.moe_intermediate_size,
           cfg.shared_expert_intermediate_size, cfg.decoder_sparse_step, tuple(cfg.mlp_only_layers))
    if key not in _SHAPES:  # `plan --fit` asks this of one config tens of thousands of times
        sparse = tuple(cfg.is_sparse_layer(i) for i in range(cfg.num_hidden_layers))
        shared = cfg.shared_expert_intermediate_size if family(cfg.model_type).shared_expert else 0
        _SHAPES[key] = Experts(cfg.num_experts, cfg.num_experts_per_tok, cfg.moe_intermediate_size, shared, sparse)
    return _SHAPES[key]


_SHAPES: dict = {}  # `experts`' answers by the fields they read


def _mlp_params(cfg: ModelConfig, e: Experts | None, active: bool) -> int:
    """One layer's MLP: dense (`intermediate_size`, `e` None), or a sparse layer's router, shared expert and its
    routed experts (all of them, or the `top_k` a token uses when `active`)."""
    h, i = cfg.hidden_size, cfg.intermediate_size
    if e is None:
        return 3 * h * i + ((2 * i + h) if family(cfg.model_type).biases(cfg)[2] else 0)
    return e.shared_params(h) + (e.top_k if active else e.routed) * e.expert_params(h)


def _layers_params(cfg: ModelConfig, active: bool = False) -> int:
    """Every decoder layer's parameters (the routed experts a token uses only, when `active`)."""
    e = experts(cfg)
    sparse = e.sparse_layers if e else 0
    attn_norms = _attn_params(cfg) + 2 * cfg.hidden_size  # two RMSNorm weights
    return (cfg.num_hidden_layers * attn_norms + (cfg.num_hidden_layers - sparse) * _mlp_params(cfg, None, active)
            + (sparse * _mlp_params(cfg, e, active) if e else 0))


def param_counts(cfg: ModelConfig) -> dict[str, int]:
    """Unique trainable parameters; a tied LM head is not counted twice. "active": the parameters one token passes
    through (a Mixture-of-Experts model: the total without the routed experts it is not sent to; = "total" for a
    dense model); "experts": every routed expert's parameters (what expert parallelism divides; 0 if dense)."""
    embedding = cfg.vocab_size * cfg.hidden_size
    head = 0 if cfg.tie_word_embeddings else cfg.vocab_size * cfg.hidden_size
    total = embedding + _layers_params(cfg) + cfg.hidden_size + head
    e = experts(cfg)
    active = total - _layers_params(cfg) + _layers_params(cfg, active=True) if e else total
    return {"total": total, "embedding": embedding, "non_embedding": total - embedding, "active": active,
            "experts": e.sparse_layers * e.routed * e.expert_params(cfg.hidden_size) if e else 0}


def _check_recompute(recompute: str | None) -> None:
    if recompute is not None and recompute not in GRANULARITIES:
        raise ValueError(f"recompute must be None or one of {GRANULARITIES}, got {recompute!r}")


def flops_per_token(cfg: ModelConfig, seq_len: int, recompute: str | None = None,
                    hardware: bool = False) -> float:
    """Training FLOPs per token: `6·N + 12·L·H·d_head·S` (fwd + bwd).

    N = every parameter except the input embedding, plus the LM-head matmul when tied; of a Mixture-of-Experts
    model the active ones (`param_counts`' "active": the router, shared expert and top-k routed experts).
    Causal attention is counted in full (as PaLM and torchtitan do), and so is document-masked
    attention (`attention_mask_type: document`, which does less of it): MFU stays comparable across
    mask types, and the time a document mask saves shows as higher MFU. With `hardware=True` the forward
    recomputed under `recompute` is added.
    """
    _check_recompute(recompute)
    counts = param_counts(cfg)
    n = counts["active"] - (0 if cfg.tie_word_embeddings else counts["embedding"])
    L, H, d = cfg.num_hidden_layers, cfg.num_attention_heads, cfg.head_dim
    attn_fwd = 4 * L * H * d * seq_len  # QKᵀ and PV, forward only, per token
    total = 6 * n + 3 * attn_fwd
    if hardware and recompute:
        if recompute == "full":
            total += 2 * _layers_params(cfg, active=True) + attn_fwd
        elif recompute == "full_attn":
            total += 2 * L * _attn_params(cfg) + attn_fwd
        else:  # core_attn
            total += attn_fwd
    return float(total)


def paddlenlp_flops_per_token(cfg: ModelConfig, seq_len: int, recompute: str | None = None) -> float:
    """PaddleNLP `caculate_llm_flops` (ARCHITECTURE.md facts: FLOPs per token), recompute included when given. Of a
    Mixture-of-Experts model I is the active MLP width averaged over the layers (top-k experts + shared expert)."""
    _check_recompute(recompute)
    s, h, i, L, V = seq_len, cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers, cfg.vocab_size
    e = experts(cfg)
    if e:
        i = sum(e.top_k * e.width + e.shared_width if sp else cfg.intermediate_size for sp in e.sparse) / L
    qkvo, core = 4 * s * h * h, 2 * s * s * h
    t = qkvo + core + 3 * s * h * i + s * i
    r = {None: 0, "full": t, "full_attn": qkvo + core, "core_attn": core}[recompute]
    return 2.0 * (L * (3 * t + r) + 3 * s * h * V) / s
