"""The router losses of a Mixture-of-Experts model, the per-expert load a step reports, and the
auxiliary-loss-free bias update, all from the sparse blocks' `MoeRecord`s (`models.moe`).

- `load_balancing_loss`: transformers' `load_balancing_loss_func` exactly: over the router logits of all sparse
  layers taken together (not a mean of per-layer losses), `E · Σ_e f_e · P_e`, f_e = the share of top-k
  assignments that went to expert e, P_e = its mean softmax probability. At perfect balance it equals top_k.
  `reduce_counts` (the kernel table's, chosen by the layout before the model is built; identity on one process)
  sums the counts over the data-parallel ranks first: the "global" scope Qwen3 was trained with (Qiu et al. 2025).
- `z_loss`: ST-MoE's router z-loss, mean over tokens of logsumexp(logits)², averaged over the sparse layers; logged
  whenever a router term is on, at weight 0 too (without gradient), so its growth is seen before it is weighted.
- `router_loss(model)`: `aux_coef · load_balancing + z_coef · z`, what `CausalLM` adds per counted token to
  the loss it returns (so the training loss, like transformers' with `output_router_logits`, includes it).
  Under context parallelism each rank routes its own chunks of the sequences; the sums over tokens are taken over
  the cp group (the kernel table's `sequence_sums`, with their gradient), so every cp rank forms one process's loss.
  Every term is formed from `RouterSums` (sums over the layers, each layer's from `layer_sums`), so a pipeline's
  stages add their layers' sums to the ones carried with the hidden states and the last stage forms the same
  losses (`router_loss(model, carried, blocks)`; `distributed.steps.pipeline_stages`).
- `Load`: each block accumulates its counts over the micro-batches of a step (`block.load`); `load_rows` reads
  and resets them, `shares` turns them into the busiest expert's share of assignments and the dropped share per
  layer (what one watches for routing collapse; a pipeline gathers every stage's rows first);
  `update_expert_bias` applies DeepSeek-V3's / torchtitan's rule `bias += rate · sign(mean_count − count)` to
  every router that holds `e_score_correction_bias` (a pipeline stage: its own layers', their counts summed over
  its data ranks). Shares are ratios, so a forward recomputed under activation recompute does not change them.
"""
from __future__ import annotations

from typing import NamedTuple

import paddle


def _identity(t):
    return t


def sparse_blocks(model) -> list:
    """The `SparseMoeBlock`s of `model`, in layer order (none on a dense model)."""
    from pretrain_cli.models.moe import SparseMoeBlock

    return [m for m in model.sublayers() if isinstance(m, SparseMoeBlock)]


class RouterTerms(NamedTuple):
    """Which router losses a model's training adds, with their weights (`router_terms`)."""

    balance: str  # "transformers" (HF's load-balancing loss), "sequence" (DeepSeek's sequence-wise loss) or ""
    aux_coef: float
    z_coef: float
    experts: int = 0  # the routed experts
    top_k: int = 0

    @property
    def on(self) -> bool:
        return bool(self.balance or self.z_coef)


class RouterSums(NamedTuple):
    """The router losses' sums over the sparse layers run so far (None: that term is off, or no layer yet): what one
    process adds up over all its layers, and what a pipeline carries with the hidden states from stage to stage
    (`distributed.steps.pipeline_stages.RouterStream`) for the last stage to finish. Every term is a sum over
    layers, so the sums of the stages' layers, added in layer order, are one process's bit for bit; transformers'
    balance loss is not a sum of per-layer losses (its f_e and P_e are means over layers × tokens), which is why the
    sums travel rather than each stage's share of a loss."""

    prob_sum: object = None  # [experts] fp32, with gradient: softmax probabilities summed over tokens and layers
    counts: object = None  # [experts] fp32, no gradient: top-k choices among those probabilities (f_e unnormalised)
    z_sum: object = None  # [] fp32: Σ over layers of the mean over tokens of logsumexp(logits)²
    seq_sum: object = None  # [] fp32: Σ over layers of DeepSeek's sequence-wise balance loss
    layers: int = 0
    rows: int = 0  # Σ over layers of the tokens routed: P_e's denominator


