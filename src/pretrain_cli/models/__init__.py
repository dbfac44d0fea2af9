"""Model registry: `model_type` from config.json → CausalLM class.

Importing the package does not import Paddle, so `models.config` and `models.flops` stay
cheap for `check` and `plan`; the classes load on first use (after `runtime.setup_env()`).
"""
from __future__ import annotations

import importlib

from pretrain_cli.models.config import ModelConfig, check_seq_len

# model_type → "module:Class"; resolved lazily so this file never imports Paddle.
MODEL_REGISTRY = {
    "llama": "pretrain_cli.models.llama:LlamaForCausalLM",
    "qwen2": "pretrain_cli.models.qwen2:Qwen2ForCausalLM",
}


def model_class(model_type: str):
    module, name = MODEL_REGISTRY[model_type].split(":")
    return getattr(importlib.import_module(module), name)


def build_model(cfg: ModelConfig, kernels=None):
    """A freshly initialised single-device CausalLM; call `paddle.seed(s)` first for reproducible weights.

    `kernels=None` means the default selection for the device Paddle will place the tensors on
    (`paddle.device.get_device()`): on a GPU build that is the GPU path, never the CPU-only kernels.
    """
    import paddle

    from pretrain_cli import kernels as kernels_mod

    cfg.validate()
    return model_class(cfg.model_type)(cfg, kernels or kernels_mod.select(None, paddle.device.get_device()))


__all__ = ["MODEL_REGISTRY", "ModelConfig", "build_model", "check_seq_len", "model_class"]
