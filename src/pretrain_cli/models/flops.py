"""Parameter counts and training FLOPs per token, from the config alone (no Paddle).

A Mixture-of-Experts model (`num_experts` > 0: Qwen3-MoE, Qwen2-MoE, DeepSeek-V2/V3) has every expert's parameters
in its total but only the `num_experts_per_tok` routed experts, the router and the shared experts in its active
count, and its FLOPs per token are those of the active parameters (`experts`, `param_counts`' "active").

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


@dataclass(frozen=True)
class Experts:
    """A Mixture-of-Experts model's expert shape, from the HF keys: `routed` experts of width `width` per sparse
    layer, `top_k` of them per token, a gated shared expert of `shared_width` (Qwen2-MoE; 0 for none) and ungated
    shared experts of `ungated_width` in all (DeepSeek's `n_shared_experts` × its expert width), and which layers
    are sparse (`sparse[i]`)."""

    routed: int
    top_k: int
    width: int
    shared_width: int
    sparse: tuple
    ungated_width: int = 0

    @property
    def sparse_layers(self) -> int:
        return sum(self.sparse)

    def expert_params(self, h: int) -> int:
        """One routed expert's parameters: gate, up and down projections (no bias)."""
        return 3 * h * self.width

    def shared_params(self, h: int) -> int:
        """The router [E, h], and the shared experts (a gated one with its [1, h] gate, ungated ones): what every
        token of a sparse layer uses. DeepSeek's e_score_correction_bias is a buffer, not counted, as transformers'."""
        gated = 3 * h * self.shared_width + h if self.shared_width else 0
        return self.routed * h + gated + 3 * h * self.ungated_width


def experts(cfg: ModelConfig) -> Experts | None:
    """The expert shape, or None for a dense model; which layers are sparse is the config's rule
    (`ModelConfig.is_sparse_layer`: transformers' decoder layers of each family)."""
    if not family(cfg.model_type).moe or cfg.num_experts <= 0:
        return None
    return _cached(_SHAPES, cfg, _experts)


def _experts(cfg: ModelConfig) -> Experts:
    sparse = tuple(cfg.is_sparse_layer(i) for i in range(cfg.num_hidden_layers))
    shared = cfg.shared_expert_intermediate_size if family(cfg.model_type).shared_expert else 0
    return Experts(cfg.num_experts, cfg.num_experts_per_tok, cfg.moe_intermediate_size, shared, sparse,
                   cfg.moe_intermediate_size * cfg.n_shared_experts)


_SHAPES: dict = {}  # `experts`' answers by the config they describe
_COUNTS: dict = {}  # `param_counts`' answers, likewise
_LAYERS: dict = {}  # `layer_counts`' answers, likewise


def _cached(store: dict, cfg: ModelConfig, make):
    """`make(cfg)`, once per config: `plan --fit` asks these of one config tens of thousands of times. Looked up by
    the object (kept alive in the entry, so its id is not reused) and checked against its fields as they were,
    so a config changed in place is counted again; a `repr` key cost more than the counting it saved."""
    hit = store.get(id(cfg))
    fields = vars(cfg)
    if hit is None or hit[0] is not cfg or hit[1] != fields:
        if len(store) > 256:
            store.clear()
        hit = store[id(cfg)] = (cfg, dict(fields), make(cfg))
    return hit[2]


def _mlp_params(cfg: ModelConfig, idx: int = 0, active: bool = False) -> int:
    """Layer `idx`'s MLP: dense SwiGLU, or (sparse layer) the router, the routed experts (only the top-k of them
    when `active`) and Qwen2-MoE's shared expert with its [1, hidden] gate."""
    h = cfg.hidden_size
    if not cfg.is_sparse_layer(idx):
        i = cfg.intermediate_size
        return 3 * h * i + ((2 * i + h) if family(cfg.model_type).biases(cfg)[2] else 0)
    e = experts(cfg)
    return e.shared_params(h) + (e.top_k if active else e.routed) * e.expert_params(h)


def _layer_params(cfg: ModelConfig, idx: int = 0, active: bool = False) -> int:
    return _attn_params(cfg) + _mlp_params(cfg, idx, active) + 2 * cfg.hidden_size  # two RMSNorm weights


def _layer_whole(cfg: ModelConfig, idx: int = 0) -> int:
    """Layer `idx`'s parameters that tensor parallelism leaves whole on every tp rank (`models.tp_plan`: what is
    neither a column- nor a row-parallel weight, nor a column-parallel bias): the two RMSNorms, Qwen3's q/k norms,
    the o/down projections' biases, MLA's down-projections (the latents and the shared RoPE key) with their norms
    and biases, a sparse layer's router and Qwen2-MoE's shared-expert gate. DeepSeek-V3: 1.03 B over its 61 layers
    (the MLA down-projections 15.1 M a layer of it)."""
    h = cfg.hidden_size
    whole = 2 * h
    if cfg.mla:
        q_low, kv_a, bias = cfg.q_lora_rank, cfg.kv_lora_rank + cfg.qk_rope_head_dim, cfg.attention_bias
        whole += (h * q_low + q_low + (q_low if bias else 0)) if q_low is not None else 0
        whole += h * kv_a + cfg.kv_lora_rank + (kv_a if bias else 0) + (h if bias else 0)
    else:
        fam = family(cfg.model_type)
        whole += (2 * cfg.head_dim if fam.qk_norm else 0) + (h if fam.biases(cfg)[1] else 0)
    if not cfg.is_sparse_layer(idx):
        return whole + (h if family(cfg.model_type).biases(cfg)[2] else 0)  # the down projection's bias
    e = experts(cfg)
    return whole + e.routed * h + (h if e.shared_width else 0)


def param_counts(cfg: ModelConfig) -> dict[str, int]:
    """Unique trainable parameters; a tied LM head is not counted twice. "active": the parameters one token
    passes through (a Mixture-of-Experts model's top-k experts per sparse layer; = "total" for a dense model);
    "experts": every routed expert's parameters (what expert parallelism divides; 0 if dense)."""
    return dict(_cached(_COUNTS, cfg, _param_counts))


def layer_counts(cfg: ModelConfig) -> tuple[tuple[int, int, int], ...]:
    """Per decoder layer (all, what tensor parallelism leaves whole, the routed experts): what a pipeline stage's
    share is summed from (`planning.memory.stage_params`), as its layers differ: DeepSeek's first
    `first_k_dense_replace` layers are dense MLPs (V3: 396 M parameters each), the rest 256 routed experts (11.3 B)."""
    return _cached(_LAYERS, cfg, _layer_counts)


def _layer_counts(cfg: ModelConfig) -> tuple[tuple[int, int, int], ...]:
    e = experts(cfg)
    routed = e.routed * e.expert_params(cfg.hidden_size) if e else 0
    return tuple((_layer_params(cfg, i), _layer_whole(cfg, i), routed if cfg.is_sparse_layer(i) else 0)
                 for i in range(cfg.num_hidden_layers))


def _param_counts(cfg: ModelConfig) -> dict[str, int]:
    embedding = cfg.vocab_size * cfg.hidden_size
    head = 0 if cfg.tie_word_embeddings else cfg.vocab_size * cfg.hidden_size
    rest = embedding + cfg.hidden_size + head
    layers = layer_counts(cfg)
    total = rest + sum(n for n, _, _ in layers)
    active = rest + sum(_layer_params(cfg, i, active=True) for i in range(cfg.num_hidden_layers))
    e = experts(cfg)
    out = {"total": total, "embedding": embedding, "non_embedding": total - embedding, "active": active,
           "experts": e.sparse_layers * e.routed * e.expert_params(cfg.hidden_size) if e else 0}
    # DeepSeek-V3's multi-token prediction modules (`models.mtp`), outside "total" as transformers leaves them
    # out: their own parameters ("mtp"; the embedding and head are shared) and what one token passes through
    L, h, k = cfg.num_hidden_layers, cfg.hidden_size, cfg.num_nextn_predict_layers
    out["mtp"] = sum(_layer_params(cfg, L + i) + 2 * h * h + 3 * h for i in range(k))
    out["mtp_active"] = sum(_layer_params(cfg, L + i, active=True) + 2 * h * h + 3 * h for i in range(k))
    # their routed experts (a module's layer is sparse where a decoder layer of its index would be): what expert
    # parallelism divides of them
    out["mtp_experts"] = sum(e.routed * e.expert_params(h) for i in range(L, L + k)
                             if cfg.is_sparse_layer(i)) if e else 0
    # what tensor parallelism leaves whole on each tp rank: the decoder layers' (`_layer_whole`), and the MTP
    # modules' (their layer's, the two input norms, eh_proj and the head's norm)
    out["tp_whole"] = sum(whole for _, whole, _ in layers)
    out["mtp_tp_whole"] = sum(_layer_whole(cfg, L + i) + 2 * h * h + 3 * h for i in range(k))
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
        if recompute == "full":  # the decoder layers' active parameters: "active" less embedding, norm and head
            head = 0 if cfg.tie_word_embeddings else cfg.vocab_size * cfg.hidden_size
            layers = counts["active"] - counts["embedding"] - cfg.hidden_size - head  # (`_param_counts`' sum)
            total += 2 * layers + attn_fwd
        elif recompute == "full_attn":
            total += 2 * L * _attn_params(cfg) + attn_fwd
        else:  # core_attn
            total += attn_fwd
    return float(total)


def paddlenlp_flops_per_token(cfg: ModelConfig, seq_len: int, recompute: str | None = None) -> float:
    """PaddleNLP `caculate_llm_flops` (ARCHITECTURE.md facts: FLOPs per token), recompute included when given. Of a
    Mixture-of-Experts model I is the active MLP width averaged over the layers (top-k experts + shared experts)."""
    _check_recompute(recompute)
    s, h, i, L, V = seq_len, cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers, cfg.vocab_size
    e = experts(cfg)
    if e:
        i = sum(e.top_k * e.width + e.shared_width + e.ungated_width if sp else cfg.intermediate_size
                for sp in e.sparse) / L
    qkvo, core = 4 * s * h * h, 2 * s * s * h
    t = qkvo + core + 3 * s * h * i + s * i
    r = {None: 0, "full": t, "full_attn": qkvo + core, "core_attn": core}[recompute]
    return 2.0 * (L * (3 * t + r) + 3 * s * h * V) / s
