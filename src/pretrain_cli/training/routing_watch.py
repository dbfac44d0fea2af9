"""The routing-collapse warning: a MoE layer whose busiest expert takes nearly every token's choice.

Each log line carries each sparse layer's busiest-expert share of its assignments (`models.moe_loss.log_values`):
1/experts at balance, 1/top_k when every token's top-k includes the same expert. A layer at `NEAR` x 1/top_k or
more in every log line over at least `SUSTAIN_STEPS` steps (and at least `INTERVALS` lines), all of it after the
grace (`grace`), is warned of once in the run's process: its layer (as transformers names it,
`model.layers.N.mlp`), its share, for how long, and the two balancing keys to try.
Why a grace: a router trained from random init sends nearly every token to the same experts while the learning
rate warms up and for a while at its peak, whatever the balancing, and spreads them again. The shipped
configs/qwen3-moe-tiny_cpu.json (warm-up 20) does in every run, logged every 5 steps: three of its four layers at
0.24-0.25 of 0.25 by step 10-25, the last back under 0.225 at step 85 without `moe_router_bias_update_rate` (0.233
at 80) and at 70 with 0.001; a warning every run of the shipped example gives is one a user learns to ignore. So a
router from init is judged only after step max(`WARMUPS` x warmup_steps, `GRACE_STEPS`): 100 is past the 85
measured, and twice the warm-up keeps a longer warm-up's own spread. A router that starts trained
(continue_training from a MoE model) has no such phase: judged from the first line; but a continued model's router
its directory does not hold (DeepSeek-V3's MTP module: transformers saves none) starts from init and gets the grace
(`routers_from_init`, kept in the trainer state so a resume keeps it). A run that ends before a collapse could be
warned of after its grace is told so once (`note`): a silent log would read as balanced routing.
Why a span of steps, not of log lines: two lines are 10 steps at logging_steps 5 and 40 at 20, so a rule counting lines
would warn a run or not by how often it logs; `SUSTAIN_STEPS` of 20 is a collapse that stayed, whatever the interval
(a swing the balance loss or the routing bias pulls back lasts a line or two), and `INTERVALS` keeps one long
interval's single share from being a verdict.
Why 0.9 of 1/top_k: a share under it is an imbalanced layer still spreading its tokens (0.19 in docs/MOE.md's runs);
over it nine tokens in ten pick the one expert.
The count restarts in a resumed process, which warns again of a layer still collapsed: accepted, as that run's log
may be the only one read, and the layer is still to be mended. Under several ranks each rank warns once, at the same
step (the shares are gathered over the ranks), in its own log: its workerlog.N, and the launcher's console shows
only local rank 0's; the `routing_collapse` record is rank 0's alone (the one metrics.jsonl writer).
"""
from __future__ import annotations

NEAR = 0.9  # of 1/top_k
SUSTAIN_STEPS = 20  # steps a layer stays near 1/top_k before it is warned of
INTERVALS = 2  # and at least this many log lines
WARMUPS = 2  # a router from init: lines before WARMUPS x warmup_steps (or GRACE_STEPS) are not judged
GRACE_STEPS = 100
SECTION = 'docs/MOE.md, "The routing-collapse warning"'
ROUTER = "mlp.gate.weight"  # a MoE layer's router weight, under model.layers.N


def grace(warmup_steps: float, from_init: bool) -> float:
    """The step before which no interval is judged: a router from random init spreads its tokens after an early
    collapse (the module's docstring); a trained one is judged at once."""
    return max(WARMUPS * warmup_steps, GRACE_STEPS) if from_init else 0


def routers_from_init(initialised, layers: list[int]) -> list[int]:
    """Of the model's MoE `layers`, those whose router weight is among the parameter names `initialised` (what a
    load took from init because the directory lacks it: `WeightSource.initialised`)."""
    return [i for i in layers if f"model.layers.{i}.{ROUTER}" in initialised]


