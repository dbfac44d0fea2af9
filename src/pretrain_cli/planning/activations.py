"""What one micro-batch's activations and loss keep on a device (the step-memory terms of `planning.memory`),
from the architecture and run shape alone, no Paddle. The terms count the tensors *our* model code keeps for
backward (models/layers.py, kernels.py, loss.py), not a textbook formula, because the CPU calibration
(docs/PLAN.md) checks them against the allocator of a real step: per token and layer by the part a recompute
granularity drops (`activation_parts`), the logits and loss (`logits_live_bytes`; the fused head + loss:
`fused_loss_bytes`), document masking's fields (`document_mask_bytes`). `s` is a `planning.memory.Setup`.
"""
from __future__ import annotations

from pretrain_cli.models.families import family
from pretrain_cli.ops.cpu_ops import attention_probs_per_head
from pretrain_cli.ops.linear_loss import chunk_rows
from pretrain_cli.planning.context import context_core_per_token
from pretrain_cli.planning.experts import backward_bytes, mlp_per_token


def norm_bytes(s, width: int) -> float:
    """RMSNorm keeps its input, the fp32 normalised copy and its output (fp32 stats either way)."""
    c, h = s.compute_bytes, width
    if s.fused_rms_norm:
        return 2 * c * h + 4  # input, output, rstd per token
    half = c != 4  # fp32 casts are aliases; half runs keep x32 and the cast-back copy
    return c * h + 4 * h + c * h + (4 * h + c * h if half else 0)


def head_width(cfg) -> int:
    """The head width the attention kernels see: head_dim, or under MLA (`models.mla`) max(qk_head_dim, v_head_dim),
    the one width its q, k and padded v share. What flash-attn's width rule judges (`config.compute.flash_width`)."""
    return max(cfg.qk_head_dim, cfg.v_head_dim) if cfg.mla else cfg.head_dim


def attention_widths(cfg) -> tuple[int, int]:
    """(query width, key/value width) per token in elements: heads × head_dim; under MLA (`models.mla`) every head
    expands its own key and value from the latent, padded to one head width (max(qk_head_dim, v_head_dim)) for the
    attention kernels, so K and V are as wide as Q: MLA's small latent is a KV-*cache* saving (generation),
    not a training-activation one."""
    if cfg.mla:
        width = cfg.num_attention_heads * head_width(cfg)
        return width, width
    return cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim


