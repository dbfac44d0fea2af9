"""The Mixture-of-Experts terms of the memory and speed models (docs/PLAN.md, "Mixture-of-Experts"): the routed
experts a rank holds under expert parallelism, what a sparse layer keeps per token, and the all-to-all that carries
each token to its experts and back. `s` is a `planning.memory.Setup`. No Paddle.
"""
from __future__ import annotations

from pretrain_cli.models.flops import experts, param_counts


def mlp_per_token(s) -> float:
    """The MLP's bytes kept per token, averaged over the layers. A dense layer: gate, up, silu and product,
    4·c·I ÷ tp. A sparse layer (Mixture-of-Experts): the router's fp32 logits and probabilities (2·4·E), each of the
    token's k routed copies through its expert (the gathered input, gate, up, silu, product and the weighted output:
    k·c·(2h + 4F)), the shared expert and its gate (4·c·Fs + c·h + 4); under expert parallelism each copy also
    crosses the all-to-all twice (the tokens received and the outputs sent back: 2·k·c·h). Modelled, not calibrated:
    balanced routing (a busy expert's rank holds more)."""
    cfg, c, tp = s.model, s.compute_bytes, s.tp
    dense = 4 * c * cfg.intermediate_size / tp
    e = experts(cfg)
    if e is None:
        return dense
    h, k = cfg.hidden_size, e.top_k
    sparse = 8 * e.routed + k * c * (2 * h + 4 * e.width) + (4 * c * e.shared_width + c * h + 4 if e.shared_width
                                                              else 0) + (2 * k * c * h if s.ep > 1 else 0)
    return (e.sparse_layers * sparse + (cfg.num_hidden_layers - e.sparse_layers) * dense) / cfg.num_hidden_layers


def expert_params(s) -> float:
    """The routed experts' parameters one rank holds: 1/ep of them under expert parallelism (whole on every
    tensor-parallel rank: no expert tensor parallelism, as torchtitan and PaddleFormers), else all ÷ tp (the
    model's layout then splits them as it splits a dense MLP)."""
    return param_counts(s.model)["experts"] / (s.ep if s.ep > 1 else s.tp)


def all_to_all_bytes(s, layers: float) -> float:
    """Bytes one rank sends per micro-batch on its expert group (`distributed.expert_parallel`), over `layers` decoder
    layers (a pipeline stage's): per sparse layer each token's k copies of [hidden] go to their experts' ranks and
    come back, in forward and again (as gradients) in backward, 4 × (ep − 1)/ep of them leaving the rank under
    balanced routing; `full` recompute reruns the forward's two. The router's indices and weights are small."""
    e = experts(s.model)
    if e is None or s.ep <= 1:
        return 0.0
    trips = 4 + (2 if s.recompute == "full" else 0)
    sparse = e.sparse_layers * layers / s.model.num_hidden_layers
    return sparse * trips * (s.ep - 1) / s.ep * s.micro_batch * s.seq_len * e.top_k * s.model.hidden_size * \
        s.compute_bytes
