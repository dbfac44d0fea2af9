"""What every tracker is given of a metrics.jsonl record: its numbers as `<kind>/<key>` scalars. One place, so the
file trackers (`trackers`) and wandb (`trackers_wandb`) name and split the values alike.

`train/peak_tflops_per_device` is one of them though it is flat within a launch: a resume on another layout steps
it exactly where `train/mfu` changes what it is a share of (a CPU's peak per process halves with two processes),
and the trackers hold that peak nowhere else (their `config` text is args.json: a `peak_tflops` given, or null).
"""
from __future__ import annotations


def _number(val) -> bool:
    return isinstance(val, (int, float)) and not isinstance(val, bool)


def scalars(record: dict) -> dict:
    """The numeric values of one metrics.jsonl record as `<kind>/<key>` -> float; a list of numbers (a MoE
    model's per-layer expert load) as one series per entry, `<kind>/<key>/<index>`."""
    out = {}
    for key, val in record.items():
        if key in ("kind", "step", "time"):
            continue
        if _number(val):
            out[f"{record['kind']}/{key}"] = float(val)
        elif isinstance(val, list) and val and all(_number(v) for v in val):
            out.update({f"{record['kind']}/{key}/{i}": float(v) for i, v in enumerate(val)})
    return out
