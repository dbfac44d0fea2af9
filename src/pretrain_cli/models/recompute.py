"""Activation recompute applied to a built model from outside (the model code stays plain).

Granularities (PaddleNLP names): `full` recomputes each decoder layer, `full_attn` the
attention block (projections + RoPE + core), `core_attn` only softmax(QKᵀ)V. The wrapped
layer's `forward` is replaced on the instance, so parameter names and state_dict keys do
not change. Only active in training mode; eval runs the plain forward.
"""
from __future__ import annotations

import functools

GRANULARITIES = ("full", "full_attn", "core_attn")  # most to least recomputed (planning.fit_candidates reverses it)


def _wrap(layer, use_reentrant: bool) -> None:
    from paddle.distributed.fleet.utils import recompute

    plain = layer.forward

    @functools.wraps(plain)
    def forward(*args, **kwargs):
        if layer.training:
            return recompute(plain, *args, use_reentrant=use_reentrant, **kwargs)
        return plain(*args, **kwargs)

    layer.forward = forward


def apply_recompute(model, recompute):
    """Wrap every decoder layer's chosen part in `fleet.utils.recompute`; `recompute` is None (off) or has
    `granularity`, `use_reentrant` and `skip_layers` (`run_config.Recompute`). Returns `model`.

    The default is the non-reentrant implementation: the reentrant one re-runs backward hooks, which
    `paddle.DataParallel` rejects ("parameter has been ready before") with more than one process.
    `skip_layers` (PaddleNLP's `no_recompute_layers`) leaves those layer indices un-wrapped.
    """
    if recompute is None:
        return model
    if recompute.granularity not in GRANULARITIES:
        raise ValueError(f"recompute granularity must be one of {GRANULARITIES}, got {recompute.granularity!r}")
    skip = set(recompute.skip_layers or ())
    for i, layer in enumerate(model.model.layers):
        if i in skip:
            continue
        target = {"full": layer, "full_attn": layer.self_attn, "core_attn": layer.self_attn.core}[recompute.granularity]
        _wrap(target, recompute.use_reentrant)
    return model
