"""The Mixture-of-Experts terms of the memory and speed models (docs/PLAN.md, "Mixture-of-Experts"): the routed
experts a rank holds under expert parallelism, what a sparse layer keeps per token, and the dispatch that carries
each token to its experts and back. `s` is a `planning.memory.Setup`. No Paddle.
"""
from __future__ import annotations

import math

from pretrain_cli.models.flops import experts, param_counts
from pretrain_cli.ops.grouped import PAD_WASTE, batched_gemm_runs
from pretrain_cli.run_config import MoeConfig

# Bytes per routed token-expert pair beside the expert's own tensors: the int64 sort order, the token indices its
# gather and combine keep, the padded path's slots, the top-k indices and the fp32 combine weights. Measured on CPU
# (fp32, Paddle's ops): 54 for Qwen3-MoE's softmax router, 72 for DeepSeek-V2's (docs/PLAN.md, Mixture-of-Experts).
ROUTING_BYTES = 64


def mlp_per_token(s, sparse: bool) -> float:
    """One layer's MLP bytes kept per token: a dense layer's (`sparse` false, or a dense model) or a sparse layer's
    (Mixture-of-Experts). Dense: the packed gate|up GEMM's output `[2·I]` (SwiGLU's input) and the SwiGLU product
    `[I]` (the down projection's input), 3·c·I ÷ tp, on every path: `ops.grouped_gemm_layer.PackedGemm` (the GPU's
    and the CPU's without the fused kernels) and the CPU's fused `pcl_mlp_in` alike keep those two and no more
    (measured on CPU, fp32: 3.0·c·I a token for a Llama MLP and a Qwen2-MoE shared expert, both paths, b 2 × s 128
    and b 4 × s 64). A count of 4·c·I (gate, up, silu and product) would match only a GEMM that keeps its
    `[hidden, 2·I]` weight copy, c·I a token at the calibration's b·s = 256 and hidden 128. Sparse: the
    router's fp32 logits and probabilities (2·4·E), each of the token's k routed copies through its expert
    (`routed_per_token`), Qwen2-MoE's
    gated shared expert, a dense MLP (÷ tp), and its gate (3·c·Fs/tp + c·h + 4), DeepSeek's ungated shared experts,
    one MLP n_shared · F wide that keeps what a dense one does (3·c·Fu/tp, `models.deepseek_moe.DeepseekMoeBlock`:
    12.4 KB a token a sparse layer of the widened micro-deepseek-v3 keeps, measured); under expert parallelism
    the dispatch that runs (`all_to_all`) keeps on a GPU the rows it received and the outputs before they are sent
    back (2·k·c·h), on CPU the expert group's gathered tokens and the outputs before their reduce-scatter
    (2·ep·c·h); in half precision the router's fp32 copy of its input (4h, whole under tp: the routers of
    `models.moe` and `models.deepseek_moe` route in fp32, and the matmul keeps the copy for the gate's gradient;
    in fp32 the cast is the input itself. Measured on CPU, a bf16 input: 4.0·h bytes a token more than fp32).
    Modelled, not calibrated: balanced routing (a busy expert's rank holds more). The layers
    differ (DeepSeek's first `first_k_dense_replace` are dense), so callers sum each layer's own
    (`activations.layer_bytes`)."""
    cfg, c = s.model, s.compute_bytes
    e = experts(cfg)
    if e is None or not sparse:
        return dense_mlp_per_token(s, cfg.intermediate_size)
    h, k = cfg.hidden_size, e.top_k
    gated = dense_mlp_per_token(s, e.shared_width) + c * h + 4 if e.shared_width else 0
    dispatch = 2 * (k if all_to_all(s) else s.ep) * c * h if s.ep > 1 else 0
    router = 8 * e.routed + (4 * h if c != 4 else 0)  # fp32 logits and probabilities; the input's fp32 copy
    return router + routed_per_token(s) + gated + dense_mlp_per_token(s, e.ungated_width) + dispatch