def add_sums(a: RouterSums, b: RouterSums) -> RouterSums:
    """The sums of both. Read by unpacking and position only: to_static's SOT hands a NamedTuple it built back as a
    plain tuple (and crashed on a dataclass here). Tensors are added by `add_n` (one rounding, as `+`): on the
    semi-auto engine `+` of two batch-sharded (Partial) 0-D means came back as shape [1]."""
    return RouterSums(*(y if x is None else x if y is None else _add(x, y) for x, y in zip(a, b)))


def _add(x, y):
    return paddle.add_n([x, y]) if isinstance(x, paddle.Tensor) else x + y


def router_terms(model) -> RouterTerms:
    """The router terms `model`'s training adds: the balance loss by the model's blocks (DeepSeek's have their
    sequence-wise one, `models.deepseek_moe`) and its weight, the z-loss's weight."""
    blocks = sparse_blocks(model)
    deepseek = bool(blocks) and hasattr(blocks[0], "balance_loss")
    coef = model.moe.aux_loss_coef  # decided in config (`config.moe.aux_coefficient`); None: what transformers does
    if coef is None:
        coef = 0.0 if deepseek else model.config.router_aux_loss_coef
    balance = ("sequence" if deepseek else "transformers") if coef and blocks else ""
    z = float(model.moe.z_loss_coef or 0.0) if blocks else 0.0
    return RouterTerms(balance, float(coef or 0.0), z, model.config.num_experts, model.config.num_experts_per_tok)


def _balance_sums(layer_logits, num_experts: int, top_k: int):
    """One layer's (softmax probabilities summed over its tokens `[experts]`, top-k choice counts `[experts]`). The
    counts stay on the device (`moe.expert_counts`): nothing here reads them on the host."""
    from pretrain_cli.models.moe import expert_counts

    probs = paddle.nn.functional.softmax(layer_logits.astype("float32"), axis=-1)  # [tokens, experts]
    _, chosen = paddle.topk(probs, top_k, axis=-1)  # [tokens, top_k]
    counts = expert_counts(chosen.reshape([-1]), num_experts).astype("float32")  # [experts]
    return probs.sum(axis=0), counts


def _z(layer_logits):
    return paddle.square(paddle.logsumexp(layer_logits.astype("float32"), axis=-1)).mean()


def layer_sums(block, terms: RouterTerms) -> RouterSums:
    """One sparse block's contribution to the sums, from its last forward (`block.record`)."""
    logits = block.record.routing.logits  # [tokens, experts]
    prob_sum = counts = z = seq = None
    if terms.balance == "transformers":
        prob_sum, counts = _balance_sums(logits, terms.experts, terms.top_k)
    elif terms.balance == "sequence":
        seq = block.balance_loss()
    if terms.on:  # at weight 0 for the log alone: no gradient, so the loss optimised is what it was
        z = _z(logits) if terms.z_coef else _z(logits.detach())
    return RouterSums(prob_sum, counts, z, seq, 1, logits.shape[0])


def balance_from(prob_sum, counts, rows: int, num_experts: int, top_k: int, reduce_counts=_identity):
    """transformers' `E · Σ_e f_e · P_e` from the sums over layers and tokens (fp32 scalar)."""
    counts = counts.detach()
    # a DistTensor's counts (the semi-auto engine: ZeRO-2/3) are the global batch's already; summing them again
    # over the ranks would count each token world times (and gloo's all_reduce cannot take one)
    global_counts = counts if counts.is_dist() else reduce_counts(counts)
    share = global_counts / paddle.clip(global_counts.sum() / top_k, min=1.0)  # [experts]: f_e
    return (share * (prob_sum / max(rows, 1))).sum() * num_experts


def load_balancing_loss(logits: list, num_experts: int, top_k: int, reduce_counts=_identity):
    """HF's load-balancing loss over the router logits `[tokens, experts]` of every sparse layer (fp32 scalar)."""
    sums = RouterSums()
    for layer_logits in logits:
        prob_sum, counts = _balance_sums(layer_logits, num_experts, top_k)
        sums = add_sums(sums, RouterSums(prob_sum, counts, layers=1, rows=layer_logits.shape[0]))
    prob_sum, counts, _, _, _, rows = sums
    return balance_from(prob_sum, counts, rows, num_experts, top_k, reduce_counts)


