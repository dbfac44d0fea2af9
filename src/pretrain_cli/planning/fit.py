"""`plan --fit`: the fastest layout of a run that fits the device, found by re-planning every candidate that could
fit (`search` skips a larger micro-batch of a layout already over the budget: `grows_with_micro_batch`).

A candidate is a set of argument-file key changes (micro-batch with the accumulation that keeps the global
batch, recompute granularity, flash attention, sharding stage, tensor-parallel (with and without sequence
parallelism), pipeline or context-parallel degree), proposed by `planning.fit_candidates`. This module
ranks them: the caller (`orchestration.planned`) re-resolves the parsed arguments with each one
(`replan(change) -> Plan | None`, None when `config.resolve` refuses the layout), so every candidate is a
layout `train` runs and its memory is the memory model's, never a rule re-derived here. No Paddle, no config
import.

Ranked by `planning.speed.speed` (docs/PLAN.md): each pipeline stage's compute and TP, PP, ZeRO-3, CP and EP
traffic from its own layers, each over the in-node or the cross-node link its group uses, the step set by the
slowest stage with the pipeline's fill and drain, plus the DP/ZeRO gradients (context-parallel candidates from
`fit_candidates.CONTEXT_MIN_SEQ` tokens on). Flash and math
attention count the same FLOPs; among equally fast candidates the one running flash wins (it is the faster
kernel where it runs), then the one with fewer changes, then the larger micro-batch, then the one with less memory
(`rank`). `plan`'s suggestion, when no one key fits, is the same search's fastest of the fewest changed keys.
"""
from __future__ import annotations

import dataclasses

from pretrain_cli.planning.fit_report import eval_reasons
from pretrain_cli.planning import fit_candidates
from pretrain_cli.planning.machines import fewer_a_machine
from pretrain_cli.planning.suggestions import FIT_MARGIN, MAX_DEVICES, machine_too_small, more_devices
from pretrain_cli.planning.plan import TOO_SMALL
from pretrain_cli.planning.report import Plan
from pretrain_cli.planning.speed import speed, traffic_bound

DEFAULT_MARGIN = FIT_MARGIN  # of device memory kept free: allocator fragmentation and what the model misses
MICRO_KEYS = ("per_device_train_batch_size", "gradient_accumulation_steps")
STEP_KEYS = ("recompute", "recompute_granularity", "use_flash_attention")  # with MICRO_KEYS: not the split's


def _layout(r: dict) -> tuple:
    """What a resolved candidate runs: candidates that resolve alike are one layout."""
    p = r.parallel
    return (r.micro_batch, r.gradient_accumulation_steps, r.recompute, r.attention, p.tp, p.sharding_stage,
            p.sharding_degree, p.pp, p.cp, p.sequence_parallel, p.ep)  # (sequence parallelism: a layout of its own)


