"""`plan --fit`'s section of text: the budget, the key diff, memory, speed and time before and after, the
evaluation, what bounds the speed, and when nothing fits the smallest layout and the fewest devices; from the dict
`planning.fit.fit` returns (`plan --fit --json` prints that dict), so the text and the JSON say one thing."""
from __future__ import annotations

import json

from pretrain_cli.counts import count


def _gib(x: float) -> str:
    return f"{x:.2f} GiB"


def _tok(sp: dict) -> str:
    return f"{sp['tokens_per_sec']:,.0f} tokens/s" if sp["tokens_per_sec"] is not None else "tokens/s unknown (no peak)"


def _run_time(f: dict, *speeds: dict) -> str:
    """The "how long" of a fit: the run's tokens (max_steps, or --tokens) at each predicted speed, in hours and days;
    "" without a speed (no peak). A file that does not fit as written has no time before: its speed is of a run
    that cannot start (DeepSeek-V3 as written on 208 H100: 7.7 days, beside the fitted layout's 63.2)."""
    if not f.get("total_tokens") or any(sp["tokens_per_sec"] is None for sp in speeds):
        return ""
    hours = [f["total_tokens"] / sp["tokens_per_sec"] / 3600 for sp in speeds]
    days = f" ({' -> '.join(f'{h / 24:,.1f}' for h in hours)} days)" if max(hours) >= 48 else ""
    alone = "; as written the file does not fit: no time before" if f["diff"] and len(speeds) == 1 else ""
    return (f"\n  time for {f['total_tokens']:,} tokens at that speed: {' -> '.join(f'{h:,.1f} h' for h in hours)}"
            f"{days}{alone}")


