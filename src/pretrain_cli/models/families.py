"""Model-family facts in one table: which biases exist, per-head q/k norms, the attention kind (GQA, or
DeepSeek's multi-head latent attention), the HF class name, PaddleNLP's parameter prefix, and for the
Mixture-of-Experts families the shape of their sparse block.

The model code (`decoder.CausalLM`), the FLOP/parameter counts (`flops`), the config reader
(`config`) and checkpoint conversion (`convert`) all read this table, so adding a family is one
entry here plus whatever new layer it needs. No Paddle import.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class Family:
    model_type: str  # HF config.json `model_type`
    architecture: str  # HF class written to config.json `architectures`
    paddlenlp_prefix: str | None  # PaddleNLP names parameters `<prefix>layers.N...` instead of `model.layers.N...`
    biases: Callable  # cfg -> (q/k/v bias, o_proj bias, MLP bias)
    qk_norm: bool = False  # RMSNorm over head_dim on every q and k head before RoPE (HF q_norm / k_norm)
    attention: str = "gqa"  # "gqa" (q/k/v_proj) or "mla" (DeepSeek's latent attention, `models.mla`)
    # Mixture-of-Experts: sparse layers (`ModelConfig.is_sparse_layer`) hold `models.moe.SparseMoeBlock`
    moe: bool = False
    shared_expert: bool = False  # Qwen2-MoE: + sigmoid(shared_expert_gate(x)) * shared_expert(x)
    # HF's model stores `mlp.gate.e_score_correction_bias` (DeepSeek-V3); else not exported
    hf_router_bias: bool = False
    # tensors HF keeps in fp32 whatever the model's dtype (`_keep_in_fp32_modules_strict` of transformers 5.x, the test
    # extra's: DeepSeek-V3 its router weight and bias, V2 its router weight): exported fp32 always
    hf_fp32: tuple = ()
    # HF's defaults for keys a config.json of this family may leave out (transformers' configuration class)
    defaults: tuple = ()

    def with_defaults(self, d: dict) -> dict:
        """`d` as transformers' configuration class reads it: a key of `defaults` it leaves out or writes null takes
        the family's value. `ModelConfig.from_dict` builds the model through it and `orchestration.opened` reads the
        position range it names in a note through it, so the note's number is the one the model gets."""
        return {**d, **{key: value for key, value in self.defaults if d.get(key) is None}}


FAMILIES = {f.model_type: f for f in (
    # HF `attention_bias` puts a bias on q/k/v *and* o; `mlp_bias` on gate/up/down
    Family("llama", "LlamaForCausalLM", "llama.", lambda cfg: (cfg.attention_bias, cfg.attention_bias, cfg.mlp_bias),
           defaults=(("max_position_embeddings", 2048),)),
    # q/k/v always carry a bias, o_proj and the MLP never do (HF Qwen2Attention)
    Family("qwen2", "Qwen2ForCausalLM", "qwen2.", lambda cfg: (True, False, False),
           defaults=(("max_position_embeddings", 32768),)),
    # HF Qwen3Attention: `attention_bias` (false in every released model) on q/k/v and o, no MLP bias;
    # q_norm / k_norm per head; head_dim explicit (128 with hidden 1024 and 16 heads in Qwen3-0.6B).
    # PaddleNLP's Qwen3 uses HF's `model.` prefix with Paddle's [in, out] Linear layout: `convert` tells it by shape
    Family("qwen3", "Qwen3ForCausalLM", None,
           lambda cfg: (cfg.attention_bias, cfg.attention_bias, False), qk_norm=True,
           defaults=(("max_position_embeddings", 32768),)),
    # transformers `Qwen3MoeConfig` / `Qwen3MoeAttention`: Qwen3's attention, no shared expert
    Family("qwen3_moe", "Qwen3MoeForCausalLM", None,
           lambda cfg: (cfg.attention_bias, cfg.attention_bias, False), qk_norm=True, moe=True,
           defaults=(("num_experts", 128), ("num_experts_per_tok", 8), ("moe_intermediate_size", 768),
                     ("norm_topk_prob", False), ("decoder_sparse_step", 1), ("router_aux_loss_coef", 0.001),
                     ("max_position_embeddings", 32768))),
    # transformers `Qwen2MoeConfig` / `Qwen2MoeAttention`: q/k/v bias by `qkv_bias` (default true), o_proj none
    Family("qwen2_moe", "Qwen2MoeForCausalLM", "qwen2_moe.",
           lambda cfg: (bool(cfg.extra.get("qkv_bias", True)), False, False), moe=True, shared_expert=True,
           defaults=(("num_experts", 60), ("num_experts_per_tok", 4), ("moe_intermediate_size", 1408),
                     ("shared_expert_intermediate_size", 5632), ("norm_topk_prob", False),
                     ("decoder_sparse_step", 1), ("router_aux_loss_coef", 0.001), ("max_position_embeddings", 32768))),
    # HF DeepseekV2/V3Attention: `attention_bias` on q_a_proj, kv_a_proj_with_mqa and o_proj only (the
    # tuple's q/k/v slot means those two down-projections); no MLP bias
    # its MoE (`models.deepseek_moe`): shared experts without a gate, layers from first_k_dense_replace on sparse;
    # defaults are transformers' DeepseekV2Config / DeepseekV3Config (V2's num_experts_per_tok has none)
    Family("deepseek_v2", "DeepseekV2ForCausalLM", None,
           lambda cfg: (cfg.attention_bias, cfg.attention_bias, False), attention="mla", moe=True,
           defaults=(("num_experts", 64), ("moe_intermediate_size", 1407), ("n_shared_experts", 2),
                     ("first_k_dense_replace", 0), ("routed_scaling_factor", 1.0), ("topk_method", "greedy"),
                     ("norm_topk_prob", False), ("max_position_embeddings", 2048)), hf_fp32=("mlp.gate.weight",)),
    Family("deepseek_v3", "DeepseekV3ForCausalLM", None,
           lambda cfg: (cfg.attention_bias, cfg.attention_bias, False), attention="mla", moe=True,
           defaults=(("num_experts", 256), ("num_experts_per_tok", 8), ("moe_intermediate_size", 2048),
                     ("n_shared_experts", 1), ("first_k_dense_replace", 3), ("n_group", 8), ("topk_group", 4),
                     ("routed_scaling_factor", 2.5), ("topk_method", "noaux_tc"), ("norm_topk_prob", True),
                     ("max_position_embeddings", 4096)),
           hf_router_bias=True, hf_fp32=("mlp.gate.weight", "mlp.gate.e_score_correction_bias")),
)}
MODEL_TYPES = tuple(FAMILIES)


def family(model_type: str) -> Family:
    return FAMILIES[model_type]