def search(current: dict, base: Plan, replan, budget_gib: float, fewest_first: bool = False,
           progress=None) -> dict:
    """The best candidate whose predicted memory is within `budget_gib` (`rank`: the fastest, or with
    `fewest_first` the fastest of those with the fewest changed keys, `plan`'s suggestion; where `base`'s device has
    no known peak, the fewest changes), and the smallest. `progress(total, what)`: an object whose `update(1)` is
    called per candidate and `close()` at the end (`commands.plan`'s line and bar), or None.

    Returns {"best": entry | None, "smallest": entry | None, "tried": n, "valid": n, "skipped": n, "faster": entry |
    None}; an entry is {"change", "report", "speed"} (speed None where it does not fit); "faster": a layout faster
    than "best" and over the budget, why it is not the answer (`faster_over_budget`; not under `fewest_first`).
    "skipped": the candidates not planned, as no plan of them can fit or be the smallest: a larger micro-batch of a
    layout already over the budget (`grows_with_micro_batch`), and every candidate of a split whose state alone is
    over the budget and over the least memory planned so far (`state_floor`). DeepSeek-V3 at 4,096 tokens on 224
    H100 (--fit, O1 and O2 searched): 8.5 s of CPU, 128 s with the micro-batch skip alone (docs/PLAN.md); the same
    pick (tests/unit/test_plan_fit_pruning.py).
    """
    seen: dict[tuple, dict] = {}
    tried = skipped = 0
    # a candidate's keys but the micro-batch's -> (the least micro-batch over the budget, its number of changes)
    too_big: dict[frozenset, tuple[int, int]] = {}
    floors: dict[frozenset, float] = {}  # a split's keys -> the GiB each of its candidates needs at least
    least = float("inf")  # the least memory of a candidate planned so far (`smallest` is no larger)
    todo = [{}] + fit_candidates.candidates(current, base.global_batch, base.gpus, base.max_seq_length,
                                            base.model.experts, base.device.links.gpus_per_node)
    bar = progress(len(todo), f"{base.gpus} x {base.device.name}, {base.precision.amp_level or 'fp32'}") \
        if progress is not None else None
    for change in todo:
        if bar is not None:
            bar.update(1)
        rest = frozenset((k, v) for k, v in change.items() if k not in MICRO_KEYS)
        split = frozenset((k, v) for k, v in rest if k not in STEP_KEYS)
        micro = change.get("per_device_train_batch_size", current["per_device_train_batch_size"])
        over, changes = too_big.get(rest, (micro, 0))
        if micro > over and len(change) >= changes:  # (`fit_candidates.candidates`: micro-batches rising)
            skipped += 1  # no smaller than that one (as small, it would be the smallest only with fewer changes)
            continue
        if floors.get(split, 0.0) > max(budget_gib, least):  # neither fits nor is the smallest
            skipped += 1
            continue
        tried += 1
        r = base if not change else replan(change)
        if r is None:
            continue
        floors[split], least = max(floors.get(split, 0.0), state_floor(r)), min(least, r.least_gib)
        if r.peak_gib > budget_gib and grows_with_micro_batch(r) and micro < too_big.get(rest, (micro + 1,))[0]:
            too_big[rest] = (micro, len(change))
        key = _layout(r)
        if key in seen and len(seen[key]["change"]) <= len(change):
            continue
        fits = r.least_gib <= budget_gib  # steady state, start-up and an evaluation of 1 (`fit_eval` lowers it)
        seen[key] = {"change": change, "report": r, "speed": speed(r) if fits else None}  # (ranks only what fits)
    if bar is not None:
        bar.close()
    entries = list(seen.values())
    fitting = [e for e in entries if e["speed"] is not None]
    by_speed = base.device.peak_tflops is not None
    best = min(fitting, key=lambda e: rank(e, by_speed, fewest_first), default=None)
    smallest = min(entries, key=lambda e: (e["report"].least_gib, len(e["change"])), default=None)
    return {"best": best, "smallest": smallest, "tried": tried, "valid": len(entries), "skipped": skipped,
            "faster": faster_over_budget(entries, best, base.device.memory_gib) if by_speed and not fewest_first
            else None}


def faster_over_budget(entries: list[dict], best: dict | None, device_gib: float) -> dict | None:
    """Why the answer is not a faster layout: of the planned layouts `entries` faster than the chosen `best` (all
    over the budget, or `best` would be one), the fastest that fits the device's memory, `device_gib` (only the
    margin keeps it out), else the one that needs the least (`Plan.least_gib`), with "on_device" saying which. The
    fastest of them all may need any amount: DeepSeek-V3 on 224 H100, where the chosen tp 4 x ZeRO-3 is
    traffic-bound, the fastest planned, without recompute, needs 1,035 GiB a device; the fastest within the 80, tp 2
    x pp 7 x EP 16, 79.73 GiB. `search` times only what fits; the rest are timed here. None where nothing fits or
    nothing is faster."""
    if best is None:
        return None
    timed = [{**e, "speed": speed(e["report"])} for e in entries if e["speed"] is None]
    faster = [e for e in timed if e["speed"]["rank_seconds"] < best["speed"]["rank_seconds"]]
    on_device = [e for e in faster if e["report"].least_gib <= device_gib]
    if on_device:
        return {**min(on_device, key=lambda e: rank(e, True)), "on_device": True}
    lean = min(faster, key=lambda e: (e["report"].least_gib, rank(e, True)), default=None)
    return None if lean is None else {**lean, "on_device": False}


def state_floor(r: Plan) -> float:
    """GiB no candidate of `r`'s split (the same keys but micro-batch, accumulation, recompute and attention: `search`)
    needs less than: its fullest stage's weights, gradients, optimizer state, master weights and DDP buffers, which
    those keys do not move (`memory._parts`: parameters and sharding only). That stage holds them in every candidate
    of the split, and a candidate's peak is at least that stage's. Under O1 the weights' half casts come and go with
    the fused head + loss, so its fp32 weights are counted by the gradients, also fp32 and no more sharded than
    they are below ZeRO-3 (at it, not at all)."""
    parts = r.memory_breakdown_gib
    weights = parts.get("weights", 0.0) if r.precision.amp_level != "O1" else \
        parts.get("gradients", 0.0) if r.parallel.sharding_stage < 3 else 0.0
    return weights + sum(parts.get(k, 0.0) for k in ("gradients", "optimizer_state", "master_weights",
                                                     "gradient_buffers"))


