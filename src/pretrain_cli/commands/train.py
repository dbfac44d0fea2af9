"""`pretrain-cli train` / `scripts/run_pretrain.py`: prepare the run (no Paddle), then train it."""
from __future__ import annotations

import argparse
import json

EPILOG = """Every key of the argument file (docs/COMPATIBILITY.md, or --help-keys) can follow the file as
--key value; later values win (default < file < command line). Bools take true/false/1/0, --flag alone
means true and --no_flag false. Examples:
  pretrain-cli train configs/demo_cpu.json --max_steps 100 --learning_rate 1e-3
  python -m paddle.distributed.launch --nproc_per_node 2 scripts/run_pretrain.py configs/demo_cpu.json"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = EPILOG
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("--help-keys", action="store_true", help="list every argument-file key with its meaning")


def main(ns: argparse.Namespace) -> int:
    if ns.help_keys:
        from pretrain_cli.config.parser import KEYS

        for key, s in KEYS.items():
            print(f"--{key} ({s.section}, default {json.dumps(s.default)}): {s.help}")
        return 0
    from pretrain_cli import runtime
    from pretrain_cli.config.prepare import launcher_target, prepare
    from pretrain_cli.distributed import launch

    runtime.setup_env(threads=runtime.default_threads(launch.local_size()))  # before anything imports Paddle
    spec = prepare(ns.config, ns.overrides, launcher_target())
    from pretrain_cli.errors import DeviceOutOfMemory, is_out_of_memory
    from pretrain_cli.training.run import run

    try:
        return run(spec)
    except DeviceOutOfMemory as e:
        raise DeviceOutOfMemory(e.step, out_of_memory_line(ns, spec, e.step)) from e
    except (MemoryError, RuntimeError) as e:  # building the model or the optimizer, before the first step
        if not is_out_of_memory(e):
            raise
        raise DeviceOutOfMemory(0, out_of_memory_line(ns, spec, 0)) from e


def out_of_memory_line(ns: argparse.Namespace, spec, step: int) -> str:
    """One line: where it ran out, and `plan --fit`'s layout for this run under a budget below what failed
    (`config.planned.out_of_memory_fit`, on the arguments this run parsed)."""
    from pretrain_cli.config.planned import out_of_memory_fit
    from pretrain_cli.errors import UserError
    from pretrain_cli.planning import fit as fit_search

    r = spec.run
    where = f"out of memory at step {step}" if step else "out of memory before the first step (building the run)"
    device = "cpu" if r.device == "cpu" else _gpu_name()
    world = r.parallel.world_size
    how = f"pretrain-cli plan {ns.config or '<args.json>'} --device {device or '<your GPU>'} --gpus {world} --fit"
    if device is None:
        return f"{where}; `{how}` finds a layout that fits (checkpoints are untouched)"
    try:
        predicted, f = out_of_memory_fit(spec.args, spec.model_cfg, device, world)
    except UserError:
        return f"{where}; `{how}` finds a layout that fits (checkpoints are untouched)"
    if f["after"] is None or not f["diff"]:
        return (f"{where} on {world} x {device}: no layout of this run is predicted to need less than "
                f"{predicted:.2f} GiB per device; use more devices or ones with more memory (`{how}`); "
                f"checkpoints are untouched")
    change = ", ".join(f"{k} {fit_search.json_value(old)} -> {fit_search.json_value(new)}" for k, old, new in f["diff"])
    return (f"{where} on {world} x {device}: top plan suggestion for this run: {change} (predicted "
            f"{predicted:.2f} -> {f['after']['memory_gib']:.2f} GiB per device; `{how} -o fitted.json` writes it); "
            f"checkpoints are untouched, re-run to resume from the last one")


def _gpu_name() -> str | None:
    """This GPU as a hardware-table name, or None when the table does not know it."""
    from pretrain_cli import runtime
    from pretrain_cli.planning.hardware import lookup

    dev = lookup(runtime.gpu_name() or "")
    return dev.name if dev is not None else None
