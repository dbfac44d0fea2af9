"""The routing-collapse warning: a MoE layer whose busiest expert takes nearly every token's choice; and the
token-dropping warning: under `capacity_factor`, a log interval that dropped many of the routed assignments.

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
its directory does not hold (DeepSeek-V3's MTP module: transformers saves none) starts from init and gets the grace,
and so does one a run of ours left still in its grace (a run from init stopped at step 40, continued from its
checkpoint or final directory: its trainer state says so, `routers_before`), less the steps it trained there: the grace
counts a router's steps since init, whichever run took them, at this run's warm-up (its learning rate warms up
again). Both are kept in the trainer state (`routers_from_init`, `routers_steps_before`) so a resume keeps them. A
run that ends before a collapse could be warned of after its grace is told so once (`note`): a silent log would read
as balanced routing.
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
Token dropping is judged by the same watch, at the same log lines (`dropping`): the line's `moe_dropped_share` (the
sparse layers' mean share of their assignments dropped over the interval) at `DROPPED` or more is one warning and
one `tokens_dropped` record, again only when an interval drops `WORSE` x the share last warned of or more. No grace
and no span: a dropped assignment is a token's expert computation the run skips, which the exported model (dropless,
as transformers runs it) does not skip, whatever the router's phase; and one interval's share is already the mean
over its steps. Why `DROPPED` 0.1: at capacity_factor 1 a router from init, near balance, drops 0.076 at step 1 of
configs/qwen3-moe-tiny_cpu.json (a micro-batch never splits exactly evenly: what a factor of 1 costs, which the
start-up `experts:` line says), 0.015 at 1.25; past a tenth, the imbalance, not the factor's rounding, drops tokens
(a Qwen2-MoE run at factor 1: 0.67 at step 10). Why again at `WORSE` x: at most four warnings (0.1, 0.2, 0.4, 0.8),
not one a line as the share moves; a share that falls again is not said.
"""
from __future__ import annotations

NEAR = 0.9  # of 1/top_k
SUSTAIN_STEPS = 20  # steps a layer stays near 1/top_k before it is warned of
INTERVALS = 2  # and at least this many log lines
WARMUPS = 2  # a router from init: lines before WARMUPS x warmup_steps (or GRACE_STEPS) are not judged
GRACE_STEPS = 100
SECTION = 'docs/MOE.md, "The routing-collapse warning"'
DROPPED = 0.1  # an interval's moe_dropped_share warned of
WORSE = 2  # after a warning, again only at WORSE x its share
DROP_SECTION = 'docs/MOE.md, "Token dropping"'
ROUTER = "mlp.gate.weight"  # a MoE layer's router weight, under model.layers.N


def grace(warmup_steps: float, from_init: bool) -> float:
    """The step before which no interval is judged: a router from random init spreads its tokens after an early
    collapse (the module's docstring); a trained one is judged at once."""
    return max(WARMUPS * warmup_steps, GRACE_STEPS) if from_init else 0


def routers_from_init(initialised, layers: list[int]) -> list[int]:
    """Of the model's MoE `layers`, those whose router weight is among the parameter names `initialised` (what a
    load took from init because the directory lacks it: `WeightSource.initialised`)."""
    return [i for i in layers if f"model.layers.{i}.{ROUTER}" in initialised]


def routers_before(state: dict | None, continued: bool | None, layers: list[int]) -> dict[int, int]:
    """Of the model's MoE `layers`, those whose router the run that wrote a directory had from init, with the steps
    each has trained since init (`state`: the directory's trainer state, None for a directory no run of ours wrote:
    its routers are trained ones). A state with `routers_named` says so itself (a run from init names every MoE
    layer): the directory's args.json can be a later run's, rewritten at its start, beside this state. An older
    state named a continued run's routers only, so `continued` (its args.json: whether its run was a
    continue_training; None without one) says whether it had them all. Past its grace or not: `CollapseWatch`."""
    step = state.get("global_step") if isinstance(state, dict) else None
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        return {}
    if state.get("routers_named") is True:
        fresh = state.get("routers_from_init")
    elif continued is None:
        return {}
    else:
        fresh = state.get("routers_from_init") if continued else layers
    before = steps_before(state.get("routers_steps_before"))
    return {i: step + before.get(i, 0) for i in layers if isinstance(fresh, list) and i in fresh}