def rank(entry: dict, by_speed: bool, fewest_first: bool = False) -> tuple:
    """A fitting candidate's place, lowest best: by speed (the step's seconds; then flash attention, the faster
    kernel where it runs), then fewer changed keys, then the larger micro-batch (fewer, larger kernels per step: the
    per-micro-step overhead the FLOPs model leaves out), then less memory. `fewest_first`: fewer changed keys before
    speed (`plan`'s suggestion: the fewest keys, of those the fastest, so on the keys it names it agrees with
    `--fit`). Without a peak (`by_speed` False: no speed estimate) the speed terms are left out: fewest changes."""
    r, n = entry["report"], len(entry["change"])
    fast = (round(entry["speed"]["rank_seconds"], 9), r.attention != "flash") if by_speed else ()
    return (*((n, *fast) if fewest_first else (*fast, n)), -r.micro_batch, r.peak_gib)


def grows_with_micro_batch(r: Plan) -> bool:
    """Whether every larger micro-batch of `r`'s layout (the same keys but the micro-batch and the accumulation that
    keeps the global batch) needs no less memory than `r` by the memory model (`planning.memory`) and the same
    start-up, so that once one is over the budget the larger ones need not be planned: they fit no better and are no
    smaller (`search` still plans one with fewer changed keys, which an equal peak would make the smallest). Each
    steady-state term is a fixed size or grows with the micro-batch's tokens (activations, the recompute working
    set, the logits or the fused head + loss, the document mask, CP's and the experts' buffers), 1F1B keeps
    min(pp − stage, accumulation) micro-batches in flight (min((pp − stage) · b, the rank's samples) samples), and
    start-up builds the weights, whatever the batch. Not where the schedule or a default moves with it: under virtual
    pipeline stages (interleaved 1F1B's warm-up depends on accumulation mod pp), nor under O1, whose half casts of
    the head (`memory._half_copies`) come and go as `config.resolve` turns the fused head + loss on above a
    micro-batch's tokens (`config.compute.fused_loss_default`). The picks are the whole search's
    (tests/unit/test_plan_fit_pruning.py)."""
    return r.parallel.vpp <= 1 and r.precision.amp_level != "O1"


def fit(current: dict, base: Plan, as_written: Plan, replan, budget_gib: float, margin: float,
        carried: list[tuple] = (), notes: list[str] | None = None, config: str | None = None,
        progress=None, on_node=None) -> dict:
    """`plan --fit`'s result: `search` over `replan(change, gpus) -> Plan | None`, the diff against `current`,
    and when nothing fits the smallest layout and the fewest devices within the budget (`fewest_devices`), on cpu
    with the line saying where the model's state alone exceeds the machines planned (`suggestions.machine_too_small`).

    `base` is the plan every candidate starts from, `as_written` the file's own (the "before"); `carried` is
    (key, old, new) for the changes every candidate already has (fp16 where the device has no bf16), the head of the
    chosen layout's diff and of "faster"'s (`faster_over_budget`, said where it is not the file as written on the
    device); `on_node`: the plans with fewer processes a machine (`machines.fewer_a_machine`), searched on cpu where
    no count fits."""
    notes, replan = list(notes or []), remembered(replan)
    by_speed = base.device.peak_tflops is not None
    if not by_speed:
        notes.append(f"speed: no estimate ({base.device.peak_source}; --peak_tflops gives one), so of the "
                     f"layouts that fit the one with the fewest changes is chosen, not the fastest")
    found = search(current, base, replan, budget_gib, progress=progress)
    best, small = found["best"], found["smallest"]
    out = {"config": config, "device": dataclasses.asdict(base.device), "gpus": base.gpus, "margin": margin,
           "experts": base.model.experts,
           "budget_gib": budget_gib, "mfu": base.mfu, "global_batch": base.global_batch,
           "total_tokens": base.total_tokens, "tried": found["tried"], "valid": found["valid"],
           "skipped": found["skipped"],
           "before": {"memory_gib": as_written.memory_gib, "startup_gib": as_written.startup_gib,
                      "least_gib": as_written.least_gib, "speed": speed(as_written)},
           "after": None, "change": None, "diff": [], "eval": None, "smallest": None, "more_devices": None,
           "machine": None, "notes": notes, "faster": None, "kept": None,
           "ranked_by": "speed" if by_speed else "fewest changes"}
    if best is not None:  # its speed as `plan` of the fitted file would qualify it (`plan.too_small_note`)
        out["notes"] = notes + [n for n in best["report"].notes if n.startswith(TOO_SMALL) and n not in notes]
        evaluation = fit_eval(current, best, replan, budget_gib, as_written.parallel.data_ranks)
        change = {**best["change"], **evaluation.get("change", {})}
        out.update(after={"memory_gib": best["report"].memory_gib, "startup_gib": best["report"].startup_gib,
                          "speed": best["speed"], "bound": traffic_bound(best["report"], best["speed"])},
                   change={**{k: v for k, _, v in carried}, **change},
                   diff=list(carried) + diff(current, change), eval=evaluation or None)
        over = found["faster"]  # why not the fastest: its need against the budget, its keys as the answer's are
        moved = list(carried) + diff(current, over["change"]) if over is not None else []
        if over is not None and (moved or not over["on_device"]):  # (else the file as written, which the over-
            # budget line already names with its need: `fit_report.format_fit`)
            out["faster"] = {"diff": moved, "least_gib": over["report"].least_gib, "speed": over["speed"],
                             "on_device": over["on_device"]}
        return out
    if small is not None:
        out["smallest"] = {"change": small["change"], "diff": diff(current, small["change"]),
                           "memory_gib": small["report"].least_gib}
    out["more_devices"] = fewest_devices(current, base, replan, budget_gib, small)
    lean = None if out["more_devices"] or not machine_too_small(base) else (leanest(current, base, replan),
                                                                             budget_gib)
    fewer = None
    if lean is not None and on_node is not None:
        fewer = fewer_a_machine(current, base, budget_gib, lean[0], on_node, fewest_devices)
    out["machine"] = machine_too_small(base, lean, fewer)
    return out


