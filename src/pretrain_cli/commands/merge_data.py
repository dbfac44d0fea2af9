"""`pretrain-cli merge-data OUT IN...`: join token file pairs into one (Megatron's merge_datasets.py)."""
from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("output", help="output prefix: writes OUT.bin, OUT.idx, OUT.json")
    parser.add_argument("inputs", nargs="+",
                        help="token file prefixes, joined in the order given; a directory stands for all of its "
                             "token files in sorted order (the outputs of `preprocess --num_tasks N`); a file given "
                             "twice (through a directory, or a symlink to one) is joined once")


def main(ns: argparse.Namespace) -> int:
    import sys

    from pretrain_cli.data.merge import merge, merge_summary

    def note(line: str) -> None:  # "warning: ..." or "note: ..."
        print(f"merge-data: {line}", file=sys.stderr, flush=True)

    print(merge_summary(ns.output, merge(ns.output, ns.inputs, note)))
    return 0
