"""Per-device training memory as a sum of named parts, from the architecture and run shape alone.

No Paddle: `plan` must answer before any GPU time and before data exists. This module owns the run's shape
on one device (`Setup`), the parameter side (what a rank or pipeline stage holds: weights, gradients, AdamW
state, master weights, under each ZeRO stage), the sum (`estimate`, per stage `pipeline_stages`), start-up's
peak (`startup_parts`) and a checkpoint's size; the step's activations and loss are `planning.activations`'
terms, context parallelism's `planning.context`'s, Mixture-of-Experts' `planning.experts`'. Steady state is
modelled: gradients persist across steps (`clear_grad` zeroes them in place), so weights, gradients, optimizer
state and the step's activations coexist at the start of backward, and the peak is their sum.
"""
from __future__ import annotations

from dataclasses import dataclass

from pretrain_cli.models.flops import experts, layer_counts, param_counts
from pretrain_cli.models.stages import stage_bounds, stage_layers
from pretrain_cli.planning.activations import (activation_bytes, document_mask_bytes, final_norm_bytes,
                                               head_kept_bytes, head_loss_bytes, layer_bytes, mtp_activation_bytes)
from pretrain_cli.planning.context import context_working_bytes
from pretrain_cli.planning.experts import expert_params, gathered_layer
from pretrain_cli.planning.schedule import in_flight, live_chunks  # (in_flight: read here by the tests too)

GIB = float(2**30)
# CUDA context + cuBLAS/cuDNN workspaces (~0.75 GiB on A100/H100 with CUDA 12), plus the caching
# allocator's fragmentation, ~5 % of what it hands out. CPU mode uses a measured baseline instead.
FRAMEWORK_GIB = 0.75
FRAGMENTATION = 0.05


@dataclass(frozen=True)
class Setup:
    """One device's share of a run; every field a plan suggestion may change."""

    model: object  # models.config.ModelConfig
    micro_batch: int
    seq_len: int
    compute_bytes: int = 4  # 2 under fp16/bf16 autocast or O2, 4 for fp32
    amp_level: str | None = None  # None (fp32), "O1", "O2"
    amp_dtype: str | None = None  # "bfloat16", "float16" (autocast or O2), None (fp32): `experts.padded_rows`
    master_grad: bool = False  # O2 + amp_master_grad: fp32 gradients
    sharding_stage: int = 0
    sharding_degree: int = 1
    tp: int = 1
    vocab_parallel: bool = False  # config.resolve: tp splits the embedding and LM head (it divides vocab_size)
    recompute: str | None = None  # None, "full", "full_attn", "core_attn"
    attention: str = "math"  # "math" materialises [b, heads, s, s]; "flash" does not on GPU (on CPU: fp32 probs)
    fused_rms_norm: bool = False
    fused_rope: bool = False
    device: str = "gpu"  # "gpu" adds the framework constant; "cpu" adds `baseline_bytes`
    baseline_bytes: float = 0.0
    dp_buffers: bool = False  # run_layout.EngineTraits: paddle.DataParallel's fused all-reduce buffers
    distributed_tensors: bool = False  # run_layout.EngineTraits: the semi-auto engine's DistTensors
    document_mask: bool = False  # attention_mask_type: document (packed samples carry doc_start)
    reset_positions: bool = False  # ... and position_ids that restart per document
    fused_loss: bool = False  # the fused LM head + loss (config.resolve: off only for a vocabulary-split head)
    pp: int = 1  # pipeline stages (engine "pipeline"): each device holds one stage
    micro_batches: int = 1  # gradient_accumulation_steps: the micro-batches 1F1B keeps in flight (at most pp)
    vpp: int = 1  # virtual_pp_degree: each stage runs vpp model chunks under fleet's interleaved 1F1B (`in_flight`)
    # context parallelism (distributed.steps.context): `seq_len` is then one rank's share, max_seq_length / cp
    cp: int = 1
    sp: bool = False  # sequence parallelism with tp (distributed.steps.sequence_parallel): norms and residuals ÷ tp
    ep: int = 1  # expert parallelism (distributed.steps.expert_parallel): each rank holds 1/ep of the routed experts
    capacity_factor: float = 0.0  # a MoE run's token capacity (run_config.MoeConfig; 0: dropless): `experts.kept_share`
    # dp × sharding: ranks whose gradients are all-reduced (on CPU over gloo: `head_backward_bytes`)
    data_ranks: int = 1

    @property
    def vocab_tp(self) -> int:
        """The ranks the vocabulary is split over: tp, or 1 when the embedding and LM head are whole on each."""
        return self.tp if self.vocab_parallel else 1


