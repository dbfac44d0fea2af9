"""Qwen2 family delta: q/k/v always carry a bias, o_proj and the MLP never do (HF Qwen2Attention)."""
from __future__ import annotations

from pretrain_cli.models.config import ModelConfig
from pretrain_cli.models.decoder import CausalLM


class Qwen2ForCausalLM(CausalLM):
    @classmethod
    def biases(cls, cfg: ModelConfig) -> tuple[bool, bool, bool]:
        return True, False, False
