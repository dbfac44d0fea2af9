"""The evaluation's peak on a device: `train` evaluates between optimizer steps (do_eval, and the test split at the
end under do_predict: `training.evaluation.loss_sum`), a forward under `paddle.no_grad` over batches of
`per_device_eval_batch_size` samples, its own batch, not the training micro-batch. A plan whose training step fits
can still run out of memory at the first evaluation: `plan --fit` lowers the micro-batch to 1 to fit, and the file's
eval batch of 8 stays (Qwen3-30B-A3B at 4,096 tokens on 8 H100: 70.81 GiB a step, and the eval's logits alone
8 x 4096 x 151,936 x 10 bytes), so the eval's peak is planned on its own.

What an evaluation holds: what the training step leaves allocated between steps (weights, the gradients kept
across steps, AdamW state, master weights, DataParallel's buffers, ZeRO-3's gathered weight), without O1's half casts
(kept for a backward, none runs), plus the forward's working set, one decoder layer at a time (nothing is kept for
a backward: a layer's tensors, all of them at once, are an upper bound of what it holds) or the LM head + loss after
the last (without gradients the fused head + loss holds one chunk of logits, `ops.linear_loss._apply`; unfused the
`[b, s, V]` logits in the compute dtype, their fp32 copy and cross-entropy's fp32 softmax). A pipeline runs one eval
batch through its stages (config.resolve's note): each stage's own parameters and layers, the head on the last.
Measured on CPU against Paddle's allocator (benchmarks/plan_eval_memory.py, tests/unit/test_plan_eval_calibration.py):
+0.3 %, +4.1 % and +22.4 % over the measured peak (an upper bound: a layer's tensors are all counted at once).
"""
from __future__ import annotations

import dataclasses

from pretrain_cli.models.stages import stage_layers
from pretrain_cli.ops.linear_loss import chunk_rows
from pretrain_cli.planning.activations import document_mask_bytes, final_norm_bytes, layer_bytes
from pretrain_cli.planning.memory import (FRAGMENTATION, FRAMEWORK_GIB, GIB, Setup, _device_params, _half_copies,
                                          stage_params)

# what the training step leaves allocated between steps (`memory._parts`' names)
HELD = ("weights", "gradients", "optimizer_state", "master_weights", "gradient_buffers", "gathered_weights",
        "context_attention")


def head_forward_bytes(e: Setup) -> float:
    """The LM head + loss of one eval batch without gradients: fused, one chunk of fp32 logits `[rows, V]` (+ its
    half original); unfused, the logits in the compute dtype, their fp32 copy (half runs) and the fp32 softmax
    cross-entropy returns, `[b·s, V]` each (÷ tp where the vocabulary is split). Measured on CPU
    (benchmarks/plan_eval_memory.py: fp32, Paddle's ops): llama-52m's eval of 8 x 256 tokens 842.6 MiB fused,
    planned 877.1; unfused 1,278.6, planned 1,282.1 (1,532 with the fp32 logits counted as their own copy)."""
    c, vocab, tokens = e.compute_bytes, e.model.vocab_size, e.micro_batch * e.seq_len
    if e.fused_loss:
        return min(chunk_rows(vocab, e.device), tokens) * vocab * (4 + (c if c != 4 else 0))
    return tokens * vocab * (c + 4 + (4 if c != 4 else 0)) / e.vocab_tp  # (fp32 logits are their own fp32 copy)


def forward_bytes(e: Setup, stage: int = 0, by_kind: dict | None = None) -> float:
    """The eval forward's working set on pipeline stage `stage` (one stage: the model): its largest decoder layer's
    tensors for the eval batch (`layer_bytes` without recompute: all a layer would keep), or on the last stage the
    final norm and the head + loss, whichever is more; with document masking its fields. `by_kind`: {sparse: a
    layer's bytes} kept across the stages of one `e` (a layer's depend on its kind only)."""
    cfg = e.model
    layers = stage_layers(cfg.num_hidden_layers, e.pp, e.vpp)[stage]
    sparse = set(cfg.sparse_layers)
    kinds = {i in sparse: i for i in layers}  # one layer of each kind the stage runs
    by_kind = {} if by_kind is None else by_kind
    for kind, i in kinds.items():
        if kind not in by_kind:
            by_kind[kind] = layer_bytes(e, (i,))[0]
    layer = max((by_kind[kind] for kind in kinds), default=0.0)
    head = final_norm_bytes(e) + head_forward_bytes(e) if stage == e.pp - 1 else 0.0
    return max(layer, head) + document_mask_bytes(e)


def eval_parts(s: Setup, eval_batch: int, stages: list[dict]) -> dict[str, float]:
    """Name → bytes of the evaluation's peak on the fullest stage (`stages`: the training plan's parts per pipeline
    stage, `memory.pipeline_stages`, or [`memory.estimate`] for one): "held" between steps, the eval batch's
    "forward" and the "framework" (on a GPU the CUDA context and the allocator's fragmentation of the rest)."""
    # (evaluation is dropless: `models.moe.SparseMoeBlock` computes every assignment outside training)
    e = dataclasses.replace(s, micro_batch=eval_batch, recompute=None, micro_batches=1, capacity_factor=0.0)
    out, by_kind = [], {}
    for stage, parts in enumerate(stages):
        held = sum(parts.get(k, 0.0) for k in HELD)
        if s.amp_level == "O1":  # autocast's half casts live from a forward to its backward: no backward here
            n = stage_params(s, stage) if s.pp > 1 else _device_params(s)
            held -= _half_copies(s, n, stage) * s.compute_bytes
        step = {"held": held, "forward": forward_bytes(e, stage, by_kind)}
        step["framework"] = (s.baseline_bytes if s.device == "cpu"
                             else FRAMEWORK_GIB * GIB + FRAGMENTATION * sum(step.values()))
        out.append(step)
    return max(out, key=lambda parts: sum(parts.values()))


def eval_gib(s: Setup, eval_batch: int, stages: list[dict]) -> float:
    return sum(eval_parts(s, eval_batch, stages).values()) / GIB
