"""`pretrain-cli plan`: memory, FLOPs, tokens, checkpoint size and time for an argument file, before any GPU time.

Resolves the file exactly as `train` does, but for a target (`--device`, `--gpus`) instead of this
machine, so GPU precision (fp16/bf16, O1/O2), flash attention and sharding apply even when planning
on a laptop. Never imports Paddle, never opens the data or the tokenizer. `--fit` (`fit`) re-resolves
every candidate layout of `planning.fit` the same way and keeps the fastest that fits; `-o` writes it.
"""
from __future__ import annotations

import argparse
import json

from pretrain_cli.errors import UserError
from pretrain_cli.planning import fit as fit_search
from pretrain_cli.planning import hardware
from pretrain_cli.planning.plan import MFU_FP32, MFU_HALF, Device, format_report, more_devices, report, suggest

DEFAULT_DEVICE = "A100-80GB"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", default=DEFAULT_DEVICE,
                        help=f"target accelerator, e.g. A100-80GB, H100, V100-16GB, or cpu (known: "
                             f"{', '.join(d.name for d in hardware.DEVICES.values())}; default: %(default)s)")
    parser.add_argument("--gpus", type=int, default=1, help="devices (processes) in the run (default: %(default)s)")
    parser.add_argument("--mfu", type=float, default=None,
                        help=f"assumed model-FLOPs utilisation for the ETA (default: {MFU_HALF} with fp16/bf16, "
                             f"{MFU_FP32} in fp32)")
    parser.add_argument("--peak_tflops", type=float, default=None,
                        help="dense peak TFLOPS per device for the ETA; wins over the file's peak_tflops and the "
                             "hardware table (default: the table's peak for --device and the run's precision)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the report")
    parser.add_argument("--fit", action="store_true",
                        help="search micro-batch/accumulation (same global batch), recompute, flash attention, "
                             "sharding stage and tensor-parallel degree for the fastest layout that fits --device")
    parser.add_argument("--margin", type=float, default=fit_search.DEFAULT_MARGIN,
                        help="with --fit: fraction of device memory kept free (default: %(default)s)")
    parser.add_argument("-o", "--output", default=None,
                        help="with --fit: write the fitted argument file here (the file with the changed keys; "
                             "default: none, only print)")


def target_device(name: str) -> Device:
    if name.lower() == "cpu":
        try:
            with open("/proc/meminfo", encoding="ascii") as f:
                kib = next(int(line.split()[1]) for line in f if line.startswith("MemTotal:"))
            mem = kib / 2**20
        except (OSError, StopIteration, ValueError):
            mem = float("nan")
        return Device(None, mem)
    dev = hardware.lookup(name)
    if dev is None:
        raise UserError(f"--device: unknown device {name!r}; use one of "
                        f"{', '.join(d.name for d in hardware.DEVICES.values())} or cpu")
    return Device(dev, float(dev.memory_gib))


def device_note(name: str, dev: Device) -> list[str]:
    """A note when `--device` named a family and the table picked one variant of it (H100 -> H100-SXM)."""
    if dev.entry is None or name.lower() == dev.entry.name.lower():
        return []
    e = dev.entry
    others = [d.name for d in hardware.DEVICES.values() if d.name.split("-")[0] == e.name.split("-")[0] and d != e]
    peak = f"{e.bf16_tflops or e.fp16_tflops:g} TFLOPS half precision" if (e.bf16_tflops or e.fp16_tflops) else ""
    return [f"device: --device {name} is planned as {e.name} ({e.memory_gib:g} GiB{', ' + peak if peak else ''})"
            + (f"; name {' or '.join(others)} for another variant" if others else "")]


def _fmt(v) -> str:
    return "true" if v is True else "false" if v is False else str(v)


PLANNED_ONLY = " (plan models it anyway)"  # the note on a layout `train` cannot run yet


def _resolve(config, overrides: list[str], device: Device, gpus: int):
    """(RunConfig, ModelConfig, notes) for the planned devices, by `train`'s own rules."""
    from pretrain_cli.config.prepare import build_model_config, load_arguments
    from pretrain_cli.config.resolve import not_yet_supported, resolve
    from pretrain_cli.config.run_config import Target

    args = load_arguments(config, overrides)
    _, cfg = build_model_config(args)
    target = Target(device="gpu" if device.is_gpu else "cpu", world_size=gpus,
                    gpu_name=device.entry.name if device.entry else None, planned=True)
    run = resolve(args, cfg, target)
    return run, cfg, [f"{m}{PLANNED_ONLY}" for m in not_yet_supported(run)]