def _parts_per_token(s, sparse: bool = False) -> dict[str, float]:
    """Bytes kept per token by one decoder layer, dense or (`sparse`) a Mixture-of-Experts one, by the part of the
    layer that a recompute granularity drops.

    Tensor-parallel ranks hold 1/tp of the projections' outputs; norms and residuals stay whole, or with
    sequence parallelism 1/tp of them too (this rank's positions), except the norm's output the projections
    keep: all-gathered to the whole sequence (`sequence_parallel.functions`' enter).
    """
    cfg, c, tp = s.model, s.compute_bytes, s.tp
    h, kv = attention_widths(cfg)
    kv_rep = h if cfg.num_key_value_heads != cfg.num_attention_heads else kv  # GQA repeats K/V
    half = c != 4
    seq_tp = tp if s.sp else 1  # the ranks the norm and residual positions are split over
    whole = norm_bytes(s, cfg.hidden_size)
    norm = (whole - c * cfg.hidden_size) / seq_tp + c * cfg.hidden_size  # its output whole (gathered under SP)
    if cfg.mla:
        qkv, rotated, out = _mla_terms(s)
    else:
        qkv, rotated, out = c * (h + 2 * kv) / tp, (h + kv) / tp, c * h / tp
    if family(cfg.model_type).qk_norm:  # Qwen3: an RMSNorm over head_dim on q and on k (input counted in qkv)
        qkv += (norm_bytes(s, h) - c * h + norm_bytes(s, kv) - c * kv) / tp
    rope = 0.0 if s.fused_rope else (4 * rotated + (4 * rotated if half else 0))
    if s.cp > 1:  # distributed.steps.context replaces the attention kernel: `context_core_per_token`
        core, scores = context_core_per_token(s), 0.0
    elif s.attention == "flash" and s.device == "gpu":
        core = (c * (h + kv) + 4 * cfg.num_attention_heads) / tp  # q, k after RoPE + softmax lse
        scores = 0.0
    elif s.attention == "flash":
        # the CPU block-causal kernel: head-major q, k, v, and its fp32 probabilities for backward, only the keys
        # each 64-row query block multiplies (~s²/2 + 64·s per head: `attention_probs_per_head`)
        core = c * (h + 2 * kv) / tp
        scores = 4 * cfg.num_attention_heads * attention_probs_per_head(s.seq_len, s.seq_len) / s.seq_len / tp
    else:
        core = c * (2 * h + 2 * kv_rep) / tp  # qᵀ, q·scale, repeated kᵀ and vᵀ
        # [b, heads, s, s]: fp32 softmax output kept for backward, plus the probs cast to half.
        scores = (4 + (c if half else 0)) * cfg.num_attention_heads * s.seq_len / tp
    return {
        "input": c * cfg.hidden_size / seq_tp,  # the layer input, also the only thing `full` recompute keeps
        "attn_pre": norm - c * cfg.hidden_size / seq_tp + qkv + rope,
        "core": core + scores,
        "core_inputs": c * (h + kv) / tp,  # q, k after RoPE: kept instead of `core` under core_attn
        "attn_out": out,
        "mlp": norm + mlp_per_token(s, sparse),
    }


def _mla_terms(s) -> tuple[float, float, float]:
    """Multi-head latent attention's (`models.mla`) projection outputs and latents (bytes), the elements RoPE
    rotates, and the output projection's input (bytes), per token, counted at their own widths as the dense
    attention's are: q_b_proj's (or q_proj's) heads·qk_head_dim and kv_b_proj's heads·(qk_nope + v_head_dim)
    (÷ tp), the shared RoPE key (qk_rope_head_dim) and each latent's RMSNorm (its input, the kv_a / q_a output, counted
    there once), both whole under tp; RoPE rotates only each head's qk_rope_head_dim and the one shared key; o_proj
    reads heads·v_head_dim. The core's q, k and v are the padded one head width (`attention_widths`). Counting the
    padded width everywhere and the latents' norm inputs twice would plan 6.7 KB a token on the widened
    micro-deepseek-v3 against these terms' 5.5, beyond the norm, and 4.2 measured (docs/PLAN.md; Llama's terms at
    that shape: 7.2 planned, 5.1 measured)."""
    cfg, c, tp = s.model, s.compute_bytes, s.tp
    heads, rope = cfg.num_attention_heads, cfg.qk_rope_head_dim
    qkv = c * heads * (cfg.qk_head_dim + cfg.qk_nope_head_dim + cfg.v_head_dim) / tp
    qkv += c * rope + norm_bytes(s, cfg.kv_lora_rank) + (norm_bytes(s, cfg.q_lora_rank) if cfg.q_lora_rank else 0)
    return qkv, heads * rope / tp + rope, c * heads * cfg.v_head_dim / tp


def _granularity(s, p: dict) -> tuple[float, float]:
    """(kept through the forward, working set recomputed in backward) per token of a layer of parts `p`."""
    full_layer = p["input"] + p["attn_pre"] + p["core"] + p["attn_out"] + p["mlp"]
    if s.recompute is None:
        return full_layer, 0.0
    if s.recompute == "full":
        return p["input"], full_layer
    if s.recompute == "full_attn":
        return p["input"] + p["mlp"], p["attn_pre"] + p["core"] + p["attn_out"]
    if s.recompute == "core_attn":
        return full_layer - p["core"] + p["core_inputs"], p["core"]
    raise ValueError(f"unknown recompute granularity {s.recompute!r}")


