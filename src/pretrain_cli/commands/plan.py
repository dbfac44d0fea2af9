"""`pretrain-cli plan`: memory, FLOPs, tokens, checkpoint size and time for an argument file, before any GPU time.

Resolves the file exactly as `train` does, but for a target (`--device`, `--gpus`) instead of this
machine, so GPU precision (fp16/bf16, O1/O2), flash attention and sharding apply even when planning
on a laptop. Never imports Paddle, never opens the data or the tokenizer.
"""
from __future__ import annotations

import argparse
import json

from pretrain_cli.errors import UserError
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


def _fmt(v) -> str:
    return "true" if v is True else "false" if v is False else str(v)


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
    return run, cfg, [f"{m} (plan models it anyway)" for m in not_yet_supported(run)]


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
    out["notes"] = notes + out["notes"]
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


def main(ns: argparse.Namespace) -> int:
    r = plan(ns.config, ns.overrides, ns.device, ns.gpus, ns.mfu, peak_tflops=ns.peak_tflops)
    print(json.dumps(r, indent=2) if ns.json else format_report(r))
    return 0
