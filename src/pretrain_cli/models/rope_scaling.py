"""RoPE frequencies and scales as transformers computes them (`modeling_rope_utils`), from the config alone
(no Paddle): the inverse frequencies of every supported `rope_type` (default, linear, llama3, yarn), the factor
YaRN multiplies cos/sin by (`attention_factor`), and the softmax-scale correction MLA models apply on top
(`mla_softmax_scale`: DeepSeek's `mscale_all_dim`).

`rope_dim(cfg)` is the width RoPE rotates: `head_dim` for the GQA families, `qk_rope_head_dim` for MLA (HF
sets DeepSeek's `head_dim` to it, and the rotary tables are sized by it).
"""
from __future__ import annotations

import math

import numpy as np

from pretrain_cli.models.config import ModelConfig


def rope_dim(cfg: ModelConfig) -> int:
    return cfg.head_dim


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    """YaRN's eq. 21, `0.1·mscale·ln(scale) + 1` (transformers `yarn_get_mscale`); 1 when not extending."""
    if scale <= 1:
        return 1.0
    return 0.1 * mscale * math.log(scale) + 1.0


def _yarn_factor(cfg: ModelConfig, sc: dict) -> float:
    factor = sc.get("factor")
    if factor is None:  # DeepSeek-style: the ratio of the extended to the pretrained context
        factor = cfg.max_position_embeddings / sc["original_max_position_embeddings"]
    return float(factor)


def attention_factor(cfg: ModelConfig) -> float:
    """What cos and sin are multiplied by: YaRN's `attention_factor` (given, or mscale / mscale_all_dim), else 1."""
    sc = cfg.rope_scaling or {}
    if sc.get("rope_type") != "yarn":
        return 1.0
    if sc.get("attention_factor") is not None:
        return float(sc["attention_factor"])
    factor = _yarn_factor(cfg, sc)
    mscale, mscale_all = sc.get("mscale"), sc.get("mscale_all_dim")
    if mscale and mscale_all:
        return float(_yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all))
    return _yarn_mscale(factor)


def mla_softmax_scale(cfg: ModelConfig, qk_head_dim: int) -> float:
    """MLA's softmax scale: `qk_head_dim^-½`, times `mscale(factor, mscale_all_dim)²` under a scaled RoPE with
    `mscale_all_dim` (transformers `yarn_apply_mscale`: the non-rotary dims are scaled too, as DeepSeek does)."""
    scale = qk_head_dim ** -0.5
    sc = cfg.rope_scaling or {}
    if sc.get("rope_type", "default") != "default" and sc.get("mscale_all_dim"):
        m = _yarn_mscale(sc["factor"], sc["mscale_all_dim"])
        scale = scale * m * m
    return scale


def _yarn_inv_freq(cfg: ModelConfig, sc: dict, dim: int, base: float) -> np.ndarray:
    """transformers `_compute_yarn_parameters`: a ramp between interpolated and extrapolated frequencies."""
    factor = _yarn_factor(cfg, sc)
    beta_fast, beta_slow = sc.get("beta_fast") or 32, sc.get("beta_slow") or 1
    old_ctx = sc.get("original_max_position_embeddings", cfg.max_position_embeddings)

    def correction_dim(rotations):
        return (dim * math.log(old_ctx / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if sc.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # as transformers: no singular ramp
    ramp = np.clip((np.arange(dim // 2, dtype=np.float32) - low) / (high - low), 0, 1).astype(np.float32)
    pos_freqs = (np.float32(base) ** (np.arange(0, dim, 2).astype(np.float32) / np.float32(dim))).astype(np.float32)
    extrapolation = (1.0 / pos_freqs).astype(np.float32)
    interpolation = (1.0 / (np.float32(factor) * pos_freqs)).astype(np.float32)
    keep = (1 - ramp).astype(np.float32)  # the share of each frequency left unscaled
    return (interpolation * (1 - keep) + extrapolation * keep).astype(np.float32)


def rope_inv_freq(cfg: ModelConfig) -> np.ndarray:
    """Inverse frequencies `[rope_dim/2]` as transformers computes them (fp32): default, linear, llama3, yarn."""
    dim = rope_dim(cfg)
    exponent = np.arange(0, dim, 2, dtype=np.int64).astype(np.float32) / np.float32(dim)
    inv_freq = (1.0 / (np.float32(cfg.rope_theta) ** exponent)).astype(np.float32)  # [dim/2]
    sc = cfg.rope_scaling or {}
    rope_type = sc.get("rope_type", "default")
    if rope_type == "linear":
        inv_freq = inv_freq / np.float32(sc["factor"])
    elif rope_type == "yarn":
        inv_freq = _yarn_inv_freq(cfg, sc, dim, cfg.rope_theta)
    elif rope_type == "llama3":
        factor = sc["factor"]
        low, high = sc["low_freq_factor"], sc["high_freq_factor"]
        old_ctx = sc.get("original_max_position_embeddings", cfg.max_position_embeddings)
        low_wavelen, high_wavelen = old_ctx / low, old_ctx / high
        wavelen = 2 * math.pi / inv_freq
        scaled = np.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
        smooth = (old_ctx / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
        inv_freq = np.where(medium, smoothed, scaled).astype(np.float32)
    return inv_freq