def layer_bytes(s, layers) -> tuple[float, float]:
    """(kept through the forward, working set recomputed in backward) for one micro-batch of the decoder layers
    `layers` (indices: a pipeline stage's, `models.stages.stage_layers`): each layer's own, dense or sparse, summed,
    and the largest layer's working set, as one layer is recomputed at a time (a sparse layer's with what its
    experts' backward holds beyond it, `experts.backward_bytes`). Averaged over the model's layers
    before, a DeepSeek stage of dense layers was planned with the sparse layers' MLP terms and one of sparse layers
    with the dense ones' (`memory.pipeline_stages`)."""
    sparse = set(s.model.sparse_layers)  # (none for a dense model)
    tokens, kinds = s.micro_batch * s.seq_len, {}
    for i in layers:
        kinds[i in sparse] = kinds.get(i in sparse, 0) + 1
    parts = {kind: _granularity(s, _parts_per_token(s, kind)) for kind in kinds}
    kept = sum(n * parts[kind][0] for kind, n in kinds.items())
    working = (tokens * redo + (backward_bytes(s) if kind else 0.0) for kind, (_, redo) in parts.items())
    return tokens * kept, max(working, default=0.0)


def final_norm_bytes(s) -> float:
    """The final norm of one micro-batch (÷ tp under sequence parallelism; gathered after it for the loss)."""
    return s.micro_batch * s.seq_len * norm_bytes(s, s.model.hidden_size) / (s.tp if s.sp else 1)


def activation_parts(s) -> tuple[float, float]:
    """(kept through the forward, the largest layer's working set in backward: `layer_bytes`) for one micro-batch,
    every layer."""
    kept, redo = layer_bytes(s, range(s.model.num_hidden_layers))
    return kept + final_norm_bytes(s), redo


def activation_bytes(s) -> float:
    return sum(activation_parts(s)) + mtp_activation_bytes(s)  # kept + the recompute working set + the MTP modules'


def mtp_activation_bytes(s) -> float:
    """What the multi-token prediction modules keep for backward, per micro-batch: each depth's three norms (of the
    shifted tokens' embedding, of the previous depth's hidden states, the head's) less the second one's input (the
    main model's final norm output, or the previous depth's output, which its head's norm keeps: counted there;
    counted twice before, 0.25 MiB of micro-deepseek-v3's 13.2 MiB share in tests/unit/test_plan_calibration.py),
    the projection's concatenated input `[2·hidden]`, and one decoder layer whole (recompute wraps the decoder layers
    only, `models.recompute`): the module's own, `model.layers.{num_hidden_layers + k}`, sparse or dense by the
    decoder's rule (`ModelConfig.is_sparse_layer`; an average layer of the model before). Their head + loss:
    `mtp_head_bytes`."""
    cfg, c = s.model, s.compute_bytes
    if not cfg.num_nextn_predict_layers:
        return 0.0
    norms = 3 * norm_bytes(s, cfg.hidden_size) - c * cfg.hidden_size  # (hnorm's input counted where it is made)
    out = 0.0
    for k in range(cfg.num_nextn_predict_layers):
        p = _parts_per_token(s, cfg.is_sparse_layer(cfg.num_hidden_layers + k))
        out += norms + 2 * c * cfg.hidden_size + p["input"] + p["attn_pre"] + p["core"] + p["attn_out"] + p["mlp"]
    return s.micro_batch * s.seq_len * out


def mtp_head_bytes(s) -> float:
    """What each multi-token prediction depth's LM head + loss keeps until its backward beyond the main head's peak
    (`logits_live_bytes`): the fused path's dh and fp32 dW (what `fused_loss_bytes` keeps), or unfused the fp32
    softmax `[b·s, V]` its cross-entropy keeps for backward (÷ tp when the vocabulary is split). A depth's logits
    (and under half their fp32 copy) live only while its cross-entropy runs, as large as the main head's were at
    its peak, which `logits_live_bytes` already counts; so each depth adds one fp32 `[b·s, V]`, not a whole set of
    logits buffers (measured on CPU: docs/PLAN.md, DeepSeek-V2/V3)."""
    return s.model.num_nextn_predict_layers * _one_head_kept(s)


