"""`plan --fit`: the fastest layout of a run that fits the device, found by re-planning every candidate.

A candidate is a set of argument-file key changes (micro-batch with the accumulation that keeps the global
batch, recompute granularity, flash attention, sharding stage, tensor-parallel or pipeline degree). This module only
proposes and ranks them: the caller (`orchestration.planned`) re-resolves the parsed arguments with each one
(`replan(change) -> report | None`, None when `config.resolve` refuses the layout), so every candidate is a
layout `train` runs and its memory is the memory model's, never a rule re-derived here. No Paddle, no config
import.

Speed model (docs/PLAN.md), per optimizer step on one device:
  compute = tokens per data rank × hardware FLOPs/token (with the recomputed forward) / tp / (peak × MFU)
  ZeRO-3  = accumulation steps × 3 × weight bytes × (S−1)/S / link     (gather for forward and for backward,
            reduce-scatter of the gradients, per micro-batch: the weights travel whole each time)
  TP      = accumulation steps × layers × n × 2(t−1)/t × b·s·hidden·c / link   (n = 4 all-reduces per layer:
            attention and MLP outputs, forward and backward; + 2 with `full`, + 1 with `full_attn` recompute)
  PP      = compute / P stages / (1 − bubble), bubble = (P−1)/(m+P−1) with m = accumulation steps (1F1B),
            + accumulation steps × 2 × b·s·hidden·c / link (one activation forward, its gradient back)
  CP      = compute / C (each rank holds s/C tokens), + accumulation steps × `memory.context_traffic_bytes`
            / link (per layer the K/V all-gather, again under full/full_attn recompute, and the dK/dV all-reduce);
            context-parallel candidates are tried from CONTEXT_MIN_SEQ tokens on
Data-parallel gradient traffic is the same for every candidate with the same data ranks and is left out.
Flash and math attention count the same FLOPs; among equally fast candidates the one running flash wins
(it is the faster kernel where it runs), then the one with fewer changes, then the larger micro-batch (fewer,
larger kernels per step: the per-micro-step overhead the FLOPs model leaves out), then the one with less memory.
"""
from __future__ import annotations

import itertools

from pretrain_cli.planning.memory import context_traffic_bytes

LINK_GBPS = 50.0  # effective collective bandwidth per device (GB/s): between PCIe 4.0 x16 and NVLink
NOMINAL_TFLOPS = 1.0  # ranks candidates when the device has no known peak (tokens/s is then not shown)
DEFAULT_MARGIN = 0.10  # of device memory kept free: allocator fragmentation and what the model misses
GRANULARITIES = (None, "core_attn", "full_attn", "full")  # least to most recompute
# shorter sequences' activations fit a device next to any layout's weights; below it CP only adds traffic
CONTEXT_MIN_SEQ = 8192


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def speed(r: dict, link_gbps: float = LINK_GBPS) -> dict:
    """Predicted seconds per optimizer step and tokens/s (whole run) for one planned layout."""
    par, m = r["parallel"], r["model"]
    tp, stage, deg = par["tp"], par["sharding_stage"], par["sharding_degree"]
    b, acc, s = r["micro_batch"], r["gradient_accumulation_steps"], r["max_seq_length"]
    peak = r["device"]["peak_tflops"] or NOMINAL_TFLOPS
    pp, cp = par.get("pp", 1), par.get("cp", 1)
    compute = b * acc * s * r["flops_per_token"]["hardware"] / tp / pp / cp / (peak * 1e12 * r["mfu"])
    half = r["precision"]["amp_dtype"] != "float32"
    link = link_gbps * 1e9
    comm = 0.0
    if pp > 1:
        compute /= 1 - par["pipeline_bubble"]
        comm += acc * 2 * b * s * m["hidden"] * (2 if half else 4) / link
    if stage == 3 and deg > 1:
        weight_bytes = r["params"]["total"] / tp * (2 if r["precision"]["amp_level"] == "O2" else 4)
        comm += acc * 3 * weight_bytes * (deg - 1) / deg / link
    if tp > 1:
        n = 4 + {"full": 2, "full_attn": 1}.get(r["recompute"], 0)
        comm += acc * m["layers"] * n * 2 * (tp - 1) / tp * b * s * m["hidden"] * (2 if half else 4) / link
    comm += acc * context_traffic_bytes(m, b, s, cp, 2 if half else 4, r["recompute"]) / link
    step = compute + comm
    known = r["device"]["peak_tflops"] is not None
    return {"step_seconds": step if known else None, "compute_seconds": compute if known else None,
            "comm_seconds": comm if known else None, "tokens_per_sec": r["tokens_per_step"] / step if known else None,
            "rank_seconds": step}