def routed_per_token(s) -> float:
    """Bytes a token's k routed copies keep through their experts (`models.moe.dispatch_local`, `ops.grouped`):
    per copy the experts compute (`kept_share`) the weighted output the combine's multiply keeps (c·h, whole), the
    GEMMs' input row, the gate|up output SwiGLU keeps and the SwiGLU product the down GEMM keeps (c·(h + 3F/tp)) on
    every row the GEMMs run (`padded_rows`), and per copy routed `ROUTING_BYTES` of indices and weights. Measured on
    CPU (fp32, Paddle's ops, micro-qwen3-moe and micro-deepseek-v2 at b 2 × s 128, b 4 × s 256 and widened to h = F
    = 128), these terms plan a sparse layer's MLP −0.2 % to +4.4 % of what it keeps, where c·(2h + 4F/tp) (a silu and
    a product kept apart, no padding, no indices) would plan −5.0 % to +7.0 % (docs/PLAN.md, Mixture-of-Experts)."""
    cfg, c = s.model, s.compute_bytes
    e, h = experts(cfg), cfg.hidden_size
    return e.top_k * (kept_share(s) * c * h + padded_rows(s) * c * (h + 3 * e.width / s.tp) + ROUTING_BYTES)


def capacity_ratio(s) -> float:
    """An expert's capacity over its balanced share of a micro-batch's routed assignments (`capacity_factor` > 0:
    `run_config.MoeConfig.expert_capacity`, ceil(factor · b·s · k / E) / (b·s · k / E), at least the factor); inf
    dropless. The capacity is counted over one forward's tokens, b·s (expert and context parallelism, which would
    count others, are refused with it: `config.expert`, `config.moe`)."""
    e = experts(s.model)
    if e is None or s.capacity_factor <= 0:
        return math.inf
    tokens = s.micro_batch * s.seq_len
    cap = MoeConfig(capacity_factor=s.capacity_factor).expert_capacity(tokens, e.top_k, e.routed)
    return cap * e.routed / (tokens * e.top_k)


def kept_share(s) -> float:
    """The share of a micro-batch's routed assignments the experts compute in training: 1 dropless; under
    `capacity_factor` at balanced routing (the memory and speed models' assumption) each expert keeps at most its
    capacity of its balanced share, so min(1, `capacity_ratio`): a factor of 1 or more drops nothing at balance
    (only imbalance, which the models leave out, drops), 0.5 half of them. Evaluation is dropless
    (`eval_memory.eval_parts` plans it without the capacity)."""
    return min(1.0, capacity_ratio(s))


def capacity_words(factor: float, tokens: int, top_k: int, num_experts: int) -> str:
    """`capacity_factor` as what it keeps at a micro-batch of `tokens`: a factor alone does not say that 1.0 keeps
    only the balanced share, so any imbalance drops assignments (docs/MOE.md, "Token dropping"). The run's experts
    line (`orchestration.run_spec`) and `plan`'s capacity line say it in these words."""
    cap = MoeConfig(capacity_factor=factor).expert_capacity(tokens, top_k, num_experts)
    if cap is None:
        return "capacity_factor 0 (dropless: every assignment computed)"
    assigned = tokens * top_k
    return (f"capacity_factor {factor:g}: an expert computes at most {cap:,} of a micro-batch's "
            f"{assigned:,} assignments ({tokens:,} tokens x top-{top_k}; "
            f"{assignments(assigned / num_experts)} each at balance), the rest dropped (evaluation is dropless)")


def assignments(n: float) -> str:
    """A count of assignments an expert computes, in full with thousands separators (16,384, not `:.4g`'s
    1.638e+04), to a tenth where the balanced share is not whole (top-2 of 64 experts at 16 tokens: 0.5); whole when
    it is within a tenth's rounding of one (a capacity reckoned in floats: 119.99999 is 120, not 120.0)."""
    tenths = round(n, 1)
    return f"{tenths:,.0f}" if tenths == round(tenths) else f"{tenths:,.1f}"


