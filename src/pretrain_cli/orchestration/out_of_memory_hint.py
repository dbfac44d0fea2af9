"""`train`'s one line after running out of memory: where it ran out, and `plan --fit`'s layout for the run on the
device the driver names, under a budget below what failed (`out_of_memory_fit`), or why none is offered. Its one
caller is `commands.train`; the planning and the search are `orchestration.planned`'s. Never imports Paddle."""
from __future__ import annotations

from pretrain_cli.config.parser import Arguments
from pretrain_cli.errors import UserError
from pretrain_cli.orchestration.planned import fit, plan
from pretrain_cli.planning import fit as fit_search
from pretrain_cli.planning import hardware
from pretrain_cli.planning.fit_report import json_value
from pretrain_cli.planning.plan import target_device


def out_of_memory_line(args: Arguments, model_cfg, run, config_path: str | None, step: int,
                       gpu_name: str | None, peak: str | None = None) -> str:
    """`train`'s one line after running out of memory at `step` (0: building the run) of the resolved `run`:
    where (with the process's `peak` memory when given), and `plan --fit`'s layout under a budget below what
    failed. `gpu_name`: the driver's name (None on CPU), planned as its hardware-table entry."""
    where = f"out of memory at step {step}" if step else "out of memory before the first step (building the run)"
    where += f" (process peak {peak})" if peak else ""
    entry = hardware.lookup(gpu_name) if gpu_name is not None else None
    device = "cpu" if gpu_name is None else (entry.name if entry is not None else None)
    world = run.parallel.world_size
    how = f"pretrain-cli plan {config_path or '<args.json>'} --device {device or '<your GPU>'} --gpus {world} --fit"
    if device is None:
        return f"{where}; `{how}` finds a layout that fits (checkpoints are untouched)"
    try:
        predicted, f = out_of_memory_fit(args, model_cfg, device, world)
    except UserError:
        return f"{where}; `{how}` finds a layout that fits (checkpoints are untouched)"
    if f["after"] is None or not f["diff"]:
        return (f"{where} on {world} x {device}: no layout of this run is predicted to need less than "
                f"{predicted:.2f} GiB per device; use more devices or ones with more memory (`{how}`); "
                f"checkpoints are untouched")
    change = ", ".join(f"{k} {json_value(old)} -> {json_value(new)}" for k, old, new in f["diff"])
    return (f"{where} on {world} x {device}: top plan suggestion for this run: {change} (predicted "
            f"{predicted:.2f} -> {f['after']['memory_gib']:.2f} GiB per device; `{how} -o fitted.json` writes it); "
            f"checkpoints are untouched, re-run to resume from the last one")


def out_of_memory_fit(args: Arguments, model_cfg, device: str, gpus: int) -> tuple[float, dict]:
    """(the failed layout's predicted peak GiB per device, `fit` under 90 % of the smaller of it and the device's
    memory): the layout that failed needed more than the device has, whatever the estimate said. The peak is the
    larger of the steady-state step and start-up (`Plan.peak_gib`), so a run that ran out of memory while
    it was being built is re-fitted against its start-up too."""
    predicted = plan(args, model_cfg, device, gpus, suggest_changes=False).peak_gib
    budget = min(predicted, target_device(device, gpus=gpus).memory_gib) * (1 - fit_search.DEFAULT_MARGIN)
    return predicted, fit(args, model_cfg, device, gpus, budget_gib=budget, levels=False)
