"""The Mixture-of-Experts terms of the memory and speed models (docs/PLAN.md, "Mixture-of-Experts"): the routed
experts a rank holds under expert parallelism, what a sparse layer keeps per token, and the dispatch that carries
each token to its experts and back. `s` is a `planning.memory.Setup`. No Paddle.
"""
from __future__ import annotations

from pretrain_cli.models.flops import experts, param_counts


def mlp_per_token(s, sparse: bool) -> float:
    """One layer's MLP bytes kept per token: a dense layer's (`sparse` false, or a dense model) or a sparse layer's
    (Mixture-of-Experts). Dense: the packed gate|up GEMM's output `[2·I]` (SwiGLU's input) and the SwiGLU product
    `[I]` (the down projection's input), 3·c·I ÷ tp, on every path: `ops.grouped_gemm_layer.PackedGemm` (the GPU's
    and the CPU's without the fused kernels) and the CPU's fused `pcl_mlp_in` alike keep those two and no more
    (measured on CPU, fp32: 3.0·c·I a token for a Llama MLP and a Qwen2-MoE shared expert, both paths, b 2 × s 128
    and b 4 × s 64). Counted as 4·c·I before (gate, up, silu and product), which matched only while the GEMM kept its
    `[hidden, 2·I]` weight copy, c·I a token at the calibration's b·s = 256 and hidden 128 (d60dd5e). Sparse: the
    router's fp32 logits and probabilities (2·4·E), each of the token's k routed copies through its expert (the
    gathered input and the weighted output whole, gate, up, silu and product ÷ tp: k·c·(2h + 4F/tp)), Qwen2-MoE's
    gated shared expert, a dense MLP (÷ tp), and its gate (3·c·Fs/tp + c·h + 4), DeepSeek's ungated shared experts,
    one MLP n_shared · F wide that keeps what a dense one does (3·c·Fu/tp, `models.deepseek_moe.DeepseekMoeBlock`:
    12.4 KB a token a sparse layer of the widened micro-deepseek-v3 keeps, measured); under expert parallelism
    the dispatch that runs (`all_to_all`) keeps on a GPU the rows it received and the outputs before they are sent
    back (2·k·c·h), on CPU the expert group's gathered tokens and the outputs before their reduce-scatter
    (2·ep·c·h); in half precision the router's fp32 copy of its input (4h, whole under tp: the routers of
    `models.moe` and `models.deepseek_moe` route in fp32, and the matmul keeps the copy for the gate's gradient;
    in fp32 the cast is the input itself. Measured on CPU, a bf16 input: 4.0·h bytes a token more than fp32;
    not counted before). Modelled, not calibrated: balanced routing (a busy expert's rank holds more). The layers
    differ (DeepSeek's first `first_k_dense_replace` are dense), so callers sum each layer's own
    (`activations.layer_bytes`)."""
    cfg, c, tp = s.model, s.compute_bytes, s.tp
    e = experts(cfg)
    if e is None or not sparse:
        return dense_mlp_per_token(s, cfg.intermediate_size)
    h, k = cfg.hidden_size, e.top_k
    gated = dense_mlp_per_token(s, e.shared_width) + c * h + 4 if e.shared_width else 0
    dispatch = 2 * (k if all_to_all(s) else s.ep) * c * h if s.ep > 1 else 0
    router = 8 * e.routed + (4 * h if c != 4 else 0)  # fp32 logits and probabilities; the input's fp32 copy
    return router + k * c * (2 * h + 4 * e.width / tp) + gated + dense_mlp_per_token(s, e.ungated_width) + dispatch


def dense_mlp_per_token(s, width: int) -> float:
    """Bytes a token one dense SwiGLU MLP `width` wide keeps for backward (`models.layers.MLP`: a dense layer's, a
    shared expert's): its gate|up output and SwiGLU product, 3·c·width ÷ tp (`mlp_per_token`)."""
    return 3 * s.compute_bytes * width / s.tp


def mlp_reduce_rows(s, sparse: bool) -> float:
    """Rows per token the MLP's tensor-parallel all-reduce carries in one layer: 1 for a dense layer (`sparse`
    false, or a dense model); for a sparse one the k routed copies (the experts' row-parallel outputs are summed
    before the combine weights multiply them: `distributed.steps.moe_layouts`) and 1 for a shared expert. Per
    layer, as each pipeline stage's traffic counts its own layers (`speed.stage_traffic`); averaged over the
    model's layers before, a DeepSeek stage of dense layers was charged the sparse layers' k copies."""
    e = experts(s.model)
    if e is None or not sparse:
        return 1.0
    return float(e.top_k + (1 if e.shared_width else 0))


def expert_params(s) -> float:
    """The routed experts' parameters one rank holds: all ÷ (ep · tp): 1/ep of them under expert parallelism, each
    split by the one TP plan like a dense MLP under tensor parallelism (`distributed.steps.moe_layouts`; with
    expert parallelism too, `distributed.steps.expert_parallel`)."""
    return param_counts(s.model)["experts"] / (max(s.ep, 1) * s.tp)


def all_to_all(s) -> bool:
    """Whether expert parallelism's dispatch is the all-to-all form (NCCL, a GPU) rather than the all-gather one
    (gloo, CPU): `Collectives.all_to_all_dispatch`, by the planned device."""
    return s.device == "gpu"


def dispatch_bytes(s, sparse_layers: float) -> float:
    """Bytes one rank sends per micro-batch on its expert group, over `sparse_layers` sparse decoder layers (a
    pipeline stage's own: `speed.stage_traffic` counts them, DeepSeek-V3's multi-token prediction layers among them
    on the last stage; a dense layer sends nothing here): the dispatch that runs (`all_to_all`), 4 collectives per
    sparse layer (2 in forward, their reverse in backward; `full` recompute reruns the forward's two). On a GPU
    (NCCL) the all-to-all form (`expert_all_to_all`): each token's k rows to their experts' ranks and back,
    (ep − 1)/ep × top_k × b·s·hidden·c from a rank under balanced routing. On CPU (gloo) the all-gather form
    (`expert_parallel.GatherDispatch`): the group's tokens all-gathered and the experts' outputs reduce-scattered,
    (ep − 1) × b·s·hidden·c each: ep/top_k times more above ep = top_k, the same at it (Qwen3-MoE: 8). The router's
    indices and weights and the split sizes are small."""
    e = experts(s.model)
    if e is None or s.ep <= 1:
        return 0.0
    trips = 4 + (2 if s.recompute == "full" else 0)
    rows = (s.ep - 1) / s.ep * e.top_k if all_to_all(s) else s.ep - 1  # per token, per collective
    return sparse_layers * trips * rows * s.micro_batch * s.seq_len * s.model.hidden_size * s.compute_bytes