def steps_before(kept) -> dict[int, int]:
    """A trainer state's `routers_steps_before` (str(layer): steps) by layer, read the one way for the directory a
    run continues from and for the state it resumes: only whole positive step counts (a bool, a negative or a
    fraction would move a grace's end; such an entry counts as none)."""
    if not isinstance(kept, dict):
        return {}
    return {int(k): n for k, n in kept.items() if str(k).isdecimal() and _steps(n)}


def _steps(n) -> int:
    return n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else 0


def _and(items, last: str = " and ") -> str:
    """"a", "a and b", "a, b and c" (`last` before the last of several)."""
    items = list(items)
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])}{last}{items[-1]}"


class CollapseWatch:
    """Follows each sparse layer's run of log lines near 1/top_k; `see` returns the layers to warn of now."""

    def __init__(self, experts: int, top_k: int, layers: list[int] | None = None, warmup_steps: float = 0,
                 decoder_layers: int | None = None, from_init: bool | list[int] = True,
                 before: dict[int, int] | None = None, resumed_at: int = 0):
        """`layers`: the model's layer index of each sparse layer, in the order the shares come (none: their
        order among the sparse layers, said as such); `decoder_layers`: num_hidden_layers (the layers from it on are
        the MTP modules'); `from_init`: every router started from random init in this run's lineage (`grace`), or
        none did, or the model's layers whose router did (a continued model's that its directory lacked, or that a
        run of ours continued from had from init); `before`: the steps such a router trained before this run's
        lineage (layer: steps; none: 0), which its grace counts; `resumed_at`: the step this process started after
        (its resume's; 0 from the start), where its first line's interval begins: the model's counts start there."""
        # with as many experts as choices every expert takes 1/top_k: that is balance, not collapse
        self.bar = NEAR / top_k if 0 < top_k < experts else None
        self.experts, self.top_k, self.layers, self.decoder_layers = experts, top_k, layers, decoder_layers
        self.fresh = None if from_init is True else set(from_init or ())  # None: every layer's router
        self.from_step = grace(warmup_steps, self.fresh is None or bool(self.fresh))  # a router from init here
        self.before = dict(before or {})
        self.named = True  # the shares' count matched `layers`
        self.last_step: int | None = None  # the previous line's step: where the interval a line ends began
        self.near: dict[int, tuple[int, int]] = {}  # layer: (the step its run near 1/top_k began, its lines)
        self.warned: set[int] = set()
        self.resumed_at = resumed_at
        self.first: int | None = None  # the first step of the interval of the last line `see` took
        self.dropped_warned: float | None = None  # the dropped share last warned of

    def see(self, per_layer: list[float], step: int) -> list[tuple[int, float]]:
        """(layer, share) of each layer that has now stayed near 1/top_k for `SUSTAIN_STEPS` steps and `INTERVALS`
        lines ending at `step`; the layer is the model's index, or with `layers` unknown or not matching, the sparse
        layers' count (`name` says which). A collapse's run is counted from the line before (the first line a
        process sees: from its own step); `first`, what a line's counts cover, from the step after it (the first
        line: after `resumed_at`)."""
        began = step if self.last_step is None else self.last_step
        after = self.resumed_at if self.last_step is None or self.last_step >= step else self.last_step
        self.first = min(after + 1, step)  # (a spike's rollback brings the step back: from its resume point)
        self.last_step = step
        if self.bar is None:
            return []
        self.named = self.layers is not None and len(self.layers) == len(per_layer)
        out = []
        for i, share in enumerate(per_layer):
            layer = self.layers[i] if self.named else i
            # unnamed, a share may be any layer's: the latest start of those with a grace
            start = self.start(layer) if self.named else max(map(self.start, self.fresh or [None]))
            if began < start or share < self.bar:
                self.near.pop(layer, None)
                continue
            since, lines = self.near.get(layer, (began, 0))
            self.near[layer] = (since, lines + 1)
            if lines + 1 >= INTERVALS and step - since >= SUSTAIN_STEPS and layer not in self.warned:
                self.warned.add(layer)
                out.append((layer, share))
        return out

    def start(self, layer: int | None) -> float:
        """The step from which `layer`'s router is judged (None: a router from init in this lineage): a trained one
        at once, one from init after its grace less the steps it trained before this lineage (`before`)."""
        if self.fresh is not None and layer not in self.fresh:
            return 0
        return max(0, self.from_step - self.before.get(layer, 0))

    def note(self, max_steps: int) -> str | None:
        """The one line for a run that ends before a router in its grace could be warned of (`SUSTAIN_STEPS` past
        its `start`), or None."""
        late = {i: at for i in (self.fresh if self.fresh is not None else [None])
                if (at := self.start(i)) and max_steps < at + SUSTAIN_STEPS}
        if self.bar is None or not late:
            return None
        if self.fresh is None:
            where, judged = f"from step {self.from_step:g}", "its routing is"
        else:
            at_each = {at: [self.plain(i) for i in sorted(late) if late[i] == at] for at in sorted({*late.values()})}
            where = _and([f"from step {at:g} in {_and(names)}" for at, names in at_each.items()],
                         ", and " if any(len(names) > 1 for names in at_each.values()) else " and ")
            judged = "that layer is" if len(late) == 1 else "those layers are"
        counted, less = [i for i in sorted(late) if i is not None and self.before.get(i, 0)], ""
        if counted:  # those layers' grace ends earlier: by the steps they trained in the runs this one continues
            who = ("it" if len(late) == 1 else "they") if len(counted) == len(late) else _and(map(self.plain, counted))
            less = f", less the steps {who} trained before this run"
        return (f"routing is judged for a collapse {where}, where the grace of a router from random init ends"
                f"{less}, and warned of {SUSTAIN_STEPS} steps after: this run ends at step {max_steps}, so "
                f"{judged} not judged; {SECTION}")

    def plain(self, layer: int) -> str:
        """The layer's module name inside a sentence of its own (the MTP module's said first, not in parentheses)."""
        mtp = self.decoder_layers is not None and layer >= self.decoder_layers
        return f"the MTP module's model.layers.{layer}.mlp" if mtp else f"model.layers.{layer}.mlp"

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

    def dropping(self, share: float) -> bool:
        """Whether the interval `see` took last dropped enough of its assignments to be warned of (`share`: the
        line's moe_dropped_share): `DROPPED` or more, and after a warning `WORSE` x the share warned of or more."""
        if share < (DROPPED if self.dropped_warned is None else WORSE * self.dropped_warned):
            return False
        self.dropped_warned = share
        return True

    def drop_message(self, step: int, share: float, per_layer: list[float], factor: float,
                     capacity: int | None) -> str:
        """The token-dropping warning's one line: how much was dropped, where most, what the capacity keeps, what
        the export computes instead and what to change (`per_layer`: moe_dropped_share_per_layer)."""
        span = f"steps {self.first}-{step}" if self.first is not None and self.first < step else f"step {step}"
        worst = ""
        if len(per_layer) > 1:
            i = max(range(len(per_layer)), key=per_layer.__getitem__)
            worst = f"; the most in {self.name(self.layers[i] if self.named else i)}, {per_layer[i]:.4f}"
        keeps = f" keeps at most {capacity:,} of a micro-batch's assignments per expert" if capacity else ""
        again = f"; said again at {WORSE * share:.4f} or more" if WORSE * share < 1 else ""
        return (f"step {step}: {share:.1%} of the routed expert assignments were dropped over {span} "
                f"(moe_dropped_share {share:.4f}{worst}): capacity_factor {factor:g}{keeps}, and the tokens past it "
                f"skip that expert in training, where the exported model (dropless, as transformers runs it) computes "
                f"every one; raise capacity_factor, set it to 0 (dropless) or balance the routing{again}; "
                f"{DROP_SECTION}")