def plan(config: str | None, overrides: list[str] | None = None, device: str = DEFAULT_DEVICE, gpus: int = 1,
         mfu: float | None = None, suggest_changes: bool = True, baseline_bytes: float = 0.0,
         peak_tflops: float | None = None) -> dict:
    """The report `plan --json` prints, with suggestions when the run does not fit."""
    if gpus < 1:
        raise UserError(f"--gpus: must be >= 1, got {gpus}")
    if mfu is not None and not 0 < mfu <= 1:
        raise UserError(f"--mfu: must be in (0, 1], got {mfu}")
    if peak_tflops is not None and not (0 < peak_tflops < float("inf")):
        raise UserError(f"--peak_tflops: must be a number > 0 (dense TFLOPS per device), got {peak_tflops}")
    overrides = list(overrides or [])
    dev = target_device(device)
    run, cfg, notes = _resolve(config, overrides, dev, gpus)
    out = report(run, cfg, dev, mfu, baseline_bytes, config, peak_tflops)
    out["notes"] = notes + device_note(device, dev) + out["notes"]
    if suggest_changes and not out["fits"]:
        def replan(change: dict, world: int = gpus):
            extra = [tok for k, v in change.items() for tok in (f"--{k}", _fmt(v))]
            try:
                return plan(config, overrides + extra, device, world, mfu, False, baseline_bytes, peak_tflops)
            except UserError:
                return None

        out["suggestions"] = suggest(run, out, replan)
        if not any(s["fits"] for s in out["suggestions"]):  # nothing fits these devices: more of them, first
            scale = more_devices(out, out["suggestions"], replan)
            out["suggestions"][:0] = [scale] if scale else []
    return out


SEARCHED = ("per_device_train_batch_size", "gradient_accumulation_steps", "recompute", "recompute_granularity",
            "use_flash_attention", "sharding", "tensor_parallel_degree", "pipeline_parallel_degree")


