"""Model-family facts in one table: which biases exist, per-head q/k norms, the attention kind (GQA, or
DeepSeek's multi-head latent attention), the HF class name, PaddleNLP's parameter prefix.

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


FAMILIES = {f.model_type: f for f in (
    # HF `attention_bias` puts a bias on q/k/v *and* o; `mlp_bias` on gate/up/down
    Family("llama", "LlamaForCausalLM", "llama.", lambda cfg: (cfg.attention_bias, cfg.attention_bias, cfg.mlp_bias)),
    # q/k/v always carry a bias, o_proj and the MLP never do (HF Qwen2Attention)
    Family("qwen2", "Qwen2ForCausalLM", "qwen2.", lambda cfg: (True, False, False)),
    # HF Qwen3Attention: `attention_bias` (false in every released model) on q/k/v and o, no MLP bias;
    # q_norm / k_norm per head; head_dim explicit (128 with hidden 1024 and 16 heads in Qwen3-0.6B).
    # PaddleNLP's Qwen3 uses HF's `model.` prefix with Paddle's [in, out] Linear layout: `convert` tells it by shape
    Family("qwen3", "Qwen3ForCausalLM", None,
           lambda cfg: (cfg.attention_bias, cfg.attention_bias, False), qk_norm=True),
    # HF DeepseekV2/V3Attention: `attention_bias` on q_a_proj, kv_a_proj_with_mqa and o_proj only (the
    # tuple's q/k/v slot means those two down-projections); no MLP bias
    Family("deepseek_v2", "DeepseekV2ForCausalLM", None,
           lambda cfg: (cfg.attention_bias, cfg.attention_bias, False), attention="mla"),
    Family("deepseek_v3", "DeepseekV3ForCausalLM", None,
           lambda cfg: (cfg.attention_bias, cfg.attention_bias, False), attention="mla"),
)}
MODEL_TYPES = tuple(FAMILIES)


def family(model_type: str) -> Family:
    return FAMILIES[model_type]
