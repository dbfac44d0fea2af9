"""The router losses of a Mixture-of-Experts model, the per-expert load a step reports, and the
auxiliary-loss-free bias update, all from the sparse blocks' `MoeRecord`s (`models.moe`).

- `load_balancing_loss`: transformers' `load_balancing_loss_func` exactly: over the router logits of all sparse
  layers taken together (not a mean of per-layer losses), `E · Σ_e f_e · P_e`, f_e = the share of top-k
  assignments that went to expert e, P_e = its mean softmax probability. At perfect balance it equals top_k.
  `reduce_counts` (the kernel table's, chosen by the layout before the model is built; identity on one process)
  sums the counts over the data-parallel ranks first: the "global" scope Qwen3 was trained with (Qiu et al. 2025).
- `z_loss`: ST-MoE's router z-loss, mean over tokens of logsumexp(logits)², averaged over the sparse layers.
- `router_loss(model)`: `aux_coef · load_balancing + z_coef · z`, what `CausalLM` adds per counted token to
  the loss it returns (so the training loss, like transformers' with `output_router_logits`, includes it).
- `Load`: each block accumulates its counts over the micro-batches of a step (`block.load`); `read_load` turns
  them into the busiest expert's share of assignments and the dropped share per layer (what one watches for
  routing collapse) and resets them; `update_expert_bias` applies DeepSeek-V3's / torchtitan's rule
  `bias += rate · sign(mean_count − count)` to every router that holds `e_score_correction_bias`. Shares are
  ratios, so a forward recomputed under activation recompute does not change them.
"""
from __future__ import annotations

import paddle


def _identity(t):
    return t


def sparse_blocks(model) -> list:
    """The `SparseMoeBlock`s of `model`, in layer order (none on a dense model)."""
    from pretrain_cli.models.moe import SparseMoeBlock

    return [m for m in model.sublayers() if isinstance(m, SparseMoeBlock)]


def load_balancing_loss(logits: list, num_experts: int, top_k: int, reduce_counts=_identity):
    """HF's load-balancing loss over the router logits `[tokens, experts]` of every sparse layer (fp32 scalar)."""
    counts = paddle.zeros([num_experts], dtype="float32")
    prob_sum = paddle.zeros([num_experts], dtype="float32")
    rows = 0
    for layer_logits in logits:
        probs = paddle.nn.functional.softmax(layer_logits.astype("float32"), axis=-1)  # [tokens, experts]
        _, chosen = paddle.topk(probs, top_k, axis=-1)  # [tokens, top_k]
        counts = counts + paddle.bincount(chosen.reshape([-1]), minlength=num_experts).astype("float32")
        prob_sum = prob_sum + probs.sum(axis=0)
        rows += probs.shape[0]
    global_counts = reduce_counts(counts.detach())
    share = global_counts / paddle.clip(global_counts.sum() / top_k, min=1.0)  # [experts]: f_e
    return (share * (prob_sum / max(rows, 1))).sum() * num_experts


def z_loss(logits: list):
    """Mean over tokens of logsumexp(router logits)², averaged over the sparse layers."""
    per_layer = [paddle.square(paddle.logsumexp(l.astype("float32"), axis=-1)).mean() for l in logits]
    return (paddle.add_n(per_layer) / len(per_layer)).reshape([])  # [] (batch-sharded logits' SPMD mean gives [1])


def router_loss(model):
    """The weighted router losses of `model`'s last forward (fp32 scalar; 0 when both weights are 0). The
    unweighted values are summed into `model.router_losses` ({name: (sum, forwards)}) for the log line."""
    blocks = sparse_blocks(model)
    cfg, moe = model.config, model.moe
    deepseek = hasattr(blocks[0], "balance_loss")  # its sequence-wise balance loss instead (models.deepseek_moe)
    coef = moe.aux_loss_coef  # decided in config (`config.moe.aux_coefficient`); None: what transformers computes
    if coef is None:
        coef = 0.0 if deepseek else cfg.router_aux_loss_coef
    logits = [b.record.routing.logits for b in blocks]
    total = paddle.zeros([], dtype="float32")
    parts = {}
    if deepseek and coef:
        # reshaped 0-D: on the semi-auto engine the sum of the layers' losses (each a mean over a batch-sharded
        # tensor, Partial) comes back as shape [1], which would make the step's loss [1]
        parts["aux_loss"] = paddle.add_n([b.balance_loss() for b in blocks]).reshape([])
        total = total + coef * parts["aux_loss"]
    elif coef:
        reduce = model.kernels.reduce_counts if moe.aux_loss_scope == "global" else None
        parts["aux_loss"] = load_balancing_loss(logits, cfg.num_experts, cfg.num_experts_per_tok, reduce or _identity)
        total = total + coef * parts["aux_loss"]
    if moe.z_loss_coef:
        parts["z_loss"] = z_loss(logits)
        total = total + moe.z_loss_coef * parts["z_loss"]
    for name, value in parts.items():
        add_logged(model.router_losses, name, value)
    return total


def add_logged(sums: dict, name: str, value) -> None:
    """`value` (a scalar tensor) added to `sums[name]` = (sum, count): what `log_values` averages."""
    s, n = sums.get(name, (0.0, 0))
    sums[name] = (value.detach() + s, n + 1)


def log_values(model) -> dict:
    """What a log line and metrics.jsonl record of a MoE model since the last call: the mean router losses
    (unweighted), the busiest expert's share of its layer's assignments (the maximum over layers, and per layer),
    the dropped share; then resets. {} for a dense model."""
    out = {name: float(s) / max(n, 1) for name, (s, n) in model.router_losses.items()}
    model.router_losses.clear()
    load = read_load(model)
    if not load:  # a dense model; or a pipeline's stage without sparse layers (its MTP loss: the last stage's)
        return out
    out["moe_max_expert_share"] = max(load["max_expert_share"])
    out["moe_dropped_share"] = sum(load["dropped_share"]) / len(load["dropped_share"])
    out["moe_expert_share_per_layer"] = [round(x, 4) for x in load["max_expert_share"]]
    if out["moe_dropped_share"]:
        out["moe_dropped_share_per_layer"] = [round(x, 4) for x in load["dropped_share"]]
    return out


def read_load(model, reset: bool = True) -> dict:
    """{"max_expert_share": [per sparse layer], "dropped_share": [per sparse layer]} of the assignments since the
    last reset (one host read for all layers); empty on a dense model."""
    blocks = [b for b in sparse_blocks(model) if b.load is not None]
    if not blocks:
        return {}
    counts = paddle.stack([b.load for b in blocks])  # [layers, experts]
    dropped = paddle.stack([b.dropped for b in blocks])  # [layers]
    stats = paddle.concat([counts, dropped.unsqueeze(-1)], axis=-1).numpy()  # [layers, experts+1]
    c, d = stats[:, :-1], stats[:, -1]
    assigned = c.sum(axis=-1) + d  # [layers]
    out = {"max_expert_share": [float(m / max(s, 1e-9)) for m, s in zip(c.max(axis=-1), c.sum(axis=-1))],
           "dropped_share": [float(x / max(a, 1e-9)) for x, a in zip(d, assigned)]}
    if reset:
        for b in blocks:
            b.reset_load()
    return out


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