def _largest_weight(s: Setup) -> float:
    """Elements of the largest weight one rank gathers whole for use under ZeRO-3 and drops after it, on the
    semi-auto engine one sparse layer's routed experts among them (`experts.gathered_layer`; `_parts` adds what it
    keeps gathered until backward: the dense MLPs' gate|up concatenations). The embedding or LM head counts whole:
    the fused head + loss's forward holds the gathered head beside its dW and a chunk of logits, the step's peak on
    CPU from a few hundred tokens a micro-batch on (measured: docs/PLAN.md, the memory model), and on a GPU, whose
    backward of the head holds only dW and its 1/S shard (no gloo all-reduce copy; not measured there)."""
    cfg = s.model
    return max(cfg.vocab_size * cfg.hidden_size / s.vocab_tp, cfg.hidden_size * cfg.intermediate_size / s.tp,
               gathered_layer(s) if s.distributed_tensors else 0.0)


def stage_params(s: Setup, stage: int) -> float:
    """Parameters one rank of a pipeline stage holds: its own decoder layers (`models.stages.stage_layers`, virtual
    stages' chunks included) summed layer by layer (`flops.layer_counts`: DeepSeek's first dense layers' MLPs are
    not the sparse layers' shared experts), each ÷ tp but what tp leaves whole (norms, routers, MLA's latent
    down-projections: "tp_whole"), its routed experts ÷ (ep · tp) (`stage_experts`); the embedding on the first
    stage, the final norm and the LM head on the last (÷ tp when the vocabulary is split; a tied head is the
    embedding's copy there: fleet keeps one per stage). The multi-token prediction modules (`mtp_params`) and,
    untied, the embedding's copy their lookups read are on the last stage too (`models.stages.last_stage_embeds`)."""
    cfg, counts = s.model, param_counts(s.model)
    head = cfg.vocab_size * cfg.hidden_size
    layers = layer_counts(cfg)  # per layer (all, tp-whole, routed experts)
    n = sum((layers[i][0] - layers[i][1] - layers[i][2]) / s.tp + layers[i][1]
            for i in stage_layers(cfg.num_hidden_layers, s.pp, s.vpp)[stage])
    n += stage_experts(s, stage)  # the stage's routed experts, the MTP modules' among them on the last stage
    n += counts["embedding"] / s.vocab_tp if stage == 0 else 0
    n += cfg.hidden_size + head / s.vocab_tp if stage == s.pp - 1 else 0
    if stage == s.pp - 1 and cfg.num_nextn_predict_layers:
        n += mtp_params(s)[0] + (0 if cfg.tie_word_embeddings else counts["embedding"] / s.vocab_tp)
    return n


def stage_experts(s: Setup, stage: int = 0) -> float:
    """The routed experts' parameters one rank holds (÷ ep · tp, as `experts.expert_params`): on one process every
    sparse layer's and the multi-token prediction modules' (`mtp_params`); under a pipeline its stage's sparse
    layers' only, and the modules' on the last stage. What expert parallelism keeps out of ZeRO-1's sharding
    (`_parts`): counting every stage's there planned DeepSeek-V3 at pp 16 × ep 16 with `sharding: stage1` at
    293 GiB of optimizer state a rank, 42 GiB without sharding."""
    if s.pp <= 1:
        return expert_params(s) + mtp_params(s)[1]
    layers = layer_counts(s.model)
    routed = sum(layers[i][2] for i in stage_layers(s.model.num_hidden_layers, s.pp, s.vpp)[stage])
    return routed / (max(s.ep, 1) * s.tp) + (mtp_params(s)[1] if stage == s.pp - 1 else 0.0)


def largest_tensor(s: Setup, stage: int = 0) -> float:
    """Elements of the largest single parameter tensor of a pipeline stage, whole (not ÷ tp): the embedding or
    LM head where the stage holds one, else a layer's MLP or q/o projection."""
    cfg = s.model
    layer = max(cfg.hidden_size * cfg.intermediate_size, cfg.hidden_size * cfg.num_attention_heads * cfg.head_dim)
    vocab = stage in (0, s.pp - 1)
    return float(max(layer, cfg.vocab_size * cfg.hidden_size if vocab else 0))