def capacity_plan(s, max_seq_length: int) -> dict:
    """What `plan` assumes per expert of a MoE run ({} for a dense model): the run's capacity in its own words
    (`capacity_words`, as its experts line says it at a micro-batch of b · `max_seq_length` tokens), an expert's
    balanced share of a micro-batch's assignments, and what the memory and speed models plan it to compute: that
    share, or the capacity where it is smaller (`kept_share`), the integer capacity itself then (balanced x the
    share is 960.0000000000001 at 960)."""
    e = experts(s.model)
    if e is None:
        return {}
    tokens = s.micro_batch * max_seq_length
    balanced = tokens * e.top_k / e.routed
    cap = MoeConfig(capacity_factor=s.capacity_factor).expert_capacity(tokens, e.top_k, e.routed)
    return {"capacity_factor": s.capacity_factor, "words": capacity_words(s.capacity_factor, tokens, e.top_k,
                                                                          e.routed),
            "balanced": balanced, "kept_share": kept_share(s),
            "per_expert": balanced if cap is None or cap >= balanced else cap}


def padded_rows(s) -> float:
    """Rows the experts' GEMMs run per routed assignment. A GPU's grouped GEMM, in fp32 or bf16, runs the segments
    as they are (1); in fp16 (V100, T4) it has no kernel, and a GPU takes the CPU's path (`ops.grouped.
    batched_gemm_runs`, the rule `grouped_mlp_gpu` follows). The CPU's path (`ops.grouped.grouped_mlp_cpu`) pads
    every expert to the busiest one's rows while that wastes at most `PAD_WASTE`, else runs the segments (1); under
    the semi-auto engine it always pads (one graph on every rank: `distributed.steps.local_kernels._same_graph`).
    The busiest of E experts holding m rows on average under balanced routing (each copy to an expert at random):
    m + √(2·m·ln E), so 1 + √(2·ln E / m) per row: 1.25 at m = 64 and E = 8, 1.13 at m = 256 (measured: 1.20,
    1.10). Under expert parallelism a rank's E/ep experts take the group's rows. Under `capacity_factor` each expert
    runs at most its capacity, r = `capacity_ratio` of the mean: the segments min(1, r) rows; the padded path, which
    pads where it wastes at most `PAD_WASTE` of those kept (`grouped_mlp_cpu` compares with the kept counts), r rows
    where r is within that (an untrained router's busiest expert reaches its capacity: measured on CPU, tiny
    qwen3-moe at factor 1.25, cut at it in 11 of 12 layers; 1 % under the measured peak planned at balance), else
    min(busiest, r)."""
    e = experts(s.model)
    if e is None:
        return 1.0
    ratio, kept = capacity_ratio(s), kept_share(s)
    if s.device != "cpu" and batched_gemm_runs(s.amp_dtype or "float32"):
        return kept
    local = max(e.routed // max(s.ep, 1), 1)
    mean = s.micro_batch * s.seq_len * e.top_k / local  # rows an expert of this rank runs, on average
    if local < 2 or mean <= 0:
        return kept
    busiest = 1 + math.sqrt(2 * math.log(local) / mean)  # at balance, dropless
    pad = ratio if ratio <= PAD_WASTE * kept else min(busiest, ratio)  # a capacity it pads to: filled
    return pad if pad <= PAD_WASTE * kept or s.distributed_tensors else kept  # the semi-auto engine always pads


def backward_bytes(s) -> float:
    """Bytes one sparse layer's routed experts hold in their backward beyond what the layer keeps (one layer at a
    time: `activations.layer_bytes` adds it to the largest working set). The experts' GEMMs (`ops.grouped_gemm_layer.
    StackedGemm`, stacked: the CPU's padded path, a GPU's grouped GEMM) make the down projection's input gradient
    dh (c·F/tp a row they run) beside its stacked weights (E/ep·F·h/tp), then its dW (both in the weights' dtype);
    SwiGLU's backward then makes d(gate|up) (2·c·F/tp a row) while dh lives and the kept product is freed. Where
    the weights reach the GEMMs as tensors made from the parameters (the semi-auto engine's
    `distributed.steps.moe_layouts.LocalDispatch`: `dtensor_to_local`, on a GPU too), Paddle's engine runs SwiGLU's
    backward before their gradients are accumulated, so the down projection's whole dW lives beside it (÷ S under
    ZeRO-3, whose GEMM hands its shards back at once, and whose gathered experts, `gathered_layer`, are a transient
    of this same backward, taken off); leaf parameters' gradients are accumulated first (one process, fleet's
    layouts). The CPU's gloo hook (`comms.collectives.to_replicated`) copies one expert's gradient at a time, after
    that peak: not counted. Measured on CPU (micro-qwen3-moe widened, 2 gloo ranks, ZeRO-2): the step peaks in the
    last layer's SwiGLU backward, 11.2 MiB above what the layer keeps (d(gate|up) 7.7 and the down dW 4.0, the
    product 3.8 and the GEMM's dy 0.5 freed), uncounted before (the plan −5.8 % under)."""
    cfg, c, e = s.model, s.compute_bytes, experts(s.model)
    if e is None:
        return 0.0
    local = e.routed / max(s.ep, 1)
    rows = s.micro_batch * s.seq_len * e.top_k * padded_rows(s)  # rows the GEMMs run on this rank (balanced)
    dh = rows * c * e.width / s.tp
    # the stack and dW in the weights' dtype; O1 also the half cast the products read or write
    wb = c if s.amp_level == "O2" else 4 + (c if s.amp_level == "O1" else 0)
    piece = local * e.width * cfg.hidden_size / s.tp * wb  # one projection of this rank's experts
    zero3 = s.distributed_tensors and s.sharding_stage >= 3 and s.sharding_degree > 1
    held = piece / (s.sharding_degree if zero3 else 1) if s.distributed_tensors else 0.0
    out = max(dh + piece, 2 * dh + held)  # the down GEMM's backward; then SwiGLU's
    if zero3:
        out -= gathered_layer(s) * (c if s.amp_level == "O2" else 4)
    return max(out, 0.0)


def dense_mlp_per_token(s, width: int) -> float:
    """Bytes a token one dense SwiGLU MLP `width` wide keeps for backward (`models.layers.MLP`: a dense layer's, a
    shared expert's): its gate|up output and SwiGLU product, 3·c·width ÷ tp (`mlp_per_token`)."""
    return 3 * s.compute_bytes * width / s.tp


def mlp_reduce_rows(s, sparse: bool) -> float:
    """Rows per token the MLP's tensor-parallel all-reduce carries in one layer: 1 for a dense layer (`sparse`
    false, or a dense model); for a sparse one the k routed copies (the experts' row-parallel outputs are summed
    before the combine weights multiply them: `distributed.steps.moe_layouts`; those computed, `kept_share`) and 1
    for a shared expert. Per layer, as each pipeline stage's traffic counts its own layers (`speed.stage_traffic`);
    averaged over the model's layers before, a DeepSeek stage of dense layers was charged the sparse layers' k
    copies."""
    e = experts(s.model)
    if e is None or not sparse:
        return 1.0
    return e.top_k * kept_share(s) + (1 if e.shared_width else 0)


def expert_params(s) -> float:
    """The routed experts' parameters one rank holds: all ÷ (ep · tp): 1/ep of them under expert parallelism, each
    split by the one TP plan like a dense MLP under tensor parallelism (`distributed.steps.moe_layouts`; with
    expert parallelism too, `distributed.steps.expert_parallel`)."""
    return param_counts(s.model)["experts"] / (max(s.ep, 1) * s.tp)


def gathered_layer(s) -> float:
    """Elements of routed experts the semi-auto engine's ZeRO-3 holds gathered at a time: one sparse layer's whole
    (÷ tp), a transient like any ZeRO-3 weight's (`memory._largest_weight`), 0 for a dense model. The grouped GEMM
    keeps the experts' shards and gathers the weights where it reads them, one piece (gate, up or down of every
    expert) at a time with its stacked copy, in forward and again in backward (`ops.grouped_gemm_layer.StackedGemm`,
    `distributed.steps.local_kernels.ZeroGather`), so a layer's experts are an upper bound and nothing gathered
    outlives the layer (measured on CPU: tests/unit/test_zero3_expert_gather.py)."""
    e = experts(s.model)
    return 0.0 if e is None else e.routed * e.expert_params(s.model.hidden_size) / s.tp


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