def z_loss(logits: list):
    """Mean over tokens of logsumexp(router logits)², averaged over the sparse layers."""
    total = None
    for layer_logits in logits:
        total = _z(layer_logits) if total is None else total + _z(layer_logits)
    return (total / len(logits)).reshape([])  # [] (batch-sharded logits' SPMD mean gives [1])


def router_loss(model, carried: RouterSums | None = None, blocks: list | None = None):
    """The weighted router losses of `model`'s last forward (fp32 scalar; 0 when both weights are 0): the sums of
    `blocks` (default: every sparse block) added to `carried` (a pipeline's earlier layers, `RouterSums`). The
    unweighted values are summed into `model.router_losses` ({name: (sum, forwards)}) for the log line."""
    terms = router_terms(model)
    sums = carried or RouterSums()
    for b in sparse_blocks(model) if blocks is None else blocks:
        sums = add_sums(sums, layer_sums(b, terms))
    prob_sum, counts, z_sum, seq_sum, layers, rows = sums
    split = model.kernels.sequence_sums  # context parallelism: the other chunks of these sequences on the cp group
    total = paddle.zeros([], dtype="float32")
    parts = {}
    if terms.balance == "sequence":
        # reshaped 0-D: on the semi-auto engine the sum of the layers' losses (each a mean over a batch-sharded
        # tensor, Partial) comes back as shape [1], which would make the step's loss [1]; under cp each rank's
        # layers gave its tokens' part of every sequence's loss (`deepseek_moe.sequence_balance_loss`)
        parts["aux_loss"] = (seq_sum if split is None else split.sum(seq_sum)).reshape([])
    elif terms.balance:
        reduce = model.kernels.reduce_counts if model.moe.aux_loss_scope == "global" else None
        if split is not None:  # the micro-batch is the cp group's chunks: P_e over all of its tokens
            prob_sum, rows = split.sum(prob_sum), rows * split.ranks
            # (the global scope's `reduce_counts` sums over every rank, the cp ranks among them)
            reduce = reduce or split.counts
        parts["aux_loss"] = balance_from(prob_sum, counts, rows, terms.experts, terms.top_k, reduce or _identity)
    if "aux_loss" in parts:
        total = total + terms.aux_coef * parts["aux_loss"]
    if z_sum is not None:  # (logged at weight 0 too: `layer_sums`)
        # under cp each rank's layers took the mean over its S / C tokens of each sequence: their mean is the whole's
        z = z_sum if split is None else split.sum(z_sum) / split.ranks
        parts["z_loss"] = (z / layers).reshape([])
    if terms.z_coef:
        total = total + terms.z_coef * parts["z_loss"]
    for name, value in parts.items():
        add_logged(model.router_losses, name, value)
    return total


def add_lm_loss(model, total, count) -> None:
    """A training forward's language-model loss, the mean over its counted tokens of `total` (the sum `loss_sum`
    gives: what `eval_loss` measures), logged apart as `lm_loss` where training adds terms to it (the router losses,
    DeepSeek-V3's multi-token prediction): the logged `loss` is the loss optimized, above the eval curve by those
    terms, and the loss curve draws both (`training.plot`). One function for one process (`CausalLM.forward`) and a
    pipeline's last stage (`distributed.steps.pipeline_stages.StageLoss`)."""
    if model.mtp_depth or router_terms(model).on:
        add_logged(model.router_losses, "lm_loss",
                   total.detach().astype("float32") / paddle.clip(count.detach().astype("float32"), min=1.0))


def add_logged(sums: dict, name: str, value) -> None:
    """`value` (a scalar tensor) added to `sums[name]` = (sum, count): what `log_values` averages."""
    s, n = sums.get(name, (0.0, 0))
    sums[name] = (value.detach() + s, n + 1)