def format_fit(f: dict) -> str:
    """The `plan --fit` section: budget, the key diff (and with `-o` the command line's keys it writes, "given"),
    memory and tokens/s before and after: no speed before where the file as written does not fit the device (it
    cannot start), and where it fits the device but not the budget, a line saying so (why a slower layout, or why
    nothing fits though the file runs)."""
    dev = f["device"]
    lines = [f"fit: {f['gpus']} x {dev['name']} ({dev['memory_gib']:.1f} GiB each), safety margin "
             f"{f['margin'] * 100:g}% -> budget {_gib(f['budget_gib'])} per device; {f['valid']} layouts "
             f"train can run of {f['tried']} planned (micro-batch x accumulation keeping the global batch of "
             f"{f['global_batch']}, recompute, flash attention, sharding stage, tensor-parallel, pipeline"
             + (", context-parallel or expert-parallel degree)" if f.get("experts")
                else " or context-parallel degree)")
             + (f"; {f['skipped']} more skipped: layouts whose state alone, or a smaller micro-batch of them, is "
                f"over the budget"
                if f.get("skipped") else "")]
    ln = dev["links"]
    if f["gpus"] > 1:  # one device sends nothing
        lines.append(f"  links per GPU: in-node {ln['in_node_gbps']:g} GB/s ({ln['source']}), cross-node "
                     f"{ln['cross_node_gbps']:g} GB/s; {count(ln['gpus_per_node'], 'GPU')} per node")
    ran = max(f["before"]["memory_gib"], f["before"]["startup_gib"]) <= dev["memory_gib"]  # a speed to compare
    before = (f"{_gib(f['before']['memory_gib'])} (start-up {_gib(f['before']['startup_gib'])})"
              + (f", {_tok(f['before']['speed'])}" if ran else ""))
    given = [f"    {k}: {json_value(old)} -> {json_value(new)} ({where})" for k, old, new, where in f.get("given", [])]
    over = ran and f["before"].get("least_gib", 0.0) > f["budget_gib"]  # fits the device, not the budget
    over_line = (f"  as written the file fits the device but needs {_gib(f['before'].get('least_gib', 0.0))} per "
                 f"device (step, start-up or an evaluation of 1), over the {_gib(f['budget_gib'])} budget")
    if f["after"] is None:
        need = f["smallest"]
        lines.append(f"  nothing fits: the current layout needs {before}")
        if over:  # why "nothing" though it runs: a smaller --margin keeps less free
            lines.append(f"{over_line}: it may run as written with less than the {f['margin'] * 100:g}% margin free "
                         f"(--margin)")
        if need is not None:
            change = ", ".join(f"{k} {json_value(v)}" for k, _, v in need["diff"]) or "no change"
            lines.append(f"  the smallest layout ({change}) needs {_gib(need['memory_gib'])} per device: a device "
                         f"with at least {_gib(need['memory_gib'] / (1 - f['margin']))} (with the margin)")
        if f.get("machine"):
            lines.append(f"  {f['machine']}")
        if f.get("more_devices"):
            m = f["more_devices"]
            change = ", ".join(f"{k} {json_value(v)}" for k, v in m["change"].items()) or "no key changed"
            per = dev["links"]["gpus_per_node"]
            nodes = f" ({m['gpus'] // per} nodes of {per})" if m["gpus"] > per else ""
            lines.append(f"  or more devices: --gpus {m['gpus']}{nodes} with {change} -> {_gib(m['memory_gib'])} "
                         f"per device (the global batch grows with the data ranks; re-run --fit with --gpus "
                         f"{m['gpus']})")
        return "\n".join(lines)
    if not f["diff"]:
        lines.append(f"  no change: {_kept(f) or 'the file is already the fastest layout that fits'} ({before})"
                     + _run_time(f, f["before"]["speed"]))
        lines += ["  changes (old -> new), from the command line:", *given] if given else []
        if f.get("faster"):  # (as --json's "faster" says it)
            lines.append(_faster_line(f["faster"], f["budget_gib"], dev["memory_gib"]))
        return "\n".join(lines)
    lines.append("  changes (old -> new):")
    lines += [f"    {k}: {json_value(old)} -> {json_value(new)}" for k, old, new in f["diff"]] + given
    lines += [f"  layout: {_kept(f)}"] if f.get("kept") else []
    lines.append(f"  memory per device: {_gib(f['before']['memory_gib'])} -> {_gib(f['after']['memory_gib'])} "
                 f"(budget {_gib(f['budget_gib'])})")
    if over:  # why it changes, even for a slower layout
        tps = f["before"]["speed"]["tokens_per_sec"], f["after"]["speed"]["tokens_per_sec"]
        lines.append(over_line + (": the fastest layout within it is slower than the file's" if None not in tps
                                  and tps[1] < tps[0] else ""))
    lines.append(f"  start-up per device: {_gib(f['before']['startup_gib'])} -> {_gib(f['after']['startup_gib'])} "
                 f"(what a rank builds + the block being created; within the budget too)")
    if f.get("eval"):
        lines.append(_eval_line(f["eval"], f["budget_gib"]))
    speeds = f"{_tok(f['before']['speed'])} -> {_tok(f['after']['speed'])} (" if ran else \
        f"{_tok(f['after']['speed'])} (as written the file does not fit: no speed before; "
    lines.append(f"  predicted speed: {speeds}FLOPs with "
                 f"recompute / (peak x MFU {f['mfu']:.2f}), pipeline bubble, + TP/PP/DP/ZeRO-3/CP"
                 f"{'/EP' if f.get('experts') else ''} traffic over "
                 f"the link each group uses)" + _run_time(f, *([f["before"]["speed"]] if ran else []),
                                                          f["after"]["speed"]))
    if f["after"].get("bound"):
        lines.append(_bound_line(f["after"]["bound"]))
    if f.get("faster"):
        lines.append(_faster_line(f["faster"], f["budget_gib"], dev["memory_gib"]))
    return "\n".join(lines)


def _kept(f: dict) -> str:
    """Why the file's layout is the answer though a faster one fits (`planned._kept`: the predicted gain is under
    its threshold, `planned.KEEP_WITHIN`), or "" where it is not. The line calls the threshold a policy, so it is
    not read as the planner's error: its times are not measured against GPUs."""
    k = f.get("kept")
    if not k:
        return ""
    change = ", ".join(f"{key} {json_value(v)}" for key, _, v in k["diff"])
    return (f"the file's layout is within {k['gain']:.1%} of the fastest planned ({change}: {_tok(k['speed'])}), "
            f"and a predicted gain under {k['within']:.0%} does not change the file's degrees (a stated policy, not "
            f"the planner's measured error on GPUs): kept")