def fit(config: str | None, overrides: list[str] | None = None, device: str = DEFAULT_DEVICE, gpus: int = 1,
        mfu: float | None = None, margin: float = fit_search.DEFAULT_MARGIN, peak_tflops: float | None = None,
        budget_gib: float | None = None, baseline_bytes: float = 0.0) -> dict:
    """The fastest layout that fits (`planning.fit.search`), every candidate re-resolved by `train`'s rules.

    `budget_gib` replaces device memory × (1 − margin) (the out-of-memory hint of `train` passes a lower one).
    """
    from pretrain_cli.config.prepare import load_arguments
    from pretrain_cli.config.resolve import degree

    if not 0 <= margin < 1:
        raise UserError(f"--margin: must be in [0, 1) (a fraction of device memory), got {margin}")
    overrides = list(overrides or [])
    base = plan(config, overrides, device, gpus, mfu, False, baseline_bytes, peak_tflops)
    as_written = base  # the file as written: its memory, speed and warnings are the "before"
    args = load_arguments(config, overrides)
    notes = [n for n in base["notes"] if "WARNING" in n]
    precision = _precision_for(args, device)
    if precision:  # the search runs, and the fitted file trains, in the precision the device has
        overrides = overrides + [tok for k, v in precision.items() for tok in (f"--{k}", _fmt(v))]
        base = plan(config, overrides, device, gpus, mfu, False, baseline_bytes, peak_tflops)
        notes.append(f"bf16: {base['device']['name']} has no bf16 tensor cores, so the fitted layout runs fp16 "
                     f"(bf16: false, fp16: true; loss scaling keeps it stable)")
    by_speed = base["device"]["peak_tflops"] is not None
    if not by_speed:
        notes.append(f"speed: no estimate ({base['device']['peak_source']}; --peak_tflops gives one), so of the "
                     f"layouts that fit the one with the fewest changes is chosen, not the fastest")
    current = {k: args.get(k) for k in SEARCHED}
    current["tensor_parallel_degree"] = degree(current["tensor_parallel_degree"])
    current["pipeline_parallel_degree"] = max(current["pipeline_parallel_degree"], 1)

    def replan(change: dict, world: int = gpus):
        """The candidate's plan, or None when `train` would refuse it (resolve, or a layout it cannot run yet)."""
        extra = [tok for k, v in change.items() for tok in (f"--{k}", _fmt(v))]
        try:
            r = plan(config, overrides + extra, device, world, mfu, False, baseline_bytes, peak_tflops)
        except UserError:
            return None
        return None if any(n.endswith(PLANNED_ONLY) for n in r["notes"]) else r

    dev = base["device"]
    budget = dev["memory_gib"] * (1 - margin) if budget_gib is None else budget_gib
    found = fit_search.search(current, base, replan, budget, by_speed=by_speed)
    best, small = found["best"], found["smallest"]
    out = {"config": config, "device": dev, "gpus": gpus, "margin": margin, "budget_gib": budget, "mfu": base["mfu"],
           "link_gbps": fit_search.LINK_GBPS, "global_batch": base["tokens_per_step"] // base["max_seq_length"],
           "tried": found["tried"], "valid": found["valid"],
           "before": {"memory_gib": as_written["memory_gib"], "speed": fit_search.speed(as_written)},
           "after": None, "change": None, "diff": [], "smallest": None, "more_devices": None, "notes": notes,
           "ranked_by": "speed" if by_speed else "fewest changes"}
    if best is not None:
        change = {**precision, **best["change"]}
        out.update(after={"memory_gib": best["report"]["memory_gib"], "speed": best["speed"]}, change=change,
                   diff=[(k, args.get(k), v) for k, v in precision.items()] + fit_search.diff(current, best["change"]))
    else:
        if small is not None:
            out["smallest"] = {"change": small["change"], "diff": fit_search.diff(current, small["change"]),
                               "memory_gib": small["report"]["memory_gib"]}

        def within_budget(change: dict, world: int):
            r = replan(change, world)
            return None if r is None else {**r, "fits": r["memory_gib"] <= budget}

        out["more_devices"] = more_devices(base, [{"change": small["change"]}] if small else [], within_budget)
    return out


def _precision_for(args, device: str) -> dict:
    """The precision keys a fitted file needs on `device`: fp16 instead of bf16 where there is no bf16."""
    entry = hardware.lookup(device) if device.lower() != "cpu" else None
    if args.training.bf16 and not args.training.fp16 and entry is not None and entry.bf16_tflops is None:
        return {"bf16": False, "fp16": True}
    return {}


def write_fitted(config: str | None, overrides: list[str], change: dict, path: str) -> None:
    """The user's file (key order kept) with the command-line overrides and the fitted keys, published atomically."""
    from pretrain_cli import atomic
    from pretrain_cli.config.parser import load_json
    from pretrain_cli.config.prepare import load_arguments

    args = load_arguments(config, overrides)
    raw = load_json(config) if config is not None else {}
    for key, where in args.explicit.items():
        if where != "file":
            raw[key] = args.get(key)
    raw.update(change)
    atomic.write_text(path, json.dumps(raw, indent=4) + "\n")  # an OSError is one `error:` line, exit 1 (cli.py)


def main(ns: argparse.Namespace) -> int:
    if ns.output and not ns.fit:
        raise UserError("-o: writes the fitted file, so it needs --fit; add --fit")
    if ns.fit:
        f = fit(ns.config, ns.overrides, ns.device, ns.gpus, ns.mfu, ns.margin, ns.peak_tflops)
        if ns.output and f["after"] is not None:
            write_fitted(ns.config, ns.overrides, f["change"], ns.output)
        if not ns.json:
            print("\n".join(f"note: {n}" for n in f["notes"]))
        print(json.dumps(f, indent=2) if ns.json else fit_search.format_fit(f))
        if ns.output and f["after"] is not None and not ns.json:
            print(f"wrote {ns.output}: `pretrain-cli check {ns.output}` validates it, `train` runs it")
        return 0 if f["after"] is not None else 1
    r = plan(ns.config, ns.overrides, ns.device, ns.gpus, ns.mfu, peak_tflops=ns.peak_tflops)
    print(json.dumps(r, indent=2) if ns.json else format_report(r))
    return 0
