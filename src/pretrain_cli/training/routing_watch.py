"""The routing-collapse warning: a MoE layer whose busiest expert takes nearly every token's choice.

Each log line carries each sparse layer's busiest-expert share of its assignments (`models.moe_loss.log_values`):
1/experts at balance, 1/top_k when every token's top-k includes the same expert. A layer at `NEAR` x 1/top_k or
more for `INTERVALS` log intervals in a row, both ending after step `WARMUPS` x warmup_steps, is warned of once in
the run's process: its layer (as transformers names it, `model.layers.N.mlp`), its share and the two balancing keys
to try.
Why not before: a router trained from scratch sends nearly every token to the same experts while the learning rate
warms up and for a while at its peak, whatever the balancing, and spreads them again. The shipped
configs/qwen3-moe-tiny_cpu.json (warm-up 20) does in every run: three of its four layers at 0.24-0.25 of 0.25 by step
10-25, all back under 0.225 by step 70 with `moe_router_bias_update_rate` 0.001 and by step 85 without (logged every
5 steps); a warning every run of the shipped example gives is one a user learns to ignore. A collapse still there
after twice the warm-up is warned of, and one that comes later.
Why two intervals: one interval's share can be a swing the balance loss or the routing bias pulls back by the next,
and a warning that comes and goes is ignored; two in a row is a collapse that stayed for `2 x logging_steps` steps.
Why 0.9 of 1/top_k: a share under it is an imbalanced layer still spreading its tokens (0.19 in docs/MOE.md's runs);
over it nine tokens in ten pick the one expert.
The count restarts in a resumed process, which warns again of a layer still collapsed: accepted, as that run's log
may be the only one read, and the layer is still to be mended. Under several ranks each rank warns once, at the same
step (the shares are gathered over the ranks), in its own log: its workerlog.N, and the launcher's console shows
only local rank 0's; the `routing_collapse` record is rank 0's alone (the one metrics.jsonl writer).
"""
from __future__ import annotations

NEAR = 0.9  # of 1/top_k
INTERVALS = 2  # log intervals in a row
WARMUPS = 2  # intervals ending at or before WARMUPS x warmup_steps are not judged
SECTION = 'docs/MOE.md, "The routing-collapse warning"'


class CollapseWatch:
    """Counts each sparse layer's log intervals in a row near 1/top_k; `see` returns the layers to warn of now."""

    def __init__(self, experts: int, top_k: int, layers: list[int] | None = None, warmup_steps: float = 0,
                 decoder_layers: int | None = None):
        """`layers`: the model's layer index of each sparse layer, in the order the shares come (none: their
        order among the sparse layers, said as such); `decoder_layers`: num_hidden_layers (the layers from it on are
        the MTP modules')."""
        # with as many experts as choices every expert takes 1/top_k: that is balance, not collapse
        self.bar = NEAR / top_k if 0 < top_k < experts else None
        self.experts, self.top_k, self.layers, self.decoder_layers = experts, top_k, layers, decoder_layers
        self.from_step = WARMUPS * warmup_steps
        self.named = True  # the shares' count matched `layers`
        self.in_a_row: dict[int, int] = {}
        self.warned: set[int] = set()

    def see(self, per_layer: list[float], step: int) -> list[tuple[int, float]]:
        """(layer, share) of each layer that has just stayed near 1/top_k for `INTERVALS` intervals ending at
        `step`; the layer is the model's index, or with `layers` unknown or not matching, the sparse layers' count
        (`name` says which)."""
        if self.bar is None:
            return []
        self.named = self.layers is not None and len(self.layers) == len(per_layer)
        out = []
        for i, share in enumerate(per_layer):
            layer = self.layers[i] if self.named else i
            judged = step > self.from_step and share >= self.bar
            self.in_a_row[layer] = self.in_a_row.get(layer, 0) + 1 if judged else 0
            if self.in_a_row[layer] >= INTERVALS and layer not in self.warned:
                self.warned.add(layer)
                out.append((layer, share))
        return out

    def name(self, layer: int) -> str:
        """The layer as a user finds it: transformers' module name (the MTP module's layer said so)."""
        if not self.named:
            return f"the MoE block of sparse layer {layer} (counted among the sparse layers)"
        mtp = " (the MTP module's)" if self.decoder_layers is not None and layer >= self.decoder_layers else ""
        return f"model.layers.{layer}.mlp{mtp}"

    def message(self, step: int, layer: int, share: float, bias_rate: float, aux_coef: float) -> str:
        """The warning's one line: what happened and what to try, by the balancing in effect."""
        bias = (f"raise moe_router_bias_update_rate (now {bias_rate:g})" if bias_rate else
                "set moe_router_bias_update_rate 0.001")
        return (f"step {step}: {self.name(layer)} routes nearly every token to one expert: its busiest expert's "
                f"share {share:.4f} for {INTERVALS} log intervals in a row (1/top_k = {1 / self.top_k:.4g}, "
                f"balanced {1 / self.experts:.4g}); {bias}, or a larger router_aux_loss_coef (now {aux_coef:g}); "
                f"{SECTION}")