def startup_parts(s: Setup) -> dict[str, float]:
    """Name → bytes one rank holds at the peak of start-up (building the run, before the first step): the
    fullest pipeline stage's. The rule follows the build (docs/DISTRIBUTED.md, start-up; docs/PLAN.md, "Start-up"),
    written once here:

    - `weights`: each rank creates only the parameters it holds — its pipeline stage, its tensor-parallel slice,
      its ZeRO-3 shard (ZeRO-1/2 keep whole weights) — at their local size, in fp32 (ZeRO-3's shards under O2 on
      GPU in the compute dtype: they are created after the O2 cast); master weights and AdamW moments come later;
    - `transient`: while a parameter is created, its block as a host array in fp32: one whole tensor where the
      parameter is whole (copied straight into it), 2 × the block where a block is placed (TP, ZeRO-3: the host
      array and a Paddle tensor); under tensor parallelism inside pipeline stages the layers' tensor-parallel
      weights are created as slices (2 × the largest slice) and the embedding and LM head, whole on every tp rank
      of their stage, as one tensor each. Reading weights from disk (resume,
      `continue_training`) reads one block at a time, which is no larger;
    - `framework`: as in steady state (CUDA context and fragmentation on GPU, the measured baseline on CPU).
    """

    out = []
    deg = max(s.sharding_degree, 1) if s.sharding_stage >= 3 else 1
    o2_shards = deg > 1 and s.amp_level == "O2" and s.device == "gpu"
    for stage in range(s.pp):
        n = stage_params(s, stage) if s.pp > 1 else _device_params(s)
        cfg = s.model
        ends = stage in (0, s.pp - 1)  # the stages holding the embedding or the LM head
        layer = max(cfg.hidden_size * cfg.intermediate_size, cfg.hidden_size * cfg.num_attention_heads
                    * cfg.head_dim) / s.tp
        if s.pp > 1 and s.tp > 1:  # the layers' tp slices, placed (twice); the embedding and head whole (once)
            transient = max(4 * cfg.vocab_size * cfg.hidden_size if ends else 0, 2 * 4 * layer)
        elif s.tp > 1 or deg > 1:  # placed blocks: the largest block, twice
            vocab = cfg.vocab_size * cfg.hidden_size / s.vocab_tp if ends else 0
            transient = 2 * 4 * max(vocab, layer) / deg
        else:  # whole parameters: one tensor
            transient = 4 * largest_tensor(s, stage)
        parts = {"weights": n * (s.compute_bytes if o2_shards else 4) / deg, "transient": transient}
        if s.device == "cpu":
            parts["framework"] = s.baseline_bytes
        else:
            parts["framework"] = FRAMEWORK_GIB * GIB + FRAGMENTATION * sum(parts.values())
        out.append(parts)
    return max(out, key=lambda parts: sum(parts.values()))