def candidates(current: dict, global_batch: int, gpus: int, seq_len: int = 0) -> list[dict]:
    """Every layout to try, as key changes against `current` (the file's values of the searched keys).

    Tensor-parallel degrees are the divisors of `gpus` (resolve refuses those that do not divide the heads, KV
    heads or intermediate size); for each, micro-batch × accumulation = global batch / data ranks, so a degree
    that leaves a fraction is skipped. Sharding stages are tried only when there are data ranks to shard over
    (or context-parallel ranks: ZeRO-1 shards over cp x sharding). Context-parallel degrees (the divisors of
    `gpus`, without TP or PP) from `seq_len` >= CONTEXT_MIN_SEQ on.
    """
    out = []
    flash = [current["use_flash_attention"]] + ([True] if not current["use_flash_attention"] else [])
    splits = [(tp, 1, 1) for tp in _divisors(gpus)] + [(1, pp, 1) for pp in _divisors(gpus) if pp > 1]  # no TP x PP
    if seq_len >= CONTEXT_MIN_SEQ:
        splits += [(1, 1, cp) for cp in _divisors(gpus) if cp > 1]
    for tp, pp, cp in splits:
        data_ranks = gpus // (tp * pp * cp)
        if global_batch % data_ranks:
            continue
        per_rank = global_batch // data_ranks
        stages = ["", "stage1"] + ([] if pp > 1 else ["stage2", "stage3"])  # fleet's stage 2/3 not with a pipeline
        stages = ["", "stage1"] if cp > 1 else stages if data_ranks > 1 else [current["sharding"]]
        for micro, gran, fa, stage in itertools.product(_divisors(per_rank), GRANULARITIES, flash, stages):
            want = {"per_device_train_batch_size": micro, "gradient_accumulation_steps": per_rank // micro,
                    "recompute": gran is not None, "use_flash_attention": fa, "sharding": stage,
                    "tensor_parallel_degree": tp if gpus > 1 else current["tensor_parallel_degree"],
                    "pipeline_parallel_degree": pp if gpus > 1 else current.get("pipeline_parallel_degree", 1),
                    "context_parallel_degree": cp if gpus > 1 else current.get("context_parallel_degree", 1)}
            if gran is not None:
                want["recompute_granularity"] = gran
            out.append({k: v for k, v in want.items() if current.get(k) != v})
    return out


def _layout(r: dict) -> tuple:
    """What a resolved candidate runs: candidates that resolve alike are one layout."""
    p = r["parallel"]
    return (r["micro_batch"], r["gradient_accumulation_steps"], r["recompute"], r["attention"], p["tp"],
            p["sharding_stage"], p["sharding_degree"], p.get("pp", 1), p.get("cp", 1))


def search(current: dict, base: dict, replan, budget_gib: float, link_gbps: float = LINK_GBPS,
           by_speed: bool = True) -> dict:
    """The fastest candidate whose predicted memory is within `budget_gib`, and the smallest candidate.
    `by_speed=False` (no speed estimate: the device has no known peak) ranks by fewest changes instead.

    Returns {"best": entry | None, "smallest": entry | None, "tried": n, "valid": n}; an entry is
    {"change", "report", "speed"}.
    """
    seen: dict[tuple, dict] = {}
    tried = 0
    for change in [{}] + candidates(current, base["tokens_per_step"] // base["max_seq_length"], base["gpus"],
                                    base["max_seq_length"]):
        tried += 1
        r = base if not change else replan(change)
        if r is None:
            continue
        key = _layout(r)
        if key in seen and len(seen[key]["change"]) <= len(change):
            continue
        seen[key] = {"change": change, "report": r, "speed": speed(r, link_gbps)}
    entries = list(seen.values())
    fitting = [e for e in entries if e["report"]["memory_gib"] <= budget_gib]
    best = min(fitting, key=lambda e: (round(e["speed"]["rank_seconds"], 9) if by_speed else 0,
                                       e["report"]["attention"] != "flash" if by_speed else 0,
                                       len(e["change"]), -e["report"]["micro_batch"], e["report"]["memory_gib"]),
               default=None)
    smallest = min(entries, key=lambda e: (e["report"]["memory_gib"], len(e["change"])), default=None)
    return {"best": best, "smallest": smallest, "tried": tried, "valid": len(entries)}


