"""`pretrain-cli preprocess`: tokenize jsonl/json/txt/Parquet documents (plain or compressed) into `.bin/.idx`
token files; `--num_tasks/--task_index` split one job over machines, and a re-run resumes a killed task."""
from __future__ import annotations

import argparse

# what a document's special-token text becomes (`data.tokenizer.Tokenizer.for_documents`): here, not imported from
# there, so that `preprocess --help` does not import numpy with the data package
SPECIAL_TOKENS_IN_TEXT = ("text", "special", "extra")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.usage = ("pretrain-cli preprocess --input_path INPUT_PATH... --output_prefix OUTPUT_PREFIX "
                    "{--tokenizer DIR | --model_name_or_path DIR} [options]")
    parser.add_argument("--input_path", nargs="+", required=True,
                        help=".jsonl/.json/.txt files (plain, .gz, .zst, .bz2, .xz), .parquet files, "
                             "directories (walked recursively) or quoted glob patterns; read in the order given, each "
                             "directory and glob in sorted order. Documents: one per .jsonl/.json line, one per "
                             ".parquet row, and in a .txt file one per paragraph: documents are separated by blank "
                             "lines, not by line ends")
    parser.add_argument("--output_prefix", required=True, help="writes PREFIX.bin, PREFIX.idx, PREFIX.json "
                                                                      "(PREFIX-iiiii-of-nnnnn.* with --num_tasks > 1)")
    parser.add_argument("--tokenizer", help="tokenizer directory (tokenizer.json); required, under this name or "
                                             "--model_name_or_path's")
    parser.add_argument("--model_name_or_path", help="PaddleNLP's create_pretraining_data.py name for --tokenizer: "
                                                     "the same directory (both given, they must agree)")
    parser.add_argument("--json_key", default="text", help="the document field of .jsonl/.json lines, or the Parquet "
                                                           "column (default: %(default)s)")
    parser.add_argument("--append_eos", action="store_true",
                        help="append the tokenizer's EOS to every document, so packed training samples mark where one "
                             "ends (without it they run together)")
    parser.add_argument("--special_tokens_in_text", choices=SPECIAL_TOKENS_IN_TEXT, default="text",
                        help="what a special token's text inside a document becomes: text (plain text, so a "
                             "literal </s> or <pad> is no EOS or pad id), special (every special token's id, as "
                             "transformers does), extra (only the ids of special tokens with no pad/bos/eos/unk "
                             "role, e.g. chat markers <|im_start|>; role tokens stay text) (default: %(default)s)")
    parser.add_argument("--workers", type=int, default=1, help="tokenizer processes (default: %(default)s)")
    parser.add_argument("--log_interval", type=int, default=10000,
                        help="documents between progress lines; 0: none (default: %(default)s)")
    parser.add_argument("--max_doc_num", type=int, default=None,
                        help="stop after this many documents (default: all of them)")
    parser.add_argument("--skip_bad_lines", action="store_true",
                        help="skip and count bad lines, corrupt compressed tails and Parquet row groups "
                             "(default: the first one is an error)")
    parser.add_argument("--num_tasks", type=int, default=1,
                        help="split the input files into this many tasks, one per machine or job (default: "
                             "%(default)s)")
    parser.add_argument("--task_index", type=int, default=0,
                        help="which task this process runs, 0..num_tasks-1: a contiguous share of the sorted "
                             "files (default: %(default)s)")


def tokenizer(ns: argparse.Namespace) -> str:
    """--tokenizer, or PaddleNLP's --model_name_or_path for it (its create_pretraining_data.py's flag, so its commands
    run as they are); both naming other tokenizers, which would encode the files is not guessed: refused."""
    from pretrain_cli.errors import UserError

    tok, alias = ns.tokenizer, ns.model_name_or_path
    if tok is not None and alias is not None and tok != alias:
        raise UserError(f"--model_name_or_path {alias} and --tokenizer {tok} name two tokenizers (--model_name_or_path "
                        f"is PaddleNLP's name for --tokenizer); give one of them")
    if tok is None and alias is None:
        raise UserError("--tokenizer: required: the tokenizer directory (tokenizer.json) the token files are encoded "
                        "with (PaddleNLP's --model_name_or_path is read as it too)")
    return tok if tok is not None else alias


def main(ns: argparse.Namespace) -> int:
    import sys

    from pretrain_cli.commands import check_counts
    from pretrain_cli.data.preprocess import Job, preprocess

    check_counts(ns, "workers", "max_doc_num")  # --max_doc_num 0 would end as "no non-empty documents"
    check_counts(ns, "log_interval", minimum=0)  # 0: no progress lines; below it, one per document

    job = Job(tuple(ns.input_path), ns.output_prefix, tokenizer(ns), ns.json_key, ns.append_eos, ns.workers,
              ns.log_interval, ns.max_doc_num, ns.skip_bad_lines, ns.num_tasks, ns.task_index,
              ns.special_tokens_in_text)
    return preprocess(job, say=print, note=lambda line: print(line, file=sys.stderr, flush=True))