class CollapseWatch:
    """Follows each sparse layer's run of log lines near 1/top_k; `see` returns the layers to warn of now."""

    def __init__(self, experts: int, top_k: int, layers: list[int] | None = None, warmup_steps: float = 0,
                 decoder_layers: int | None = None, from_init: bool | list[int] = True):
        """`layers`: the model's layer index of each sparse layer, in the order the shares come (none: their
        order among the sparse layers, said as such); `decoder_layers`: num_hidden_layers (the layers from it on are
        the MTP modules'); `from_init`: every router started from random init in this run's lineage (`grace`), or
        none did, or the model's layers whose router did (a continued model's that its directory lacked)."""
        # with as many experts as choices every expert takes 1/top_k: that is balance, not collapse
        self.bar = NEAR / top_k if 0 < top_k < experts else None
        self.experts, self.top_k, self.layers, self.decoder_layers = experts, top_k, layers, decoder_layers
        self.fresh = None if from_init is True else set(from_init or ())  # None: every layer's router
        self.from_step = grace(warmup_steps, self.fresh is None or bool(self.fresh))
        self.named = True  # the shares' count matched `layers`
        self.last_step: int | None = None  # the previous line's step: where the interval a line ends began
        self.near: dict[int, tuple[int, int]] = {}  # layer: (the step its run near 1/top_k began, its lines)
        self.warned: set[int] = set()

    def see(self, per_layer: list[float], step: int) -> list[tuple[int, float]]:
        """(layer, share) of each layer that has now stayed near 1/top_k for `SUSTAIN_STEPS` steps and `INTERVALS`
        lines ending at `step`; the layer is the model's index, or with `layers` unknown or not matching, the sparse
        layers' count (`name` says which). The first line a process sees began at its own step (its interval's
        start is not known)."""
        began = step if self.last_step is None else self.last_step
        self.last_step = step
        if self.bar is None:
            return []
        self.named = self.layers is not None and len(self.layers) == len(per_layer)
        out = []
        for i, share in enumerate(per_layer):
            layer = self.layers[i] if self.named else i
            graced = self.fresh is None or layer in self.fresh or not self.named  # (unnamed: each may be fresh)
            if (began < self.from_step and graced) or share < self.bar:
                self.near.pop(layer, None)
                continue
            since, lines = self.near.get(layer, (began, 0))
            self.near[layer] = (since, lines + 1)
            if lines + 1 >= INTERVALS and step - since >= SUSTAIN_STEPS and layer not in self.warned:
                self.warned.add(layer)
                out.append((layer, share))
        return out

    def note(self, max_steps: int) -> str | None:
        """The one line for a run that ends before a router in its grace could be warned of (`SUSTAIN_STEPS` past
        `from_step`), or None."""
        if self.bar is None or not self.from_step or max_steps >= self.from_step + SUSTAIN_STEPS:
            return None
        which = "every MoE layer's" if self.fresh is None else ", ".join(self.name(i) for i in sorted(self.fresh))
        judged = ("its routing is" if self.fresh is None else
                  "that layer is" if len(self.fresh) == 1 else "those layers are")
        return (f"routing is judged for a collapse from step {self.from_step:g} (the grace of a router from random "
                f"init: {which} here) and warned of {SUSTAIN_STEPS} steps after: this run ends at step {max_steps}, "
                f"so {judged} not judged; {SECTION}")

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
        since, lines = self.near.get(layer, (step, 0))
        return (f"step {step}: {self.name(layer)} routes nearly every token to one expert: its busiest expert's "
                f"share {share:.4f}, at {NEAR:g} x 1/top_k or more since step {since} ({lines} log lines; 1/top_k = "
                f"{1 / self.top_k:.4g}, balanced {1 / self.experts:.4g}); {bias}, or a larger router_aux_loss_coef "
                f"(now {aux_coef:g}); {SECTION}")
