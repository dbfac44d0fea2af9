"""What an export says of the ways its model computes otherwise than the run that trained it: one `note:` line
(`note`), written by the final export and `pretrain-cli export` alike (`export.write_weights`).

Two training choices of ours that transformers' MoE classes have not, so an exported model is another model, not
the checkpoint written in transformers' names: the auxiliary-loss-free routing bias (`moe_router_bias_update_rate`),
which a Qwen MoE export leaves out (`bias_part`), and `capacity_factor`, whose dropped assignments transformers'
dropless blocks compute (`capacity_part`). Said, not refused: transformers' model is what a user of the export
gets, and how far its outputs move is the run's to measure (docs/MOE.md, "Evaluate, generate, export" has one).
"""
from __future__ import annotations

import math

import numpy as np

SECTION = 'docs/MOE.md, "Evaluate, generate, export"'


def note(cfg, biases, capacity_factor) -> str | None:
    """The one line, or None when the exported model computes as the run trained (`biases`: the checkpoint's routing
    biases, as arrays; `capacity_factor`: the run's, None where its record does not say)."""
    parts = [p for p in (bias_part(cfg, biases), capacity_part(cfg, capacity_factor)) if p]
    return f"note: {'; and '.join(parts)}; {SECTION}" if parts else None


def bias_part(cfg, biases) -> str | None:
    """transformers' Qwen2-/Qwen3-MoE have no routing bias (`Family.hf_router_bias`), so an export leaves out
    `mlp.gate.e_score_correction_bias`. Zero (balancing off) that changes nothing; a bias the run trained
    (`moe_router_bias_update_rate`) chose other experts for some tokens, so the exported model's outputs differ
    from the checkpoint's."""
    from pretrain_cli.models.families import FAMILIES

    largest = max((float(np.abs(b).max()) for b in biases if np.size(b)), default=0.0)
    if FAMILIES[cfg.model_type].hf_router_bias or largest == 0.0:
        return None
    return (f"the routing bias the run trained (moe_router_bias_update_rate; largest |bias| {largest:.3g}) is not "
            f"exported: transformers' {FAMILIES[cfg.model_type].architecture} has none, so the exported model routes "
            f"without it and its outputs differ from the checkpoint's (eval and generate on a checkpoint-N route "
            f"with it)")


def capacity_part(cfg, capacity_factor) -> str | None:
    """transformers' MoE blocks compute every assignment (dropless); a run with `capacity_factor` > 0 trained with
    the assignments past an expert's capacity dropped (weight 0), so the exported model computes tokens the run
    skipped. Nothing for a dense model (the key has no effect there) or a record that does not say."""
    from pretrain_cli.models.families import FAMILIES

    if not getattr(cfg, "num_experts", 0) or isinstance(capacity_factor, bool) or not isinstance(
            capacity_factor, (int, float)) or not math.isfinite(capacity_factor) or capacity_factor <= 0:
        return None
    return (f"the run trained with capacity_factor {capacity_factor:g}, which drops the assignments past an "
            f"expert's capacity (the log's moe_dropped_share says how many); the exported model runs every token "
            f"(dropless), as transformers' {FAMILIES[cfg.model_type].architecture} does, so its outputs differ from "
            f"what training computed")