def fewest_devices(current: dict, base: Plan, replan, budget_gib: float, small: dict | None) -> dict | None:
    """The fewest devices that fit within `budget_gib` (`suggestions.more_devices`, from the search's smallest
    layout `small` at `--gpus` and `fit_candidates.lean_layouts` at each count): `plan --fit`'s answer and `plan`'s
    first suggestion when nothing fits (one search, one answer). On cpu too where the model's state alone exceeds the
    machines planned (`suggestions.machine_too_small`): more machines add memory (each node its own). The layouts
    are judged at an evaluation of 1, so the answer carries `fit_eval`'s eval keys there (`with_eval`), the samples
    an evaluation reads being what the file as written reads on that many devices (what `--fit` re-run there keeps)."""
    scale = more_devices(base, [small] if small else [], replan, [small["change"]] if small else [],
                         budget_gib=budget_gib, lean=lambda world: fit_candidates.lean_layouts(
                             current, world, base.max_seq_length, base.model.experts, base.device.links.gpus_per_node))
    if scale is None:
        return None
    world = scale["gpus"]
    r = replan(scale["change"], world)
    there = budget_gib * r.device.memory_gib / base.device.memory_gib  # (on cpu a process's share: `within_budget`)
    as_written = replan({}, world, layout=False)  # (`--fit` re-run there keeps the samples the file reads there)
    ranks = as_written.parallel.data_ranks if as_written is not None else r.parallel.data_ranks
    before = base.eval_batch * current.get("eval_iters", 1) * base.parallel.data_ranks  # (on the devices asked for)
    change, why = with_eval(current, scale["change"], r, lambda c: replan(c, world), there, ranks, before)
    return scale if change == scale["change"] else {**scale, "change": change, "why": scale["why"] + why}


def with_eval(current: dict, change: dict, report: Plan, replan, budget_gib: float, file_ranks: int,
              before: int | None = None) -> tuple[dict, str]:
    """`change` with `fit_eval`'s eval keys for the layout it plans to (`report`), and what its line adds for them
    (`fit_report.eval_reasons`, as `--fit`'s eval line says them; "" where the file's eval keys stay): the layouts
    are searched at an evaluation of 1 (`Plan.least_gib`), so the file's eval batch may be over the budget there, and
    `plan`'s suggestions name what `--fit` sets (one answer). `before`: the samples the file's evaluation reads on
    the devices asked for, where `report` is on more (`fewest_devices`)."""
    e = fit_eval(current, {"change": change, "report": report}, replan, budget_gib, file_ranks)
    if "change" not in e:
        return change, ""
    world = report.gpus if before is not None else None
    return {**change, **e["change"]}, "; --fit's eval keys there: " + " and ".join(
        eval_reasons(e, budget_gib, world, before))


