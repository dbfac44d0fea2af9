"""`pretrain-cli plan`: memory, FLOPs, tokens, checkpoint size and time for an argument file, before any GPU time.

Parses the file once and hands it to `orchestration.planned`, which resolves it exactly as `train` does but for a
target (`--device`, `--gpus`), and for `--fit` re-resolves every candidate layout of `planning.fit` from the
parsed arguments and keeps the fastest that fits; `-o` writes it. Never imports Paddle, never opens the data.
"""
from __future__ import annotations

import argparse
import json

from pretrain_cli.errors import UserError
from pretrain_cli.planning import fit as fit_search
from pretrain_cli.planning import hardware
from pretrain_cli.planning.plan import MFU_FP32, MFU_HALF
from pretrain_cli.planning.report import format_report

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
    parser.add_argument("--gpus_per_node", type=int, default=hardware.GPUS_PER_NODE,
                        help="GPUs in one node: consecutive ranks share a node, and a parallel group inside one "
                             "uses the device's in-node link (NVLink, else PCIe) (default: %(default)s)")
    parser.add_argument("--cross_node_gbps", type=float, default=hardware.CROSS_NODE_GBPS,
                        help="GB/s per GPU one way between nodes, for groups that span nodes (default: %(default)s: "
                             "one 400 Gb/s InfiniBand adapter per GPU)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the report")
    parser.add_argument("--fit", action="store_true",
                        help="search micro-batch/accumulation (same global batch), recompute, flash attention, "
                             "sharding stage, tensor-parallel and pipeline degree for the fastest layout whose "
                             "steady state and start-up fit --device")
    parser.add_argument("--margin", type=float, default=fit_search.DEFAULT_MARGIN,
                        help="with --fit: fraction of device memory kept free (default: %(default)s)")
    parser.add_argument("-o", "--output", default=None,
                        help="with --fit: write the fitted argument file here (the file with the changed keys; "
                             "default: none, only print)")


def _parsed(config: str | None, overrides: list[str] | None):
    """(Arguments, ModelConfig): the file and its overrides parsed once; every candidate re-resolves these."""
    from pretrain_cli.orchestration.prepare import build_model_config, load_arguments

    args = load_arguments(config, list(overrides or []))
    return args, build_model_config(args)[1]


def plan(config: str | None, overrides: list[str] | None = None, device: str = DEFAULT_DEVICE, gpus: int = 1,
         mfu: float | None = None, suggest_changes: bool = True, baseline_bytes: float = 0.0,
         peak_tflops: float | None = None) -> dict:
    """The object `plan --json` prints (`orchestration.planned.plan`), with suggestions when the run does not fit."""
    from pretrain_cli.orchestration import planned

    planned.check_flags(device, gpus, mfu, peak_tflops)
    return planned.plan(*_parsed(config, overrides), device, gpus, mfu, suggest_changes, baseline_bytes,
                        peak_tflops).to_json()


def fit(config: str | None, overrides: list[str] | None = None, device: str = DEFAULT_DEVICE, gpus: int = 1,
        mfu: float | None = None, margin: float = fit_search.DEFAULT_MARGIN, peak_tflops: float | None = None,
        budget_gib: float | None = None, baseline_bytes: float = 0.0, node: hardware.Node = hardware.Node()) -> dict:
    """`plan --fit` (`orchestration.planned.fit`): the fastest layout that fits, every candidate re-resolved."""
    return _fit(config, overrides, device, gpus, mfu, margin, peak_tflops, budget_gib, baseline_bytes, node)[1]


def _fit(config, overrides, device, gpus, mfu, margin, peak_tflops, budget_gib=None, baseline_bytes=0.0,
         node: hardware.Node = hardware.Node()):
    """(the parsed arguments, `plan --fit`'s result): the flags checked once, the file parsed once."""
    from pretrain_cli.orchestration import planned

    planned.check_flags(device, gpus, mfu, peak_tflops, margin, node)
    args, model_cfg = _parsed(config, overrides)
    return args, planned.fit(args, model_cfg, device, gpus, mfu, margin, peak_tflops, budget_gib, baseline_bytes,
                             node)


def write_fitted(args, change: dict, path: str) -> None:
    """The user's file (key order kept) with the command-line overrides and the fitted keys, published atomically."""
    from pretrain_cli import atomic
    from pretrain_cli.config.parser import load_json

    raw = load_json(args.config_path) if args.config_path is not None else {}  # its keys, in the user's order
    for key, where in args.explicit.items():
        if where != "file":
            raw[key] = args.get(key)
    raw.update(change)
    atomic.write_text(path, json.dumps(raw, indent=4) + "\n")  # an OSError is one `error:` line, exit 1 (cli.py)


def main(ns: argparse.Namespace) -> int:
    if ns.output and not ns.fit:
        raise UserError("-o: writes the fitted file, so it needs --fit; add --fit")
    node = hardware.Node(ns.gpus_per_node, ns.cross_node_gbps)
    if ns.fit:
        args, f = _fit(ns.config, ns.overrides, ns.device, ns.gpus, ns.mfu, ns.margin, ns.peak_tflops, node=node)
        if ns.output and f["after"] is not None:
            write_fitted(args, f["change"], ns.output)
        if not ns.json and f["notes"]:
            print("\n".join(f"note: {n}" for n in f["notes"]))
        print(json.dumps(f, indent=2) if ns.json else fit_search.format_fit(f))
        if ns.output and f["after"] is not None and not ns.json:
            print(f"wrote {ns.output}: `pretrain-cli check {ns.output}` validates it, `train` runs it")
        return 0 if f["after"] is not None else 1
    from pretrain_cli.orchestration import planned

    planned.check_flags(ns.device, ns.gpus, ns.mfu, ns.peak_tflops, node=node)
    r = planned.plan(*_parsed(ns.config, ns.overrides), ns.device, ns.gpus, ns.mfu, peak_tflops=ns.peak_tflops,
                     node=node)
    print(json.dumps(r.to_json(), indent=2) if ns.json else format_report(r))
    return 0
