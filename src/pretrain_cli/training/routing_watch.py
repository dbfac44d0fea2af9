"""The routing-collapse warning: a MoE layer whose busiest expert takes nearly every token's choice.

Each log line carries each sparse layer's busiest-expert share of its assignments (`models.moe_loss.log_values`):
1/experts at balance, 1/top_k when every token's top-k includes the same expert. A layer at `NEAR` x 1/top_k or
more for `INTERVALS` log intervals in a row is warned of once in the run's process: its layer, its share and the
two balancing keys to try. Why two intervals: one interval's share can be a swing the balance loss or the routing
bias pulls back by the next (early in training the router moves with the learning rate's warm-up), and a warning
that comes and goes is ignored; two in a row is a collapse that stayed for `2 x logging_steps` steps. The small
Qwen3-MoE of docs/MOE.md shows both: 0.2327 then 0.25 and 0.2456 then 0.2498 at top-4 (collapsed, warned), and
0.2404 between 0.216 and 0.19 (a swing, not warned). Why 0.9 of 1/top_k: a share under it is an imbalanced layer
still spreading its tokens (0.19 in those runs); over it nine tokens in ten pick the one expert.
The count restarts in a resumed process, which warns again of a layer still collapsed: accepted, as that run's log
may be the only one read, and the layer is still to be mended. Under several ranks each rank warns once, at the same
step (the shares are gathered over the ranks), in its own log: its workerlog.N, and the launcher's console shows
only local rank 0's; the `routing_collapse` record is rank 0's alone (the one metrics.jsonl writer).
"""
from __future__ import annotations

NEAR = 0.9  # of 1/top_k
INTERVALS = 2  # log intervals in a row


class CollapseWatch:
    """Counts each sparse layer's log intervals in a row near 1/top_k; `see` returns the layers to warn of now."""

    def __init__(self, experts: int, top_k: int, layers: list[int] | None = None):
        """`layers`: the model's layer index of each sparse layer, in the order the shares come (none: 0, 1, ...)."""
        # with as many experts as choices every expert takes 1/top_k: that is balance, not collapse
        self.bar = NEAR / top_k if 0 < top_k < experts else None
        self.experts, self.top_k, self.layers = experts, top_k, layers
        self.in_a_row: dict[int, int] = {}
        self.warned: set[int] = set()

    def see(self, per_layer: list[float]) -> list[tuple[int, float]]:
        """(layer index, share) of each layer that has just stayed near 1/top_k for `INTERVALS` intervals."""
        if self.bar is None:
            return []
        names = self.layers if self.layers is not None and len(self.layers) == len(per_layer) else None
        out = []
        for i, share in enumerate(per_layer):
            layer = names[i] if names else i
            self.in_a_row[layer] = self.in_a_row.get(layer, 0) + 1 if share >= self.bar else 0
            if self.in_a_row[layer] >= INTERVALS and layer not in self.warned:
                self.warned.add(layer)
                out.append((layer, share))
        return out

    def message(self, step: int, layer: int, share: float, bias_rate: float, aux_coef: float) -> str:
        """The warning's one line: what happened and what to try, by the balancing in effect."""
        bias = (f"raise moe_router_bias_update_rate (now {bias_rate:g})" if bias_rate else
                "set moe_router_bias_update_rate 0.001 (docs/MOE.md: the tiny model's busiest share 0.076 against "
                f"{1 / self.experts:.4g} balanced by step 200)")
        return (f"step {step}: MoE layer {layer} routes nearly every token to one expert: its busiest expert's share "
                f"{share:.4f} for {INTERVALS} log intervals in a row (1/top_k = {1 / self.top_k:.4g}, balanced "
                f"{1 / self.experts:.4g}); {bias}, or a larger router_aux_loss_coef (now {aux_coef:g})")