def pipeline_stages(s: Setup) -> list[dict[str, float]]:
    """`estimate` for each pipeline stage: its own parameters, gradients and states; the schedule keeps the
    activations of the model chunks in flight at the stage's peak (`schedule.live_chunks`, walked in fleet's order:
    1F1B min(pp - stage, micro-batches) whole stages, the first stage the most; interleaved, each of the stage's
    chunks as many times as fleet has run it and not yet its backward), each chunk its own layers as the pipeline
    splits them (chunk c of stage s: layers of `stage_bounds` over pp·V, number s + c·pp), each dense or sparse
    (`layer_bytes`; an average layer of the model before: DeepSeek-V3's stage 0 at pp 16, layers 0-2, all dense, was
    planned with 1.95x its own layers' activations; and under virtual stages every chunk 1/V of the stage's layers,
    where DeepSeek's first stage holds more of its chunk 0 than of the others), plus its largest layer's recompute
    working set; only the last stage computes the logits and the loss, and it runs the multi-token prediction modules
    in that loss (`distributed.steps.pipeline_stages.StageLoss`): their activations (`mtp_activation_bytes`) and heads
    + losses (in `head_loss_bytes`) are the last stage's, as their parameters are (`stage_params`), once per
    micro-batch in flight in its last chunk (a second one's loss keeps what its backward reads: `head_kept_bytes`)."""
    cfg = s.model
    final_norm = final_norm_bytes(s)
    bounds = stage_bounds(cfg.num_hidden_layers, s.pp * s.vpp)  # chunk g: layers bounds[g] .. bounds[g + 1] - 1
    out = []
    for stage in range(s.pp):
        last = stage == s.pp - 1
        chunks = [layer_bytes(s, range(bounds[g], bounds[g + 1])) for g in range(stage, s.pp * s.vpp, s.pp)]
        live = live_chunks(s.pp, s.vpp, s.micro_batches, stage, tuple(kept for kept, _ in chunks))
        _, ends = in_flight(s.pp, s.vpp, s.micro_batches, stage)
        acts = sum(n * kept for n, (kept, _) in zip(live, chunks)) + max(redo for _, redo in chunks)
        acts += ends * (final_norm + mtp_activation_bytes(s)) if last else 0.0
        head = head_loss_bytes(s) + (ends - 1) * head_kept_bytes(s) if last else 0.0
        out.append(_parts(s, stage_params(s, stage), acts, head, sum(live) * document_mask_bytes(s), stage))
    return out


def estimate(s: Setup) -> dict[str, float]:
    """Name → bytes on one device; the values sum to the predicted peak. A pipeline: its fullest stage's.

    Engine facts measured on CPU (docs/PLAN.md): `paddle.DataParallel` keeps its fused all-reduce buffers
    (one more gradient-sized copy); the semi-auto engine's CPU gradient hook all-reduces whole gradients,
    so ZeRO-2/3 shard them only on GPU; ZeRO-3 gathers each weight whole while it is used (the largest
    one is the working set); and on CPU the vocabulary-split logits are gathered whole for the loss."""
    if s.pp > 1:
        return max(pipeline_stages(s), key=lambda parts: sum(parts.values()))
    return _parts(s, _device_params(s), activation_bytes(s), head_loss_bytes(s),
                  document_mask_bytes(s))



def mtp_params(s: Setup) -> tuple[float, float]:
    """(the rest, the routed experts) of the multi-token prediction modules' own parameters one rank holds
    (`models.mtp`; outside `param_counts`' total, as transformers leaves them out, but trained here): the rest ÷ tp
    but what tp leaves whole (`param_counts`' "mtp_tp_whole"), the routed experts ÷ (ep · tp) as the decoder's."""
    counts = param_counts(s.model)
    routed, whole = counts["mtp_experts"], counts["mtp_tp_whole"]
    return (counts["mtp"] - routed - whole) / s.tp + whole, routed / (max(s.ep, 1) * s.tp)  # as `expert_params`

def _device_params(s: Setup) -> float:
    """The whole model's parameters on one tensor-parallel rank (the vocabulary split only when `vocab_tp`), the
    routed experts ÷ ep (`expert_params`), and the multi-token prediction modules' (`mtp_params`)."""
    counts = param_counts(s.model)
    head = s.model.vocab_size * s.model.hidden_size  # the LM head's matmul weight (tied or not)
    vocab = counts["embedding"] + (0 if s.model.tie_word_embeddings else head)
    routed, whole = counts["experts"], counts["tp_whole"] + s.model.hidden_size  # + the final norm
    return ((counts["total"] - vocab - routed - whole) / s.tp + whole + vocab / s.vocab_tp + expert_params(s)
            + sum(mtp_params(s)))


