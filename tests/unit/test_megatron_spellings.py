"""COMPATIBILITY.md's Megatron-LM section said its names are refused "in either spelling" and listed
`--global-batch-size`, while `global_batch_size` (PaddleFormers' key) is read with a note, as PaddleFormers' names
for PaddleNLP's keys (`min_lr`, `tensor_model_parallel_size`, ...) are read as theirs. The section names each name
whose underscored spelling parses, and says why the hyphenated one, Megatron's alone, is refused; the parser decides
which (a known key before the Megatron line), and this test holds the doc to it."""
from __future__ import annotations

from pathlib import Path

import pytest
from run_helpers import BASE

from pretrain_cli.config.megatron_names import MEGATRON
from pretrain_cli.config.parser import parse_config
from pretrain_cli.errors import UserError

DOC = Path(__file__).parents[2] / "docs" / "COMPATIBILITY.md"


def _parses(*argv) -> bool:
    try:
        parse_config(None, [*BASE, *argv])
    except UserError:
        return False
    return True


def _section() -> str:
    text = DOC.read_text()
    return text[text.index("## Megatron-LM's argument names"):text.index("| Megatron-LM | here |")]


def test_each_megatron_name_read_underscored_is_named_as_read_and_its_hyphenated_spelling_refused():
    read = [name for name in MEGATRON if _parses(f"--{name}", "8")]
    assert "global_batch_size" in read and "min_lr" in read, read
    section = _section()
    for name in read:
        assert f"`{name}`" in section, name
        assert not _parses(f"--{name.replace('_', '-')}", "8"), name
    assert "sets the accumulation from it" in section, section  # why `--global-batch-size` is refused


@pytest.mark.parametrize("argv", [["--global_batch_size", "32"], ["--global-batch-size", "32"]])
def test_the_two_spellings_of_the_global_batch_take_the_paths_the_doc_names(argv):
    assert _parses(*argv) == ("_" in argv[0])
