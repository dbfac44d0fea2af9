"""What every tracker is given of a metrics.jsonl record: its numbers as `<kind>/<key>` scalars. One place, so the
file trackers (`trackers`) and wandb (`trackers_wandb`) name and split the values alike.
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
