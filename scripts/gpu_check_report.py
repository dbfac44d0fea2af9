"""Measured vs planned for scripts/gpu_check.sh: steady-state tokens/s, MFU and peak memory of a `train` run
(its metrics.jsonl) next to what `pretrain-cli plan --json` predicted for the same argument file.

    python scripts/gpu_check_report.py plan.json metrics.jsonl [--skip N]
"""
from __future__ import annotations

import argparse
import json
import statistics


def report(plan: dict, records: list[dict], skip: int = 5) -> str:
    train = [r for r in records if r.get("kind") == "train" and r["step"] > skip]
    if not train:
        raise SystemExit(f"gpu_check_report: no train records after step {skip} in metrics.jsonl; run more steps")
    tok = statistics.median(r["tokens_per_sec"] for r in train)
    mfus = [r["mfu"] for r in train if isinstance(r.get("mfu"), (int, float))]
    peak = max(r.get("max_memory_allocated", 0.0) for r in train)
    eta = plan["eta_hours"]  # null where the plan has no time: no peak, or a layout it says does not fit
    planned = f"{plan['tokens_per_step'] * plan['max_steps'] / (eta * 3600):>10.0f}" if eta else f"{'none':>10}"
    mfu = f"{statistics.median(mfus):>10.1%}" if mfus else f"{'unknown':>10}"
    # train's mfu (model FLOPs over the wall time) beside the plan's prediction of that same figure, not beside the
    # kernels' share plan assumes (`mfu`), to which the plan adds bubble and traffic
    logged = plan.get("logged_mfu")
    return "\n".join([
        f"{'':22} {'measured':>10} {'plan':>10}",
        f"{'tokens/s':22} {tok:>10.0f} {planned}   (median of steps > {skip}; plan assumes the kernels reach "
        f"{plan['mfu']:.0%} of peak on {plan['device']['name']}, then adds bubble and traffic)",
        f"{'mfu (as train logs it)':22} {mfu} " + (f"{logged:>10.1%}" if logged is not None else f"{'none':>10}"),
        f"{'peak memory (GiB)':22} {peak:>10.2f} {plan['memory_gib']:>10.2f}   (measured: max_memory_allocated)",
        f"fits (plan): {plan['fits']}",
    ])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("plan")
    ap.add_argument("metrics")
    ap.add_argument("--skip", type=int, default=5, help="warm-up steps left out of the medians")
    a = ap.parse_args(argv)
    with open(a.plan, encoding="utf-8") as f:
        plan = json.load(f)
    with open(a.metrics, encoding="utf-8") as f:
        records = [json.loads(line) for line in f if line.strip()]
    print(report(plan, records, a.skip))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
