"""Megatron-LM's arguments on the command line of a command that takes no training keys (W4's walk): `preprocess
--vocab-file v --merge-file m` got argparse's "unrecognized arguments", `inspect-data --data-path x` the suggestion
`--data_ranks` (its nearest spelling). Each names the command's own argument that says it, in one line, from
config.megatron_names' table (the one `train`'s unknown-key line reads)."""
from __future__ import annotations

import pytest

from pretrain_cli.cli import main as cli_main


def _error(capsys, *argv) -> list[str]:
    assert cli_main(list(argv)) == 2
    return [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]


@pytest.mark.parametrize("flags", [["--vocab-file", "v", "--merge-file", "m"], ["--tokenizer-type", "GPT2BPETokenizer"],
                                   ["--vocab_file", "v"]])
def test_megatron_tokenizer_files_point_to_the_tokenizer_directory(capsys, flags):
    lines = _error(capsys, "preprocess", "--input_path", "c.jsonl", "--output_prefix", "x", *flags)
    typed = " and ".join(f"`{f[2:]}`" for f in flags if f.startswith("--"))
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"error: command line: {typed} "), lines
    assert "Megatron-LM's argument" in lines[0] and "here pass --tokenizer DIR (a directory holding vocab.json + " \
                                                   "merges.txt, or tokenizer.json" in lines[0], lines


def test_the_prefix_of_inspect_data_is_its_positional_argument(capsys):
    lines = _error(capsys, "inspect-data", "--data-path", "x")
    assert lines == ["error: command line: `data-path` is Megatron-LM's argument; here the prefix is the positional "
                     "argument, without an option name: `pretrain-cli inspect-data PREFIX`"], lines


def test_eval_keeps_its_own_data_option(capsys):
    lines = _error(capsys, "eval", "--model", "m", "--data-path", "x")
    assert lines == ["error: command line: `data-path` is Megatron-LM's argument; here pass --data"], lines


def test_three_megatron_names_are_one_listed_line(capsys):
    """Three of Megatron's tokenizer flags read '`vocab-file` and `merge-file` and `tokenizer-type` are ...'."""
    lines = _error(capsys, "preprocess", "--input_path", "c.jsonl", "--output_prefix", "x", "--vocab-file", "v",
                   "--merge-file", "m", "--tokenizer-type", "GPT2BPETokenizer")
    assert len(lines) == 1 and lines[0].startswith(
        "error: command line: `vocab-file`, `merge-file` and `tokenizer-type` are Megatron-LM's arguments; here pass "
        "--tokenizer DIR"), lines