def _one_head_kept(s) -> float:
    """What one LM head + loss keeps from its forward to its backward: fused, dh and the fp32 dW; unfused, the fp32
    softmax `[b·s, V]` of its cross-entropy (÷ tp with a split vocabulary)."""
    cfg, tokens = s.model, s.micro_batch * s.seq_len
    if s.fused_loss:
        return 4 * cfg.vocab_size * cfg.hidden_size + tokens * cfg.hidden_size * s.compute_bytes
    return 4 * tokens * cfg.vocab_size / s.vocab_tp


def head_kept_bytes(s) -> float:
    """What a micro-batch's main and multi-token prediction heads + losses keep until its backward: what a pipeline's
    last stage holds for each further micro-batch whose loss has run and whose backward has not (the interleaved
    schedule's, `schedule.in_flight`), beside the one at its peak (`head_loss_bytes`)."""
    return (1 + s.model.num_nextn_predict_layers) * _one_head_kept(s)


def logits_bytes(s) -> float:
    """[b, s, V] logits in the compute dtype, the fp32 copy for the loss, the fp32 softmax/grad
    cross-entropy keeps, and (half runs) the gradient cast back; vocab-parallel under TP when it is split."""
    c = s.compute_bytes
    per = c + 4 + (4 + c if c != 4 else 0)
    return s.micro_batch * s.seq_len * s.model.vocab_size * per / s.vocab_tp


