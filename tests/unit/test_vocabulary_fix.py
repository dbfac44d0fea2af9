"""Token ids past the model's vocabulary: the line says the fix that applies. With the run's tokenizer loaded (it
fits the model: `open_tokenizer` refuses a larger one) the files are another tokenizer's, and preprocess is the fix;
without one (a larger tokenizer refused, whose own line names --vocab_size) a new model's --vocab_size is, naming
the size that holds the ids, and preprocess for pretrained weights."""
from types import SimpleNamespace

import pytest

from data_helpers import write_tokens
from pretrain_cli.data import build_datasets
from pretrain_cli.errors import UserError


def test_without_a_tokenizer_the_line_names_vocab_size_first(tmp_path):
    """The second line of `check --vocab_size 1024` with a 2048-token tokenizer said 're-run preprocess with the
    model's tokenizer', where the first said --vocab_size 2048."""
    prefix = write_tokens(tmp_path / "c", vocab_size=300)
    with pytest.raises(UserError) as e:
        build_datasets(prefix, "1", 8, 0, need=("train",), vocab_size=100)
    top = int(str(e.value).split("max token id ")[1].split()[0])
    assert str(e.value).endswith(
        f">= vocab_size 100; a new model holds them with --vocab_size {top + 1} or more (the key vocab_size: the size "
        f"of the tokenizer that made them); pretrained weights keep their vocabulary: re-run preprocess with the "
        f"model's tokenizer"), str(e.value)


def test_with_the_runs_tokenizer_the_files_are_another_tokenizers(tmp_path):
    prefix = write_tokens(tmp_path / "c", vocab_size=300)
    with pytest.raises(UserError, match=r">= vocab_size 100; these are not the ids of the run's tokenizer \(90 "
                                        r"tokens\): re-run preprocess with it \(tokenizer_name_or_path\)$"):
        build_datasets(prefix, "1", 8, 0, need=("train",), vocab_size=100, tokenizer=SimpleNamespace(vocab_size=90))