def _cpu_zero3_sharded_grads(s: Setup) -> float:
    """Parameters (this tp rank's) whose gradients stay dp shards under the semi-auto engine's ZeRO-3 on CPU
    (measured at tp 1, with Paddle's ops and the fused CPU kernels alike: benchmarks/plan_calibration.py --layouts,
    docs/PLAN.md). A weight a matmul reads as it is gets a Partial gradient, which the gloo hook all-reduces whole
    (`comms.collectives.to_replicated`) and which then persists whole: the attention projections, the down
    projection, an unfused LM head. A weight another op reads first gets its gradient back as its shard: the
    embedding (the lookup), the packed gate|up (their concatenation: `ops.kernels.gate_up_packed`), the LM
    head under the fused head + loss, and the routed experts (`distributed.steps.moe_layouts.LocalDispatch` gathers
    them for the grouped GEMM: 24.0 of 48.0 MiB on a rank, measured on a widened micro-qwen3-moe at S 2; counted
    whole before). Shared experts are counted whole (not measured: the estimate stays an upper bound there)."""
    cfg = s.model
    head = cfg.vocab_size * cfg.hidden_size
    tied = cfg.tie_word_embeddings
    embedding = head if s.fused_loss or not tied else 0  # (a tied head without the fused loss: a matmul reads it)
    vocab = embedding + (head if s.fused_loss and not tied else 0)
    dense = sum(1 for i in range(cfg.num_hidden_layers) if not cfg.is_sparse_layer(i))
    return vocab / s.vocab_tp + dense * 2 * cfg.hidden_size * cfg.intermediate_size / s.tp + stage_experts(s)


def _half_copies(s: Setup, n: float, stage: int) -> float:
    """Elements of the half casts O1 keeps for backward on a rank holding `n` parameters of pipeline stage `stage`:
    autocast casts a weight each time a matmul reads it (Paddle's autocast keeps no cache of casts, unlike torch's)
    and the matmul keeps that cast for its backward. So every parameter the rank holds (the multi-token prediction
    modules' where they run) but those no matmul keeps: an untied embedding (looked up, as its last-stage copy for
    the MTP lookups is), a head the fused head + loss reads (its PyLayer, `ops.linear_loss`, keeps dh and dW, no
    cast) and the routed experts (`stage_experts`: their GEMMs, `ops.grouped_gemm_layer.StackedGemm`, keep the
    parameters and cast again in backward); plus, unfused, the head cast again by each MTP depth's head
    (`models.mtp.mtp_losses`); and the dense MLPs' and shared experts' gate and up weights (`packed_gate_up`: their
    GEMM, `ops.grouped_gemm_layer.PackedGemm`, keeps x and the two fp32 weights and casts again in backward), except
    under the semi-auto engine's ZeRO-3 (`zero3_keeps_packed`), whose matmul keeps the half cast of the gathered
    concatenation as the old path's did for every layout. Norms and routers are counted too (small: an upper bound)."""
    cfg = s.model
    table = cfg.vocab_size * cfg.hidden_size / s.vocab_tp  # the embedding's or the LM head's elements on this rank
    first, last, tied = stage == 0, stage == s.pp - 1, bool(cfg.tie_word_embeddings)
    looked_up = table if first and not (tied and s.pp == 1) else 0.0  # (tied, one process: it is the head too)
    if last and s.pp > 1 and not tied and cfg.num_nextn_predict_layers:
        looked_up += table  # the last stage's copy the MTP lookups read (`stage_params`)
    if last and s.fused_loss:
        looked_up += table
    mtp_heads = cfg.num_nextn_predict_layers * table if last and not s.fused_loss else 0.0
    packed = 0.0 if zero3_keeps_packed(s) else packed_gate_up(s, stage)
    return n - looked_up - stage_experts(s, stage) - packed + mtp_heads


def zero3_keeps_packed(s: Setup) -> bool:
    """Whether the dense MLPs' gate|up GEMM keeps its `[hidden, 2·inter/tp]` concatenation for backward: under the
    semi-auto engine's ZeRO-3 (`distributed.steps.local_kernels.localize`'s gate_up), where the weights it would keep
    instead are the gathered copies, as many bytes; every other layout runs `PackedGemm`, which keeps none."""
    return s.distributed_tensors and s.sharding_stage >= 3 and s.sharding_degree > 1


def packed_gate_up(s: Setup, stage: int = 0) -> float:
    """Elements of the gate and up weights of every dense SwiGLU MLP one rank of pipeline stage `stage` holds: a
    dense layer's (2·hidden·intermediate_size ÷ tp), a sparse layer's shared experts' (Qwen2-MoE's
    shared_expert_intermediate_size, DeepSeek's n_shared_experts · moe_intermediate_size), and on the last stage the
    multi-token prediction modules' layers' (`models.mtp`), each by the decoder's rule. Their concatenation is
    what the packed gate|up GEMM kept per layer and micro-batch (`zero3_keeps_packed`)."""
    cfg, e = s.model, experts(s.model)
    shared = (e.shared_width + e.ungated_width) if e else 0
    layers = stage_layers(cfg.num_hidden_layers, s.pp, s.vpp)[stage]
    if stage == s.pp - 1:
        layers += tuple(range(cfg.num_hidden_layers, cfg.num_hidden_layers + (cfg.num_nextn_predict_layers or 0)))
    width = sum(shared if cfg.is_sparse_layer(i) and e else cfg.intermediate_size for i in layers)
    return 2 * cfg.hidden_size * width / s.tp


