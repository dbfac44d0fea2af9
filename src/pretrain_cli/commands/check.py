"""`pretrain-cli check`: everything `train` would validate, without training.

Runs the same `config.prepare` as `train` (arguments, run configuration, model config, tokenizer,
token files, batch arithmetic; no Paddle) and prints the resolved run. `--world_size N` resolves it
for rank 0 of an N-process launch instead of the launcher's environment, so a 16-GPU file is checked
by the same code on a laptop. Exit 0 means training would
start; otherwise every problem found is listed, one per line.
"""
from __future__ import annotations

import argparse
import json


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print the resolved run as one JSON object")
    parser.add_argument("--world_size", type=int, default=None,
                        help="check the run as rank 0 of this many processes, on any machine (batch arithmetic, "
                             "heads/KV heads/intermediate vs tensor_parallel_degree, sharding degree, data per "
                             "rank; default: the launcher's world, 1 outside a launch)")


def main(ns: argparse.Namespace) -> int:
    from pretrain_cli.config.prepare import launcher_target, prepare, simulated_target

    target = launcher_target() if ns.world_size is None else simulated_target(ns.world_size)
    spec = prepare(ns.config, ns.overrides, target)
    if ns.json:
        print(json.dumps(spec.summary(), indent=2, default=str))
        return 0
    for line in spec.describe():
        print(line)
    simulated = f" on {ns.world_size} processes (simulated)" if ns.world_size is not None else ""
    print(f"check: OK — training would start{simulated}")
    return 0
