"""`pretrain-cli check`: everything `train` would validate, without training.

Runs the same `config.prepare` as `train` (arguments, run configuration, model config, tokenizer,
token files, batch arithmetic; no Paddle) and prints the resolved run. Exit 0 means training would
start; otherwise every problem found is listed, one per line.
"""
from __future__ import annotations

import argparse
import json


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print the resolved run as one JSON object")


def main(ns: argparse.Namespace) -> int:
    from pretrain_cli.config.prepare import launcher_target, prepare

    spec = prepare(ns.config, ns.overrides, launcher_target())
    if ns.json:
        print(json.dumps(spec.summary(), indent=2, default=str))
        return 0
    for line in spec.describe():
        print(line)
    print("check: OK — training would start")
    return 0
