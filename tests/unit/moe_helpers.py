"""The MoE tests' shared pieces: a preset's config with keys changed, and one SwiGLU expert in numpy (the
reference the grouped compute and the dispatch are checked against)."""
import json

import numpy as np

from pretrain_cli.config.presets import PRESET_DIR
from pretrain_cli.models.config import ModelConfig


def moe_cfg(name="micro-qwen3-moe", **kw) -> ModelConfig:
    d = json.loads((PRESET_DIR / name / "config.json").read_text())
    return ModelConfig.from_dict({**d, **kw})


def _silu(x):
    return x / (1 + np.exp(-x))


def expert_np(x, g, u, d):
    return (_silu(x @ g) * (x @ u)) @ d
