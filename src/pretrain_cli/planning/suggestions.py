"""`plan`'s suggestions: the key changes that lower a run's memory, ranked by what each saves, each made minimal
(no key the fit does not need), and, when no setting fits the devices asked for, the fewest devices that fit.

Every candidate is re-planned through the caller's `replan` (which re-resolves the file with the change and calls
`plan.report`), so each saving is computed, not guessed, and this module needs only the `Plan` it reads.
"""
from __future__ import annotations

import dataclasses

from pretrain_cli.counts import count
from pretrain_cli.planning.layout import tp_inside_node
from pretrain_cli.planning.report import Plan
from pretrain_cli.run_config import RunConfig


def _first_fitting(changes: list[dict], replan):
    """The first change that fits, else the last one that could be planned (the strongest)."""
    last = None
    for change in changes:
        r = replan(change)
        if r is None:
            continue
        last = (change, r)
        if r.fits:
            break
    return last


def suggest(run: RunConfig, base: Plan, replan) -> list[dict]:
    """Ranked key changes that lower memory; `replan(change) -> report | None` re-resolves the file with them. On cpu
    where the model's state alone exceeds the machine (`machine_too_small`), that one line instead: no change fits."""
    if machine := machine_too_small(base):
        return [{"change": {}, "machine": True, "memory_gib": base.peak_gib, "saves_gib": 0.0, "fits": False,
                 "why": machine}]
    lp, s = run.loop, run.data.max_seq_length
    b, acc = lp.micro_batch, lp.grad_accum
    groups: list[tuple[list[dict], str]] = []
    if run.recompute is None:
        groups.append(([{"recompute": True}], "recomputes each decoder layer in backward (~+33% compute)"))
    elif run.recompute.granularity != "full":
        groups.append(([{"recompute_granularity": "full"}], "recomputes whole decoder layers"))
    if run.kernels.attention == "math":
        groups.append(([{"use_flash_attention": True}], "no [b, heads, s, s] scores (on GPU: Ampere+ and fp16/bf16)"))
    if base.parallel.data_ranks > 1 and run.parallel.sharding_stage < 3:
        stages = [{"sharding": f"stage{k}"} for k in range(run.parallel.sharding_stage + 1, 4)]
        groups.append((stages, "shards optimizer state (stage1), + gradients (stage2), + weights (stage3)"))
    if b > 1:
        mbs = [m for m in (b // 2 ** i for i in range(1, b.bit_length())) if m >= 1 and b % m == 0]
        groups.append(([{"per_device_train_batch_size": m, "gradient_accumulation_steps": acc * b // m}
                        for m in mbs], "same global batch, more accumulation steps"))
    if s >= 256:
        seqs = [s // 2 ** i for i in range(1, 5) if s // 2 ** i >= 128]
        groups.append(([{"max_seq_length": x} for x in seqs],
                       "shorter context: changes what the model learns; fewer tokens per step"))
    out = []
    for changes, why in groups:
        got = _first_fitting(changes, replan)
        if got is None:
            continue
        change, r = got
        saves = base.peak_gib - r.peak_gib
        if saves > 1e-6:
            out.append({"change": change, "memory_gib": r.peak_gib, "saves_gib": saves, "fits": r.fits,
                        "why": why})
    out.sort(key=lambda x: -x["saves_gib"])
    if out and not any(x["fits"] for x in out) and len(out) > 1:
        combined = {k: v for x in out if "max_seq_length" not in x["change"] for k, v in x["change"].items()}
        r = replan(combined)  # (not when it is one of the above: the union of a single group is that group)
        if r is not None and len(combined) > 1 and _key(combined) not in {_key(x["change"]) for x in out}:
            why = "all of the above except a shorter sequence"
            if r.fits:  # the answer to "what fits", so first, as the report's heading says, and made minimal
                combined, r = minimal(combined, base.gpus, lambda change, world: replan(change))
                why = "no one key fits, these together do (the fewest of the above)"
            entry = {"change": combined, "memory_gib": r.peak_gib, "saves_gib": base.peak_gib - r.peak_gib,
                     "fits": r.fits, "why": why}
            out.insert(0 if r.fits else len(out), entry)
    return out


MAX_DEVICES = 4096
FIT_MARGIN = 0.10  # `plan --fit`'s default share of device memory kept free (`planning.fit.DEFAULT_MARGIN`)

# The order `minimal` tries dropping the keys of a change that fits in: the dearest lever first (recompute costs
# about a third more compute), the sharding stage last (it is then lowered instead). Keys in one tuple go together:
# micro-batch and accumulation keep the global batch only as a pair.
_DROP_ORDER = (("recompute", "recompute_granularity"), ("per_device_train_batch_size", "gradient_accumulation_steps"),
               ("use_flash_attention",))


def _key_groups(change: dict) -> list[tuple]:
    groups = [tuple(k for k in g if k in change) for g in _DROP_ORDER]
    grouped = {k for g in groups for k in g} | {"sharding"}
    groups += [(k,) for k in change if k not in grouped] + [("sharding",) if "sharding" in change else ()]
    return [g for g in groups if g]


def minimal(change: dict, world: int, replan, same_batch: bool = True) -> tuple[dict, Plan]:
    """`change` (which fits on `world` devices) without each group of keys it still fits without, then with the
    lowest sharding stage that still fits: a suggestion names no key the fit does not need, so none whose effect is
    nil (a sharding stage over one data rank re-plans to the same memory, and is dropped). With `same_batch` (the
    devices asked for) a group goes only where the global batch stays `change`'s: the accumulation steps without
    the micro-batch, or a degree that moves the data ranks, would change it silently (DeepSeek-V3's 4,096 samples a
    step on 256 H100 became 512); on more devices (`more_devices`) it grows with the data ranks, as its line says."""
    samples = replan(change, world).global_batch if same_batch else None
    dropped = True
    while dropped:  # until no group can go: then none of the keys left can go alone
        dropped = False
        for group in _key_groups(change):
            fewer = {k: v for k, v in change.items() if k not in group}
            r = replan(fewer, world)
            if r is not None and r.fits and samples in (None, r.global_batch):
                change, dropped = fewer, True
                break
    stage = str(change.get("sharding", ""))
    for k in range(1, int(stage[-1]) if stage.startswith("stage") else 1):
        r = replan({**change, "sharding": f"stage{k}"}, world)
        if r is not None and r.fits:
            change = {**change, "sharding": f"stage{k}"}
            break
    return change, replan(change, world)


def device_counts(gpus: int, per_node: int) -> list[int]:
    """The device counts above `gpus` the fewest-devices search tries first, fewest first: powers of two within a
    node, then whole nodes (a power of two of them), since the launcher runs as many processes on every node; the
    counts between the last that does not fit and the first that does are tried after (`more_devices`)."""
    within = [2 ** i for i in range(1, 13) if 2 ** i < per_node]
    nodes = [per_node * 2 ** i for i in range(13)]
    return [w for w in sorted(set(within + nodes)) if gpus < w <= MAX_DEVICES]


def first_count(counts: list[int], fits, per_node: int) -> int | None:
    """The index of the fewest of `counts` (`device_counts`, from the first whose budgets hold the state) at which
    `fits(count)`, or None. The counts within a node one by one, fewest first (on cpu a node's processes share its
    memory, so each of more gets less: what fits on 2 need not fit on 4); then of the whole nodes the most, where if
    none fits none does; then the first two one by one (where most answers are: a layout at its least memory fits
    soon after the state does), then bisection between. Each whole number of nodes gives a device the same budget,
    and each count offers every tensor, pipeline and expert degree of the one before (a power of two of nodes: every
    degree that divided it divides the next) with twice the data ranks, at every sharding stage. A layout need not
    fit there because it fit before (one data rank without sharding gains DataParallel's gradient buffers), but its
    ZeRO-1 variant, offered wherever there are data ranks, needs less (no such buffers, half the AdamW state), and
    a sharded layout's state splits further: the least need does not grow with the count, so what fits on n nodes
    fits on 2n. A model no count up to MAX_DEVICES holds is planned at one count, not each; where some count fits,
    `fits` stops at the first layout that does (`more_devices`), so the most costs a few plans
    (tests/unit/test_plan_count_search.py: the answers are the one-by-one search's, and the least need does not
    grow over whole-node counts)."""
    inside = [i for i, world in enumerate(counts) if world < per_node]
    for i in inside:
        if fits(counts[i]):
            return i
    lo, hi = len(inside), len(counts) - 1
    if lo > hi or not fits(counts[hi]):  # (the most first: where it does not fit, none does)
        return None
    for i in range(lo, min(lo + 2, hi)):
        if fits(counts[i]):
            return i
    lo = min(lo + 2, hi)  # none below lo fits
    while lo < hi:  # counts[hi] fits
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if fits(counts[mid]) else (mid + 1, hi)
    return hi


def _key(change: dict) -> tuple:
    return tuple(sorted((k, repr(v)) for k, v in change.items()))


def _in_node(replan, per_node: int):
    """`replan` whose plans with tensor-parallel groups across nodes do not fit (`layout.tp_inside_node`)."""
    def in_node(change: dict, world: int, **kw):
        r = replan(change, world, **kw)
        return r if r is None or tp_inside_node(r.parallel.tp, world, per_node) else dataclasses.replace(r, fits=False)

    return in_node


def machine_too_small(base: Plan, beyond: tuple[Plan | None, float] | None = None,
                      fewer: tuple[int, int] | None = None) -> str | None:
    """On cpu, the line saying so when the weights, gradients and AdamW state alone (a checkpoint and the weights
    again: `Plan.checkpoint`) exceed the memory of the machines planned (each process's part x the processes): no
    layout or process count on them holds the run, so `plan` says so (with how many machines of this one's memory
    hold the state alone) instead of a change that still does not fit, and searches more machines
    (`fit.fewest_devices`). On one machine `check` refuses such a run too (`hardware.host_memory_problem`: the
    parameters against this machine's memory). None on a GPU or where it fits. `beyond`: (the leanest layout on
    MAX_DEVICES processes, `fit.leanest`, the budget on `base`'s device) when the count search found no number of
    processes up to MAX_DEVICES that fits: more machines are not offered, and the line says what a process of the
    leanest layout still needs there beside its budget (more machines split the state, not the rest); `fewer`:
    (processes a machine, processes) where fewer processes a machine fit (`machines.fewer_a_machine`): named, as
    each process then gets more of its machine's memory."""
    if base.device.name != "cpu":
        return None
    need = base.checkpoint.per_checkpoint_gib + base.checkpoint.parts_gib["weights"]
    have, nodes = base.device.memory_gib * base.gpus, -(-base.gpus // base.device.links.gpus_per_node)
    if not need > have:
        return None
    where = "this machine has" if nodes == 1 else f"the {nodes} machines planned have"
    how = "plan more machines (--gpus with --gpus_per_node), choose"
    if beyond is not None:
        per = base.device.links.gpus_per_node
        how = (f"no number of processes up to {MAX_DEVICES} fits on machines of this one's memory either"
               + (f" at {per} processes a machine" if per > 1 else ""))
        if (lean := beyond[0]) is not None:
            share = beyond[1] * lean.device.memory_gib / base.device.memory_gib
            how += (f" (on {MAX_DEVICES} the leanest layout still needs {lean.least_gib:.2f} GiB a process"
                    f"{_largest_part(lean)}, over its {share:.2f} GiB budget)")
        if fewer is not None:
            n, world = fewer
            how += (f"; with fewer processes a machine some do: --gpus_per_node {n} --gpus {world} "
                    f"({count(-(-world // n), 'machine')} of {count(n, 'process')}; `plan` with them names "
                    f"the keys)")
        how += "; or choose" if fewer is not None else "; choose"
    return (f"memory: the weights, gradients and AdamW state alone need {need:.2f} GiB and {where} {have:.1f} GiB, "
            f"so no layout or number of processes fits there (the state alone needs {-(-need // (have / nodes)):.0f} "
            f"machines of this one's memory); {how} a smaller model, or plan a GPU run (`plan --device <GPU>`)")


# the evaluation's parts (`eval_memory.eval_parts`) as `plan`'s eval line names them
_EVAL_PARTS = {"held": "held between steps", "forward": "the forward"}


def _largest_part(r: Plan) -> str:
    """Where `r.least_gib` is reached and its largest part there (", <part> <GiB> of it"): the step (its parts as
    `plan` lists them), start-up, or the evaluation of 1 sample a process (`Plan.eval_least_gib`), whichever needs the
    most; the evaluation's parts only where `r` was planned at that batch (`fit.leanest` is), else where alone."""
    if (r.eval_least_gib or 0.0) > r.peak_gib:
        if r.eval_batch != 1:
            return " in an evaluation of 1 sample"
        where, parts = " in an evaluation of 1 sample,", {_EVAL_PARTS.get(k, k): v for k, v in
                                                          r.eval_breakdown_gib.items()}
    elif r.startup_gib > r.memory_gib:
        where, parts = " at start-up,", r.startup_breakdown_gib
    else:
        where, parts = ",", r.memory_breakdown_gib
    part, gib = max(parts.items(), key=lambda kv: kv[1])
    return f"{where} {part} {gib:.2f} of it"


def _share(base: Plan, world: int) -> float:
    """A device's memory on `world` devices over `base`'s, as `plan.target_device` gives it (1 on a GPU; on cpu the
    processes of a node share its memory, so more of them on a node each get less)."""
    from pretrain_cli.planning import hardware
    from pretrain_cli.planning.plan import target_device

    node = hardware.Node(base.device.links.gpus_per_node)
    return target_device(base.device.name, node, world).memory_gib / base.device.memory_gib


def within_budget(base: Plan, replan, budget_gib: float, as_given: bool = True):
    """`replan(change, world)` whose plans fit where the change as given (step, start-up and an evaluation at the
    eval batch it leaves: the file's unless it sets one) is within `budget_gib`, the budget of `base`'s device, scaled
    to each plan's device (`_share`: 8 cpu processes of a node get an eighth of the machine's each): what `plan
    --fit` fits to, and so `plan`'s suggestions and device counts (one budget, one answer). A single key's
    suggestion names no eval batch, so one that fits only at a lower one does not fit as it is followed. `as_given`
    False: an evaluation of 1 (`Plan.least_gib`), as `--fit`'s search judges a layout whose eval batch `fit.fit_eval`
    then lowers (the fewest devices: `fit.fewest_devices` names the eval keys it needs there)."""
    def within(change: dict, world: int = base.gpus, **kw):
        r = replan(change, world, **kw)
        if r is None:
            return None
        need = max(r.peak_gib, r.eval_memory_gib or 0.0) if as_given else r.least_gib
        return dataclasses.replace(r, fits=need <= budget_gib * r.device.memory_gib / base.device.memory_gib)

    return within


def more_devices(base: Plan, singles: list[dict], replan, layouts: list[dict] = (), lean=None,
                 budget_gib: float | None = None) -> dict | None:
    """When no setting fits on the devices asked for: the fewest devices at which the run fits within `budget_gib`
    (`within_budget`; None: the device's memory, `Plan.fits`), re-planned with `replan(change, gpus)`, and the
    fewest keys it needs there (`minimal`); its line says the global batch where the data ranks grow it.

    None fits on fewer devices than the model's state needs, every parameter's weights, gradients and AdamW state
    held once over them all (a checkpoint and the weights again: `Plan.checkpoint`), each device with its budget
    there (on cpu a node's processes share one memory: `_share`), so the search starts there. At the counts of
    `device_counts` `first_count` asks (not each), the file as it is, each sharding stage, the single-device savings
    (recompute, smaller micro-batch, …) alone and with stage3, each of `layouts` (the `--fit` search's smallest layout
    at `--gpus`), and `lean(gpus)`'s layouts (`fit_candidates.lean_layouts`: every tensor, pipeline, expert degree and
    sharding stage at its least memory). Then each whole number of nodes (within a node, each count) between the last
    count that did not fit and the first that did, fewest first, with the layouts that fit there: one that fits on fewer
    devices also fits on more (its state split over more ranks), not the other way round. A layout whose
    tensor-parallel groups would span nodes counts as not fitting (`layout.tp_inside_node`): more nodes with tp
    inside one are suggested instead (PaddleNLP's DeepSeek-V3 file at 8,192 tokens: tp 8 on 232 H100, not tp 16
    across two nodes)."""
    # (the axes `config.refusals` refuses with ZeRO-3 are left out of the savings: pipeline, sequence and context
    # parallelism; a layout of `layouts` keeps them, as it was resolved with them)
    extra = {k: v for s in singles for k, v in s["change"].items() if k not in (
        "max_seq_length", "sharding", "pipeline_parallel_degree", "virtual_pp_degree", "sequence_parallel",
        "context_parallel_degree")}
    tries = [{}] + [{"sharding": f"stage{k}"} for k in (1, 2, 3)]
    tries += [extra, {"sharding": "stage3", **extra}] if extra else []
    tries += [dict(x) for x in layouts if x]
    per_node, budget = base.device.links.gpus_per_node, base.device.memory_gib if budget_gib is None else budget_gib
    state = base.checkpoint.per_checkpoint_gib + base.checkpoint.parts_gib["weights"]  # (+ the gradients)
    replan = _in_node(replan if budget_gib is None else within_budget(base, replan, budget_gib, False), per_node)

    def fitting(changes: list[dict], world: int, every: bool = True) -> list[dict]:  # (not `every`: the first)
        seen, out = set(), []
        for change in list({_key(c): c for c in changes}.values()):  # each once, in order
            r = replan(change, world, layout=False)  # (memory only: no groups of ranks)
            if r is not None and r.fits and (r.parallel, r.micro_batch, r.recompute, r.attention) not in seen:
                seen.add((r.parallel, r.micro_batch, r.recompute, r.attention))
                out.append(change)
                if not every:
                    break
        return out

    def holds(world: int) -> bool:  # whether `world` devices' budgets together hold the state
        return world * budget * _share(base, world) >= state

    def at(world: int, every: bool = True) -> list[dict]:  # the changes that fit on `world` devices
        leanest = lean(world) if lean else []  # (not `every`: whether any does, the most split layouts first)
        return fitting(tries + (leanest if every else leanest[::-1]), world, every)

    counts = device_counts(base.gpus, per_node)  # from the first whose budgets hold the state (more hold it too)
    skip = next((i for i, world in enumerate(counts) if holds(world)), len(counts))
    if (i := first_count(counts[skip:], lambda world: bool(at(world, every=False)), per_node)) is None:
        return None
    below, world = counts[skip + i - 1] if skip + i else base.gpus, counts[skip + i]
    found = at(world)  # (every change that fits there: `replan` keeps the plans the search made, `fit.remembered`)
    for fewer in range(below + 1, world):  # what fits at `world`, on whole nodes fewer
        if holds(fewer) and (fewer < per_node or fewer % per_node == 0) and (here := fitting(found, fewer)):
            world, found = fewer, here
            break
    change, r = minimal(min(found, key=len), world, replan, same_batch=False)
    nodes = f" ({world // per_node} nodes of {per_node})" if world > per_node else ""
    margin = f" with `plan --fit`'s {1 - budget / base.device.memory_gib:.0%} margin" if budget_gib is not None else ""
    why = f"fewest devices that fit{nodes}{margin}: no setting fits {base.gpus} x {base.device.name}"
    if "sharding" in change and r.parallel.sharding_stage:
        why += f"; {change['sharding']} shards over the {r.parallel.sharding_degree} data ranks of {world}"
    why += "; without any one of these keys it does not fit there" if change else "; the file as written fits there"
    if r.global_batch != base.global_batch:  # (each data rank keeps the file's samples a step: said, never silent)
        why += (f"; global batch {base.global_batch:,} -> {r.global_batch:,} samples "
                f"({count(r.parallel.data_ranks, 'data rank')})")
    return {"gpus": world, "change": change, "memory_gib": r.peak_gib, "saves_gib": base.peak_gib - r.peak_gib,
            "fits": True, "why": why}


# `save_total_limit` unset keeps every save: a warning beyond this many (a fixed count, the same on every machine,
# as `plan` for a GPU cannot see the training host's disk); the limit the warning suggests keeps a fallback for a
# damaged newest checkpoint (`storage.intact`)
MAX_KEPT, KEEP = 10, 2


def checkpoint_disk_note(c, limit: int | None, free: tuple[float, str] | None = None) -> str | None:
    """Why, when the checkpoints `plan` counts (`c`: `Plan.checkpoint`; `limit`: the file's save_total_limit)
    will not be kept on disk: more than MAX_KEPT of them with `save_total_limit` unset, or (`free`: GiB free on the
    filesystem of output_dir, its directory: `hardware.disk_free_gib`, given when the run is planned for this
    machine) more than that disk has free, else None. It names the disk it compared with and the `save_total_limit`
    that fits; `plan` and `check` each frame it as their warning (`orchestration.planned.checkpoint_advice`)."""
    free_gib, where = free if free is not None else (float("nan"), "")
    if c.total_gib > free_gib:
        why = (f"{c.total_gib:.2f} GiB of checkpoints is more than the {free_gib:.2f} GiB free on the filesystem of "
               f"{where} (output_dir's nearest existing directory, on this machine)")
    elif not limit and c.kept > MAX_KEPT:
        why = f"save_total_limit is not set, so all {c.kept} saves are kept: {c.total_gib:.2f} GiB on disk"
    else:
        return None
    fits = [n for n in range(min(KEEP, c.kept - 1), 0, -1)
            if not n * c.per_checkpoint_gib + c.final_weights_gib > free_gib]  # (NaN: any)
    if fits:
        n = fits[0]
        fix = (f"`save_total_limit: {n}` keeps the newest {n}: {n * c.per_checkpoint_gib + c.final_weights_gib:.2f} "
               f"GiB with the final weights")
    else:
        fix = "free space there or choose another output_dir (one checkpoint and the final weights need " \
              f"{c.per_checkpoint_gib + c.final_weights_gib:.2f} GiB)"
    return f"{why}; {fix}"
