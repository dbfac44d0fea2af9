"""Activation recompute applied to a built model from outside (the model code stays plain).

Granularities (PaddleNLP names): `full` recomputes each decoder layer, `full_attn` the
attention block (projections + RoPE + core), `core_attn` only softmax(QKᵀ)V. The wrapped
layer's `forward` is replaced on the instance, so parameter names and state_dict keys do
not change. Only active in training mode; eval runs the plain forward.
"""
from __future__ import annotations

import functools

GRANULARITIES = ("full", "full_attn", "core_attn")


def _wrap(layer) -> None:
    from paddle.distributed.fleet.utils import recompute

    plain = layer.forward

    @functools.wraps(plain)
    def forward(*args, **kwargs):
        if layer.training:
            return recompute(plain, *args, **kwargs)
        return plain(*args, **kwargs)

    layer.forward = forward


def apply_recompute(model, granularity: str | None):
    """Wrap every decoder layer's chosen part in `fleet.utils.recompute`; returns `model`."""
    if granularity in (None, "", "none"):
        return model
    if granularity not in GRANULARITIES:
        raise ValueError(f"recompute_granularity must be one of {GRANULARITIES}, got {granularity!r}")
    for layer in model.model.layers:
        target = {"full": layer, "full_attn": layer.self_attn, "core_attn": layer.self_attn.core}[granularity]
        _wrap(target)
    return model
