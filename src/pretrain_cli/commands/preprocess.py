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
                                                     "the same directory (both given, they must agree; default: "
                                                     "none, then --tokenizer is required)")
    for older in ("--model_name", "--tokenizer_name"):
        parser.add_argument(older, help="an older name PaddleNLP's README still shows for --model_name_or_path: the "
                                        "same (default: none)")
    parser.add_argument("--data_format", help="PaddleNLP's: JSON only, which it does not read either; accepted as a "
                                              "no-op (each file's format is its extension's; default: none)")
    parser.add_argument("--data_impl", help="PaddleNLP's token file format: mmap (MMIDIDX, what is written here) is "
                                            "a no-op; lazy and cached are refused (default: none)")
    for flag in REFUSED_FLAGS:  # (PaddleNLP's, which change its output in ways not done here: one line each)
        parser.add_argument(flag, nargs="?", const="", metavar="X",
                            help="PaddleNLP's create_pretraining_data.py flag, refused here in one line saying why "
                                 "(default: none)")
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


# create_pretraining_data.py's flags that change what it writes in ways not done here: why each is refused. Its
# others: --input_path, --output_prefix, --json_key, --append_eos, --workers, --max_doc_num and --log_interval are
# ours with the same meaning (--log_interval's default is 10000 documents here, 100 there); --model_name_or_path and
# the older --model_name/--tokenizer_name are --tokenizer; --data_format JSON and --data_impl mmap change nothing.
_CHINESE = ("Chinese sentence splitting and ERNIE's whole-word ## marking, for BERT/ERNIE-style masked-LM data, are "
            "not done here (a causal LM's token files hold the documents' plain tokens); drop it")
REFUSED_FLAGS = {
    "--split_sentences": "one sequence per sentence is not written here: a document is one sequence, and training "
                         "packs documents into samples whatever their sentences; drop it",
    "--max_repeated_len": "collapsing a character repeated past N times is not done here: documents are tokenized as "
                          "they are (clean them before, if they need it); drop it",
    **{flag: _CHINESE for flag in ("--chinese", "--cn_whole_word_segment", "--cn_seg_func", "--cn_splited",
                                   "--cn_split_dimer")},
}


def paddlenlp_flags(ns: argparse.Namespace) -> None:
    """create_pretraining_data.py's flags a PaddleNLP user copies: the ones that change nothing here pass, the rest
    end in one line saying why (`REFUSED_FLAGS`, `config.keys.REFUSED_VALUES`)."""
    from pretrain_cli.config.keys import REFUSED_VALUES
    from pretrain_cli.errors import UserError

    for flag, why in REFUSED_FLAGS.items():
        if getattr(ns, flag[2:]) is not None:
            raise UserError(f"{flag}: PaddleNLP's create_pretraining_data.py flag: {why}")
    if ns.data_format is not None and ns.data_format.upper() != "JSON":
        raise UserError(f"--data_format {ns.data_format}: PaddleNLP's only value is JSON (a no-op there and here: a "
                        f"file's format is its extension's, .jsonl/.json/.txt/.parquet); drop it")
    impl = ns.data_impl
    if impl is not None and impl != "mmap":
        what = REFUSED_VALUES.get(("data_impl", impl), f"{impl} is no token file format known here")
        raise UserError(f"--data_impl {impl}: {what}; preprocess writes mmap (MMIDIDX) files only: drop --data_impl "
                        f"or pass mmap")


def tokenizer(ns: argparse.Namespace) -> str:
    """--tokenizer, or PaddleNLP's --model_name_or_path (or the --model_name its README shows) for it, so that its
    create_pretraining_data.py commands run here as they are typed, unless they pass a flag `REFUSED_FLAGS` names;
    two naming other tokenizers (`./tok` and `tok/` are one), which would encode the files is not guessed: refused."""
    from pathlib import Path

    from pretrain_cli.errors import UserError

    flags = ("--model_name_or_path", "--model_name", "--tokenizer_name", "--tokenizer")
    given = [(flag, getattr(ns, flag[2:])) for flag in flags if getattr(ns, flag[2:]) is not None]
    if not given:
        raise UserError("--tokenizer: required: the tokenizer directory (tokenizer.json) the token files are encoded "
                        "with (PaddleNLP's --model_name_or_path and --model_name are read as it too)")
    first_flag, first = given[0]
    for flag, value in given[1:]:
        if Path(value).resolve() != Path(first).resolve():
            aliases = [f for f, _ in (given[0], (flag, value)) if f != "--tokenizer"]
            said = (f"{aliases[0]} is PaddleNLP's name" if len(aliases) == 1
                    else f"{' and '.join(aliases)} are PaddleNLP's names")
            raise UserError(f"{first_flag} {first} and {flag} {value} name two tokenizers ({said} for --tokenizer); "
                            f"give one of them")
    return given[-1][1]


def main(ns: argparse.Namespace) -> int:
    import sys

    from pretrain_cli.commands import check_counts
    from pretrain_cli.data.preprocess import Job, preprocess

    paddlenlp_flags(ns)
    check_counts(ns, "workers", "max_doc_num")  # --max_doc_num 0 would end as "no non-empty documents"
    check_counts(ns, "log_interval", minimum=0)  # 0: no progress lines; below it, one per document

    job = Job(tuple(ns.input_path), ns.output_prefix, tokenizer(ns), ns.json_key, ns.append_eos, ns.workers,
              ns.log_interval, ns.max_doc_num, ns.skip_bad_lines, ns.num_tasks, ns.task_index,
              ns.special_tokens_in_text)
    return preprocess(job, say=print, note=lambda line: print(line, file=sys.stderr, flush=True))
