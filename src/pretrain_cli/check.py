"""`pretrain-cli check`: everything `train` would validate, without training.

Runs the same `train.build_*` steps that need no Paddle (arguments, model config, tokenizer,
token files, batch arithmetic) and prints the resolved run. Exit 0 means training would start.
"""
from __future__ import annotations

import argparse
import json

from pretrain_cli import train


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print the resolved arguments as one JSON object")


def main(ns: argparse.Namespace) -> int:
    run = train.prepare(ns.config, ns.overrides)
    if ns.json:
        print(json.dumps(run.summary(), indent=2, default=str))
        return 0
    for line in run.describe():
        print(line)
    print("check: OK — training would start")
    return 0