def remembered(replan):
    """`replan(change, world, layout=True)` that plans each memory-only question (`layout=False`) once: the count
    search (`suggestions.more_devices`) asks whether a count fits, stopping at the first layout that does, then for
    every layout at the count it found, and where no count fits `leanest` asks for the very layouts it planned on
    MAX_DEVICES (a `Plan` is frozen, so one serves each); the rest is passed on, as `search` plans each of its
    layouts once anyway."""
    kept: dict[tuple, Plan | None] = {}

    def again(change: dict, *world: int, layout: bool = True):
        if layout:
            return replan(change, *world)
        key = (tuple(sorted((k, repr(v)) for k, v in change.items())), world)
        if key not in kept:
            kept[key] = replan(change, *world, layout=False)
        return kept[key]

    return again


def leanest(current: dict, base: Plan, replan, world: int = MAX_DEVICES) -> Plan | None:
    """The layout of `fit_candidates.lean_layouts` on `world` devices that needs the least (`Plan.least_gib`), or
    None: what `plan` and `--fit` name when the count search found no number of devices up to `world` that fits.
    Where its evaluation of 1 sample is what needs the most, planned at that eval batch, so that its parts are the
    ones named (`suggestions.machine_too_small`)."""
    plans = ((change, replan(change, world, layout=False)) for change in fit_candidates.lean_layouts(
        current, world, base.max_seq_length, base.model.experts, base.device.links.gpus_per_node))
    change, r = min(((c, r) for c, r in plans if r is not None), key=lambda cr: cr[1].least_gib, default=(None, None))
    if r is not None and r.eval_batch > 1 and (r.eval_least_gib or 0.0) > r.peak_gib:
        return replan({**change, "per_device_eval_batch_size": 1}, world, layout=False) or r
    return r


def fit_eval(current: dict, best: dict, replan, budget_gib: float, file_ranks: int = 1) -> dict:
    """The evaluation of the chosen layout (`planning.eval_memory`: a forward of per_device_eval_batch_size samples
    beside what the step leaves allocated) within the budget: {} when the run does not evaluate; else its batch and
    peak, and where the file's batch is over the budget the largest smaller one under it ("change"). An evaluation
    reads the file's samples: eval batch x eval_iters x the file's `file_ranks` data ranks (as a resume keeps them,
    `orchestration.resumed`), eval_iters set for the layout's data ranks; where no batch makes that count, the same
    samples per data rank ("per_rank"). The search counts an eval of 1 (`Plan.least_gib`), so one fits."""
    r = best["report"]
    if r.eval_memory_gib is None:
        return {}
    ranks, iters = r.parallel.data_ranks, current.get("eval_iters", 1)
    on = " and ".join(k for k in ("do_eval", "do_predict") if current.get(k)) or "do_eval"  # (what to turn off)
    out = {"batch": r.eval_batch, "memory_gib": r.eval_memory_gib, "fits": r.eval_memory_gib <= budget_gib, "key": on}
    was = {"batch": r.eval_batch, "iters": iters, "memory_gib": r.eval_memory_gib, "ranks": file_ranks,
           "samples": r.eval_batch * iters * file_ranks}
    per_rank = was["samples"] % ranks != 0
    share = r.eval_batch * iters if per_rank else was["samples"] // ranks  # a rank's samples an evaluation
    for batch in (b for b in range(r.eval_batch, 0, -1) if share % b == 0):
        keys = {"per_device_eval_batch_size": batch, "eval_iters": share // batch}
        got = r if batch == r.eval_batch else replan({**best["change"], **keys})
        if got is None or got.eval_memory_gib is None or got.eval_memory_gib > budget_gib and batch > 1:
            continue
        keys = {k: v for k, v in keys.items() if v != {"per_device_eval_batch_size": r.eval_batch,
                                                       "eval_iters": iters}[k]}
        out.update(batch=batch, memory_gib=got.eval_memory_gib, fits=got.eval_memory_gib <= budget_gib)
        if keys:
            out.update(change=keys, was={**was, "per_rank": per_rank, "layout_ranks": ranks})
        break
    return out


def diff(current: dict, change: dict) -> list[tuple[str, object, object]]:
    """(key, old, new) for every key the change sets to a new value, in a stable order."""
    order = ("tensor_parallel_degree", "sequence_parallel", "pipeline_parallel_degree", "context_parallel_degree",
             "expert_parallel_degree", "sharding", "sharding_parallel_degree", "per_device_train_batch_size",
             "gradient_accumulation_steps", "recompute", "recompute_granularity", "use_flash_attention",
             "per_device_eval_batch_size", "eval_iters")
    return [(k, current.get(k), change[k]) for k in order if k in change and change[k] != current.get(k)]
