"""`pretrain-cli train-tokenizer`: a byte-level BPE with special tokens from jsonl/txt files."""
from __future__ import annotations

import argparse

from pretrain_cli.data.tokenizer import DEFAULT_SPECIALS


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--input_path", nargs="+", required=True, help="jsonl/json/txt files or directories")
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--vocab_size", type=int, required=True)
    parser.add_argument("--min_frequency", type=int, default=2)
    parser.add_argument("--special_tokens", nargs="+", default=DEFAULT_SPECIALS,
                        help="default: [PAD] [BOT] [EOT] [UNK] (pad, bos, eos, unk)")
    parser.add_argument("--json_key", default="text")
    parser.add_argument("--skip_bad_lines", action="store_true")


def main(ns: argparse.Namespace) -> int:
    from pretrain_cli.data.tokenizer import train_tokenizer

    return train_tokenizer(ns)