def log_values(model, strategy=None) -> dict:
    """What a log line and metrics.jsonl record of a MoE model or one with MTP modules since the last call: the mean
    router, MTP and LM losses (unweighted), and with experts the busiest expert's share of its layer's assignments
    (the maximum over layers, and per layer), the dropped share; then resets. {} for a dense model without MTP.
    `strategy` (the layout's; a pipeline's stages hold other layers, its last stage computes the losses):
    `share_logged` makes the sums one process's, `whole_model_rows` this rank's `load_rows` every sparse layer's, in
    layer order. A model without a sparse block (a dense model with MTP modules) has no expert load to gather: asked
    anyway, the layout all-reduced an empty array, which gloo refuses (`opts.elements > 0`) at the first log line.
    Every rank holds the whole model's blocks (a pipeline stage too, the other stages' without storage), so every
    rank takes the same branch."""
    if strategy is not None:
        strategy.share_logged(model.router_losses)
    out = {name: float(s) / max(n, 1) for name, (s, n) in model.router_losses.items()}
    model.router_losses.clear()
    if not sparse_blocks(model):  # no experts: no load rows, and no collective for them
        return out
    rows = load_rows(model)
    if strategy is not None:
        rows = strategy.whole_model_rows(rows)
    load = shares(rows)
    if not load:  # nothing counted since the last reset
        return out
    out["moe_max_expert_share"] = max(load["max_expert_share"])
    out["moe_dropped_share"] = sum(load["dropped_share"]) / len(load["dropped_share"])
    out["moe_expert_share_per_layer"] = [round(x, 4) for x in load["max_expert_share"]]
    if out["moe_dropped_share"]:
        out["moe_dropped_share_per_layer"] = [round(x, 4) for x in load["dropped_share"]]
    return out


def load_rows(model, reset: bool = True):
    """fp32 numpy `[sparse layers, experts + 1]`: each sparse layer's assignments per expert since the last reset,
    then its dropped ones (one host read for all layers); `[0, experts + 1]` when none counted (a dense model, a
    pipeline stage without sparse layers)."""
    import numpy as np

    blocks = [b for b in sparse_blocks(model) if b.load is not None]
    if not blocks:
        return np.zeros([0, int(getattr(model.config, "num_experts", 0) or 0) + 1], dtype="float32")
    counts = paddle.stack([b.load for b in blocks])  # [layers, experts]
    dropped = paddle.stack([b.dropped for b in blocks])  # [layers]
    stats = paddle.concat([counts, dropped.unsqueeze(-1)], axis=-1).numpy()  # [layers, experts+1]
    if reset:
        for b in blocks:
            b.reset_load()
    return stats


def shares(rows) -> dict:
    """{"max_expert_share": [per sparse layer], "dropped_share": [per sparse layer]} of `load_rows`; {} for none."""
    if not len(rows):
        return {}
    c, d = rows[:, :-1], rows[:, -1]
    assigned = c.sum(axis=-1) + d  # [layers]
    return {"max_expert_share": [float(m / max(s, 1e-9)) for m, s in zip(c.max(axis=-1), c.sum(axis=-1))],
            "dropped_share": [float(x / max(a, 1e-9)) for x, a in zip(d, assigned)]}


def read_load(model, reset: bool = True) -> dict:
    """`shares` of the assignments since the last reset; empty on a dense model."""
    return shares(load_rows(model, reset))


def forget_step_load(model) -> None:
    """Drop the counts since the last bias update: a step starts from its own tokens only, not those of a step
    whose update was skipped (spike, non-finite, fp16 overflow)."""
    for b in sparse_blocks(model):
        b.step_load = None


def update_expert_bias(model, rate: float, reduce_counts=_identity) -> None:
    """Auxiliary-loss-free balancing: each router bias moves by `rate` toward the experts below the mean load
    (`sign(mean − count)`, counts of the step summed over the data-parallel ranks by `reduce_counts`)."""
    with paddle.no_grad():
        for b in sparse_blocks(model):
            bias = b.gate.e_score_correction_bias
            if bias is None or b.step_load is None:
                continue
            counts = reduce_counts(b.step_load)
            bias.set_value(bias + rate * paddle.sign(counts.mean() - counts))
            b.step_load = None
