"""`pretrain-cli train-tokenizer`: a byte-level BPE with special tokens from the corpora `preprocess` reads."""
from __future__ import annotations

import argparse

from pretrain_cli.data.tokenizer import DEFAULT_SPECIALS


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--input_path", nargs="+", required=True,
                        help=".jsonl/.json/.txt files (plain, .gz, .zst, .bz2, .xz), .parquet files, directories or "
                             "quoted glob patterns, as for preprocess (a .txt file: one document per paragraph, "
                             "documents separated by blank lines)")
    parser.add_argument("--output_dir", required=True, help="directory for tokenizer.json and its config files")
    parser.add_argument("--vocab_size", type=int, required=True, help="tokens in the vocabulary, special tokens "
                                                                      "included")
    parser.add_argument("--min_frequency", type=int, default=2,
                        help="merges seen fewer times than this are not learned (default: %(default)s)")
    parser.add_argument("--special_tokens", nargs="+", default=DEFAULT_SPECIALS, metavar="TOKEN",
                        help="the pad, bos, eos and unk tokens, in that order, then any extra special tokens "
                             "(no role; each kept whole by the tokenizer; preprocess --special_tokens_in_text "
                             f"decides what a document's text makes of them) (default: {' '.join(DEFAULT_SPECIALS)})")
    parser.add_argument("--json_key", default="text", help="the document field of .jsonl/.json lines (default: "
                                                           "%(default)s)")
    parser.add_argument("--max_doc_num", type=int, default=None, metavar="N",
                        help="train on the first N documents only, a sample of a corpus too large for memory "
                             '(DATA.md, "Speed and memory") (default: all)')
    parser.add_argument("--skip_bad_lines", action="store_true", help="skip and count bad lines (default: a bad line "
                                                                       "is an error)")


def main(ns: argparse.Namespace) -> int:
    from pretrain_cli.commands import check_counts
    from pretrain_cli.data.tokenizer_training import train_tokenizer

    check_counts(ns, "min_frequency", minimum=0)  # the BPE trainer takes it unsigned: below 0 is a traceback
    check_counts(ns, "max_doc_num")

    return train_tokenizer(ns)
