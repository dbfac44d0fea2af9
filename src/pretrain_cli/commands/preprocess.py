"""`pretrain-cli preprocess`: tokenize jsonl/json/txt documents into `.bin/.idx` token files."""
from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--input_path", nargs="+", required=True, help=".jsonl/.json/.txt file(s) or directories")
    parser.add_argument("--output_prefix", required=True, help="writes PREFIX.bin, PREFIX.idx, PREFIX.json")
    parser.add_argument("--tokenizer", required=True, help="tokenizer directory (tokenizer.json)")
    parser.add_argument("--json_key", default="text", help="the document field of .jsonl/.json lines (default: %(default)s)")
    parser.add_argument("--append_eos", action="store_true", help="append the tokenizer's EOS to every document")
    parser.add_argument("--workers", type=int, default=1, help="tokenizer processes (default: %(default)s)")
    parser.add_argument("--log_interval", type=int, default=10000,
                        help="documents between progress lines; 0: none (default: %(default)s)")
    parser.add_argument("--max_doc_num", type=int, default=None,
                        help="stop after this many documents (default: all of them)")
    parser.add_argument("--skip_bad_lines", action="store_true", help="skip and count bad lines (default: a bad line is an error)")


def main(ns: argparse.Namespace) -> int:
    from pretrain_cli.data.preprocess import preprocess

    return preprocess(ns)