def _faster_line(x: dict, budget: float, device_gib: float) -> str:
    """Why not a faster layout (`fit.faster_over_budget`): the fastest planned within the device's memory, else the
    leanest faster one, its keys, speed, and need (step, start-up or an evaluation of 1, what the search compares)
    against the budget. `fit.fit` gives none where it is the file as written on the device: the over-budget line
    ("as written the file fits the device but needs ...") says that already."""
    change = ", ".join(f"{k} {json_value(v)}" for k, _, v in x["diff"]) or "the file's layout"
    which = (f"the fastest layout planned within the device's {_gib(device_gib)}" if x["on_device"] else
             f"every faster layout planned needs more than the device's {_gib(device_gib)}; the leanest")
    return (f"  not chosen: {which} ({change}), {_tok(x['speed'])}, needs {_gib(x['least_gib'])} of the "
            f"{_gib(budget)} budget per device")


def _bound_line(b: dict) -> str:
    """Why the chosen layout is slow when its traffic outweighs its compute (`speed.traffic_bound`): its largest
    term; docs/PLAN.md says what each term is and which overlap is assumed."""
    top, rest = b["terms"][0], sum(t["seconds"] for t in b["terms"][1:])
    terms = f"{top['name']} {top['seconds']:.3g} s over {top['link']}"
    terms += f", other traffic {rest:.3g} s" if rest else ""
    return (f"  speed bound: traffic, {b['traffic_share']:.0%} of a {b['step_seconds']:.3g} s step ({terms}; compute "
            f"{b['compute_seconds']:.3g} s): mfu as train logs it {b['logged_mfu']:.3f}; faster links "
            f"(--cross_node_gbps) or more devices help")


def _eval_line(e: dict, budget: float) -> str:
    """The fit's evaluation: its peak at the eval batch kept or lowered, and why the eval keys moved (`eval_reasons`,
    the clauses `plan`'s suggestions say too)."""
    at = f"{_gib(e['memory_gib'])} at per_device_eval_batch_size {e['batch']}"
    if e.get("change"):
        at += ": " + " and ".join(eval_reasons(e, budget))
    tail = "" if e["fits"] else f"; still over the budget at 1: set {e['key']} false or evaluate on larger devices"
    return f"  eval per device (a forward without gradients beside the step's state): {at}{tail}"


def eval_reasons(e: dict, budget: float, world: int | None = None, before: int | None = None) -> list[str]:
    """Why `fit.fit_eval`'s result `e` changes the eval keys, a clause a key, for `--fit`'s eval line and `plan`'s
    suggestions alike: the eval batch lowered because the file's is over the budget (with its GiB) or (within it)
    does not divide a data rank's samples; eval_iters set so the layout's data ranks read the samples the file's do
    (the same per data rank where no whole share makes them). `world`, `before`: a layout on more devices than the
    file is planned on (`fit.fewest_devices`), where the file's samples are those it reads on `world` devices, and
    `before` those it reads on the devices asked for: an evaluation grows with the data ranks as the global batch
    does, said where it does."""
    w, c, out = e["was"], e["change"], []
    if "per_device_eval_batch_size" in c:
        out.append(f"per_device_eval_batch_size {w['batch']} -> {e['batch']} (the file's {w['batch']} "
                   + (f"needs {_gib(w['memory_gib'])}, over the {_gib(budget)} budget)" if w["memory_gib"] > budget
                      else f"does not divide a data rank's {e['batch'] * c.get('eval_iters', w['iters'])} samples)"))
    if "eval_iters" in c:
        on = f" on {count(world, 'device')}" if world is not None else ""
        why = (f"the same {w['batch'] * w['iters']} samples per data rank" if w["per_rank"] else
               f"the file's {w['samples']:,} samples an evaluation{on}, {w['batch']} x {w['iters']} x its "
               f"{count(w['ranks'], 'data rank')}, over the layout's {count(w['layout_ranks'], 'data rank')}")
        if before is not None and not w["per_rank"] and before != w["samples"]:
            why += (f"; an evaluation grows with the data ranks as the global batch does: {before:,} -> "
                    f"{w['samples']:,} samples")
        out.append(f"eval_iters {w['iters']} -> {c['eval_iters']} ({why})")
    return out


def json_value(v) -> str:
    return json.dumps(v)