def fused_dw_buffers(s) -> int:
    """dW-sized fp32 buffers the fused head + loss's chunk loop (`ops.linear_loss._chunks`, Paddle's ops: the GPU
    path) holds at once: the first chunk's product becomes dW, and each later one lives beside it until it is added
    (and is unbound before the next is made). So min(chunks, 2): measured on CPU at llama-52m's head (V 32,000, 262
    rows a chunk): 1.0, 2.0, 2.0 and 2.0 heads above dh and a chunk of logits at 1, 2, 3 and 4 chunks
    (benchmarks/plan_phases.py --chunks; tests/unit/test_linear_loss_memory.py)."""
    rows = chunk_rows(s.model.vocab_size, s.device)
    return min(2, -(-s.micro_batch * s.seq_len // rows))


def fused_loss_bytes(s) -> float:
    """The fused LM head + loss (ops.linear_loss): no `[b, s, V]` logits. Kept from forward to backward: dh
    `[b·s, hidden]` and the head's fp32 dW; in the forward from its second chunk on one more dW-sized buffer
    (`fused_dw_buffers` counts both), and one chunk of fp32 logits `[rows, V]` (+ its half-precision original).
    Calibrated on CPU on the Paddle-op path, the GPU's (docs/PLAN.md)."""
    c, cfg = s.compute_bytes, s.model
    rows = min(chunk_rows(cfg.vocab_size, s.device), s.micro_batch * s.seq_len)
    chunk = rows * cfg.vocab_size * (4 + (c if c != 4 else 0))
    return (fused_dw_buffers(s) * 4 * cfg.vocab_size * cfg.hidden_size + s.micro_batch * s.seq_len * cfg.hidden_size * c
            + chunk)


def head_backward_bytes(s) -> float:
    """What the LM head's backward holds beside the activations: the weight's new gradient dW, whole (÷ tp where the
    vocabulary is split: `[hidden, V]` fp32, under O1 also its half original; O2 without master gradients in half),
    added to the gradient kept across steps only after its all-reduce; with, unfused, the logits' gradient it is
    computed from (`[b·s, V]`: the `grad` of `logits_live_bytes`) or, fused, dh (the dW it keeps is this one). On CPU
    over data ranks a second dW, the gloo all-reduce's result while dW lives (the semi-auto engine's hook,
    `comms.collectives.to_replicated`, measured; `paddle.DataParallel`'s fused all-reduce, whose gloo copy at that
    size was a 76.5 MiB transient: counted as this copy). Unfused, the logits' gradient is freed before that copy is
    made. A GPU reduces in place (NCCL under DataParallel) or into a 1/S shard (ZeRO-2's reduce-scatter; ZeRO-3's is
    within the gathered head `memory._largest_weight` counts): read from the code, not measured. At a few tokens a
    micro-batch this is the head's peak (measured at llama-52m, b 1 × s 64 unfused on 2 gloo ranks: ZeRO-2 140.2 MiB
    above what a rank holds between steps, 15.2 of it activations; planned 33.8 before, the plan 14.9 % under)."""
    cfg, c, tokens = s.model, s.compute_bytes, s.micro_batch * s.seq_len
    o2_half = s.amp_level == "O2" and not s.master_grad
    dw = cfg.vocab_size * cfg.hidden_size / s.vocab_tp * (c if o2_half else 4 + (c if s.amp_level == "O1" else 0))
    copy = dw if s.device == "cpu" and s.data_ranks > 1 else 0.0
    if s.device != "cpu" and s.distributed_tensors and s.sharding_stage == 2 and s.sharding_degree > 1:
        copy = dw / s.sharding_degree
    if s.fused_loss:
        return dw + tokens * cfg.hidden_size * c + copy
    grad = tokens * cfg.vocab_size * (4 + (c if c != 4 else 0)) / s.vocab_tp
    return dw + max(grad, copy)


def logits_live_bytes(s) -> float:
    """Logits/loss memory at the step's peak. Without recompute the end of the forward (all logits buffers live; the
    fused head + loss: `fused_loss_bytes`) or the head's backward (`head_backward_bytes`), the larger. With recompute
    (and a sparse layer's experts' backward, `experts.backward_bytes`: in the same working set), the first layer's
    re-forward runs after the logits are freed but while their gradient (fp32, plus the half cast)
    still is, so the working set reuses the rest; the head's backward runs before any recompute. Calibrated on CPU
    (docs/PLAN.md)."""
    _, redo = activation_parts(s)
    backward = head_backward_bytes(s) - redo
    if s.fused_loss:
        return max(fused_loss_bytes(s), backward)
    c = s.compute_bytes
    grad = s.micro_batch * s.seq_len * s.model.vocab_size * (4 + (c if c != 4 else 0)) / s.vocab_tp
    return max(logits_bytes(s) - redo, grad, backward)


def head_loss_bytes(s) -> float:
    """The `logits_loss` term of the device that holds the LM head (one process's, a pipeline's last stage's):
    the main head + loss at its peak and the multi-token prediction heads' (a pipeline runs the MTP modules in its
    last stage's loss, `distributed.steps.pipeline_stages.StageLoss`, beside the main head). `config.resolve`
    decides the GPU default of the fused head + loss by this same term, evaluated both ways, so `plan` and `train`
    make one choice."""
    return logits_live_bytes(s) + mtp_head_bytes(s)


def document_mask_bytes(s) -> float:
    """What `attention_mask_type: document` adds to a step: int64 doc_start (+ position_ids) per token; the
    per-token cos/sin rows the reference RoPE gathers once per forward; on the math path the fp32
    `[b, 1, s, s]` additive mask every layer shares; under flashmask int32 column bounds. The CPU kernel keeps
    no more fp32 probabilities than the causal one (the same buffer: its size bounds both blockings)."""
    if not s.document_mask:
        return 0.0
    tokens = s.micro_batch * s.seq_len
    out = tokens * 8 * (2 if s.reset_positions else 1)
    if s.reset_positions and not s.fused_rope:
        out += tokens * 2 * 4 * s.model.head_dim
    if s.attention == "math":
        out += 4 * s.micro_batch * s.seq_len * s.seq_len
    elif s.device == "gpu":
        out += 4 * tokens
    return float(out)
