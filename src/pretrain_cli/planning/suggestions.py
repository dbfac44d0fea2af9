"""`plan`'s suggestions: the key changes that lower a run's memory, ranked by what each saves, each made minimal
(no key the fit does not need), and, when no setting fits the devices asked for, the fewest devices that fit.

Every candidate is re-planned through the caller's `replan` (which re-resolves the file with the change and calls
`plan.report`), so each saving is computed, not guessed, and this module needs only the `Plan` it reads.
"""
from __future__ import annotations

import dataclasses

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
    """Ranked key changes that lower memory; `replan(change) -> report | None` re-resolves the file with them."""
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


def minimal(change: dict, world: int, replan) -> tuple[dict, Plan]:
    """`change` (which fits on `world` devices) without each group of keys it still fits without, then with the
    lowest sharding stage that still fits: a suggestion names no key the fit does not need, so none whose effect is
    nil (a sharding stage over one data rank re-plans to the same memory, and is dropped)."""
    dropped = True
    while dropped:  # until no group can go: then none of the keys left can go alone
        dropped = False
        for group in _key_groups(change):
            fewer = {k: v for k, v in change.items() if k not in group}
            r = replan(fewer, world)
            if r is not None and r.fits:
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


def _key(change: dict) -> tuple:
    return tuple(sorted((k, repr(v)) for k, v in change.items()))


def _in_node(replan, per_node: int):
    """`replan` whose plans with tensor-parallel groups across nodes do not fit (`layout.tp_inside_node`)."""
    def in_node(change: dict, world: int, **kw):
        r = replan(change, world, **kw)
        return r if r is None or tp_inside_node(r.parallel.tp, world, per_node) else dataclasses.replace(r, fits=False)

    return in_node


def more_devices(base: Plan, singles: list[dict], replan, layouts: list[dict] = (), lean=None,
                 budget_gib: float | None = None) -> dict | None:
    """When no setting fits on the devices asked for: the fewest devices at which the run fits within `budget_gib`
    (device memory), re-planned with `replan(change, gpus)`, and the fewest keys it needs there (`minimal`).

    None fits on fewer devices than the model's state needs, every parameter's weights, gradients and AdamW state
    held once over them all (a checkpoint and the weights again: `Plan.checkpoint`), so the search starts there. At
    each of `device_counts` the file as it is, each sharding stage, the single-device savings (recompute, smaller
    micro-batch, …) alone and with stage3, each of `layouts` (the `--fit` search's smallest layout at `--gpus`),
    and `lean(gpus)`'s layouts (`fit.lean_layouts`: every tensor, pipeline, expert degree and sharding stage at its
    least memory). Then each whole number of nodes (within a node, each count) between the last count that did not
    fit and the first that did, fewest first, with the layouts that fit there: one that fits on fewer devices also
    fits on more (its state split over more ranks), not the other way round. A layout whose tensor-parallel groups
    would span nodes counts as not fitting (`layout.tp_inside_node`): more nodes with tp inside one are suggested
    instead (PaddleNLP's DeepSeek-V3 file at 8,192 tokens: tp 8 on 200 H100, not tp 16 on 192)."""
    # (the axes `config.refusals` refuses with ZeRO-3 are left out of the savings: pipeline, sequence and context
    # parallelism; a layout of `layouts` keeps them, as it was resolved with them)
    extra = {k: v for s in singles for k, v in s["change"].items() if k not in (
        "max_seq_length", "sharding", "pipeline_parallel_degree", "virtual_pp_degree", "sequence_parallel",
        "context_parallel_degree")}
    tries = [{}] + [{"sharding": f"stage{k}"} for k in (1, 2, 3)]
    tries += [extra, {"sharding": "stage3", **extra}] if extra else []
    tries += [dict(x) for x in layouts if x]
    per_node, budget = base.device.links.gpus_per_node, base.device.memory_gib if budget_gib is None else budget_gib
    least = (base.checkpoint.per_checkpoint_gib + base.checkpoint.parts_gib["weights"]) / budget  # (+ the gradients)
    replan = _in_node(replan, per_node)

    def fitting(changes: list[dict], world: int) -> list[dict]:
        seen, out = set(), []
        for change in list({_key(c): c for c in changes}.values()):  # each once, in order
            r = replan(change, world, layout=False)  # (memory only: no groups of ranks)
            if r is not None and r.fits and (r.parallel, r.micro_batch, r.recompute, r.attention) not in seen:
                seen.add((r.parallel, r.micro_batch, r.recompute, r.attention))
                out.append(change)
        return out

    below, found = base.gpus, []
    for world in device_counts(base.gpus, per_node):
        found = fitting(tries + (lean(world) if lean else []), world) if world >= least else []
        if found:
            break
        below = world
    if not found:
        return None
    for fewer in range(below + 1, world):  # what fits at `world`, on whole nodes fewer
        if fewer >= least and (fewer < per_node or fewer % per_node == 0) and (here := fitting(found, fewer)):
            world, found = fewer, here
            break
    change, r = minimal(min(found, key=len), world, replan)
    nodes = f" ({world // per_node} nodes of {per_node})" if world > per_node else ""
    why = f"fewest devices that fit{nodes}: no setting fits {base.gpus} x {base.device.name}"
    if "sharding" in change and r.parallel.sharding_stage:
        why += f"; {change['sharding']} shards over the {r.parallel.sharding_degree} data ranks of {world}"
    why += "; without any one of these keys it does not fit there" if change else "; the file as written fits there"
    if budget_gib is None and r.peak_gib > base.device.memory_gib * (1 - FIT_MARGIN):  # plan's count, not --fit's
        why += (f"; {r.peak_gib:.2f} of {base.device.memory_gib:g} GiB leaves less than `plan --fit`'s "
                f"{FIT_MARGIN:.0%} margin, so --fit asks for more devices")
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