def fit(current: dict, base: dict, as_written: dict, replan, budget_gib: float, margin: float,
        carried: list[tuple] = (), notes: list[str] | None = None, config: str | None = None) -> dict:
    """`plan --fit`'s result: `search` over `replan(change, gpus) -> report | None`, the diff against `current`,
    and when nothing fits the smallest layout and the fewest devices (`plan.more_devices`) within the budget.

    `base` is the plan every candidate starts from, `as_written` the file's own (the "before"); `carried` is
    (key, old, new) for the changes every candidate already has (fp16 where the device has no bf16)."""
    from pretrain_cli.planning.plan import more_devices

    notes = list(notes or [])
    by_speed = base["device"]["peak_tflops"] is not None
    if not by_speed:
        notes.append(f"speed: no estimate ({base['device']['peak_source']}; --peak_tflops gives one), so of the "
                     f"layouts that fit the one with the fewest changes is chosen, not the fastest")
    found = search(current, base, replan, budget_gib, by_speed=by_speed)
    best, small = found["best"], found["smallest"]
    out = {"config": config, "device": base["device"], "gpus": base["gpus"], "margin": margin,
           "budget_gib": budget_gib, "mfu": base["mfu"], "link_gbps": LINK_GBPS,
           "global_batch": base["tokens_per_step"] // base["max_seq_length"],
           "tried": found["tried"], "valid": found["valid"],
           "before": {"memory_gib": as_written["memory_gib"], "speed": speed(as_written)},
           "after": None, "change": None, "diff": [], "smallest": None, "more_devices": None, "notes": notes,
           "ranked_by": "speed" if by_speed else "fewest changes"}
    if best is not None:
        out.update(after={"memory_gib": best["report"]["memory_gib"], "speed": best["speed"]},
                   change={**{k: v for k, _, v in carried}, **best["change"]},
                   diff=list(carried) + diff(current, best["change"]))
        return out
    if small is not None:
        out["smallest"] = {"change": small["change"], "diff": diff(current, small["change"]),
                           "memory_gib": small["report"]["memory_gib"]}

    def within_budget(change: dict, world: int):
        r = replan(change, world)
        return None if r is None else {**r, "fits": r["memory_gib"] <= budget_gib}

    out["more_devices"] = more_devices(base, [{"change": small["change"]}] if small else [], within_budget)
    return out


def diff(current: dict, change: dict) -> list[tuple[str, object, object]]:
    """(key, old, new) for every key the change sets to a new value, in a stable order."""
    order = ("tensor_parallel_degree", "pipeline_parallel_degree", "context_parallel_degree", "sharding", "per_device_train_batch_size",
             "gradient_accumulation_steps",
             "recompute", "recompute_granularity", "use_flash_attention")
    return [(k, current.get(k), change[k]) for k in order if k in change and change[k] != current.get(k)]


def _gib(x: float) -> str:
    return f"{x:.2f} GiB"


def _tok(sp: dict) -> str:
    return f"{sp['tokens_per_sec']:,.0f} tokens/s" if sp["tokens_per_sec"] is not None else "tokens/s unknown (no peak)"


def format_fit(f: dict) -> str:
    """The `plan --fit` section: budget, the key diff, memory and tokens/s before and after."""
    dev = f["device"]
    lines = [f"fit: {f['gpus']} x {dev['name']} ({dev['memory_gib']:.1f} GiB each), safety margin "
             f"{f['margin'] * 100:g}% -> budget {_gib(f['budget_gib'])} per device; {f['valid']} layouts "
             f"train can run of {f['tried']} tried (micro-batch x accumulation keeping the global batch of "
             f"{f['global_batch']}, recompute, flash attention, sharding stage, tensor-parallel, pipeline or "
             f"context-parallel degree)"]
    before = f"{_gib(f['before']['memory_gib'])}, {_tok(f['before']['speed'])}"
    if f["after"] is None:
        need = f["smallest"]
        lines.append(f"  nothing fits: the current layout needs {before}")
        if need is not None:
            change = ", ".join(f"{k} {json_value(v)}" for k, _, v in need["diff"]) or "no change"
            lines.append(f"  the smallest layout ({change}) needs {_gib(need['memory_gib'])} per device: a device "
                         f"with at least {_gib(need['memory_gib'] / (1 - f['margin']))} (with the margin)")
        if f.get("more_devices"):
            m = f["more_devices"]
            change = ", ".join(f"{k} {json_value(v)}" for k, v in m["change"].items())
            lines.append(f"  or more devices: --gpus {m['gpus']} with {change} -> {_gib(m['memory_gib'])} per device "
                         f"(the global batch grows with the data ranks; re-run --fit with --gpus {m['gpus']})")
        return "\n".join(lines)
    if not f["diff"]:
        lines.append(f"  no change: the file is already the fastest layout that fits ({before})")
        return "\n".join(lines)
    lines.append("  changes (old -> new):")
    lines += [f"    {k}: {json_value(old)} -> {json_value(new)}" for k, old, new in f["diff"]]
    lines.append(f"  memory per device: {_gib(f['before']['memory_gib'])} -> {_gib(f['after']['memory_gib'])} "
                 f"(budget {_gib(f['budget_gib'])})")
    lines.append(f"  predicted speed: {_tok(f['before']['speed'])} -> {_tok(f['after']['speed'])} (FLOPs with "
                 f"recompute / (peak x MFU {f['mfu']:.2f}), pipeline bubble, + ZeRO-3/TP/PP/CP traffic at "
                 f"{f['link_gbps']:g} GB/s)")
    return "\n".join(lines)


def json_value(v) -> str:
    import json

    return json.dumps(v)