def _parts(s: Setup, n: float, activations: float, logits: float, document: float,
           stage: int = 0) -> dict[str, float]:
    """The parts for `n` parameters on this device (of pipeline stage `stage`) and the given step memory."""
    o2 = s.amp_level == "O2"
    weight_b = s.compute_bytes if o2 else 4
    grad_b = 4 if (not o2 or s.master_grad) else s.compute_bytes
    deg = max(s.sharding_degree, 1) if s.sharding_stage else 1
    weights = n * weight_b / (deg if s.sharding_stage >= 3 else 1)
    if s.amp_level == "O1":  # autocast casts each matmul weight to half and keeps it for backward
        weights += _half_copies(s, n, stage) * s.compute_bytes
    # expert parallelism keeps its experts' optimizer state whole under ZeRO-1 (each rank updates its own:
    # `distributed.strategies.expert_strategy.ExpertZero1`); the rest is sharded over the sharding ranks
    own = stage_experts(s, stage) if s.ep > 1 else 0.0  # (this pipeline stage's only)
    state_n = (n - own) / (deg if s.sharding_stage >= 1 else 1) + own
    # ÷ S only where the gradients are reduce-scattered in backward (semi-auto on GPU; on CPU under ZeRO-3 only
    # some: `_cpu_zero3_sharded_grads`); fleet's stage2 (a pipeline's, sequence or context parallelism's)
    # accumulates whole gradients over the step and releases the unowned ones after the update
    gradients = n * grad_b / (deg if s.sharding_stage >= 2 and s.device == "gpu" and s.distributed_tensors else 1)
    if s.distributed_tensors and s.sharding_stage >= 3 and deg > 1 and s.device == "cpu":
        gradients -= _cpu_zero3_sharded_grads(s) * grad_b * (1 - 1 / deg)
    out = {
        "weights": weights,
        "gradients": gradients,
        "optimizer_state": state_n * 8,  # AdamW m and v, fp32
        "master_weights": state_n * 4 if o2 else 0.0,
        "activations": activations,
        "logits_loss": logits,
    }
    if s.dp_buffers and not s.sharding_stage:
        # DataParallel's buffers; under expert parallelism the rest's gradients coalesced into buckets, all at once
        # (fleet's fused all-reduce), the experts reduced in place over their own holders
        out["gradient_buffers"] = (n - own) * grad_b
    if s.cp > 1:
        out["context_attention"] = context_working_bytes(s)
    if s.distributed_tensors and s.sharding_stage == 3 and deg > 1:
        out["gathered_weights"] = _largest_weight(s) * weight_b
        if s.amp_level != "O1":  # each dense MLP's gathered gate|up concatenation, kept for backward (O1: its half
            out["gathered_weights"] += packed_gate_up(s, stage) * weight_b  # cast, in `_half_copies`)
    if s.distributed_tensors and s.vocab_parallel and s.device == "cpu":
        out["logits_loss"] += s.micro_batch * s.seq_len * s.model.vocab_size * 4  # the gathered fp32 logits
    if s.document_mask:
        out["document_mask"] = document
    if s.device == "cpu":
        out["framework"] = s.baseline_bytes
    else:
        out["framework"] = FRAMEWORK_GIB * GIB + FRAGMENTATION * sum(out.values())
    return out


def checkpoint_bytes(s: Setup) -> dict[str, float]:
    """One checkpoint-N on disk: weights in the training dtype, fp32 AdamW moments, fp32 master (O2), of every
    parameter trained: the multi-token prediction modules' too (the final export carries them as well)."""
    n = param_counts(s.model)["total"] + param_counts(s.model)["mtp"]
    o2 = s.amp_level == "O2"
    weights = n * (s.compute_bytes if o2 else 4)
    return {"weights": weights, "optimizer": 8.0 * n, "master_weights": 4.0 * n if o2 else 0.0}
