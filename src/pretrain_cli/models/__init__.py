"""Single-device causal LMs (Llama, Qwen2, Qwen3, Qwen2-MoE, Qwen3-MoE) built from an HF config.json; `build_model` is
the entry point.

Importing the package does not import Paddle, so `models.config`, `models.families` and
`models.flops` stay cheap for `check` and `plan`; the layers load on first use (after
`runtime.setup_env()`).
"""
from __future__ import annotations

from pretrain_cli.models.config import ModelConfig, past_positions


def build_model(cfg: ModelConfig, kernels=None, moe=None):
    """A freshly initialised single-device CausalLM; call `paddle.seed(s)` first for reproducible weights.

    `kernels=None` means the default selection for the device Paddle will place the tensors on
    (`paddle.device.get_device()`): on a GPU build that is the GPU path, never the CPU-only kernels.
    `moe` (`run_config.MoeConfig`, None: its defaults) is how a Mixture-of-Experts model routes and balances.
    """
    import paddle

    from pretrain_cli.models.decoder import CausalLM
    from pretrain_cli.ops import kernels as kernels_mod

    cfg.validate()
    return CausalLM(cfg, kernels or kernels_mod.select(None, paddle.device.get_device()), moe)


__all__ = ["ModelConfig", "build_model", "past_positions"]
