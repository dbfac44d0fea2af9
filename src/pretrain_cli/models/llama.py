"""Llama family delta: HF `attention_bias` puts a bias on q/k/v *and* o; `mlp_bias` on the MLP."""
from __future__ import annotations

from pretrain_cli.models.config import ModelConfig
from pretrain_cli.models.decoder import CausalLM


class LlamaForCausalLM(CausalLM):
    @classmethod
    def biases(cls, cfg: ModelConfig) -> tuple[bool, bool, bool]:
        return cfg.attention_bias, cfg.attention_bias, cfg.mlp_bias
