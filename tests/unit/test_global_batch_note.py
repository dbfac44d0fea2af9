"""A `global_batch_size` other than the batch the run trains at (W4's walk: a Megatron-LM user's
`check run.json --global_batch_size 8` with per-device 4, accumulation 1, one rank trained at 4 after a note that said
only "accepted but has no effect"). PaddleFormers' FinetuningArguments (paddleformers-cli's parser for every stage)
recomputes it over the file's value and PaddleNLP's run_pretrain.py has no such key, so the run keeps
per_device_train_batch_size x gradient_accumulation_steps x data ranks; the note says that batch, with the numbers,
and the accumulation that gives the file's value."""
from __future__ import annotations

import pytest

from pretrain_cli.config.parser import parse_config
from pretrain_cli.config.resolve import resolve
from pretrain_cli.run_config import Target
from run_helpers import model_config

BASE = ["--output_dir", "o", "--input_dir", "d", "--max_steps", "5", "--device", "cpu", "--do_train",
        "--per_device_train_batch_size", "4"]


def _notes(extra: list[str], world: int = 1) -> dict:
    run = resolve(parse_config(None, [*BASE, *extra]), model_config("micro-qwen2"), Target("cpu", world))
    return {n.split(":")[0]: n for n in run.notes}


def test_the_note_says_the_batch_the_run_trains_at():
    said = _notes(["--global_batch_size", "8"])["global_batch_size"]
    assert said.startswith("global_batch_size: accepted but has no effect here: ")
    assert ("the run trains at 4 sequences a step (per_device_train_batch_size 4 x gradient_accumulation_steps 1 x "
            "1 data rank), not 8" in said), said
    assert "recomputes it" in said and "for 8 set gradient_accumulation_steps 2" in said, said


def test_the_data_ranks_count_and_a_batch_no_accumulation_gives_is_said_so():
    said = _notes(["--global_batch_size", "12", "--gradient_accumulation_steps", "2"], world=2)["global_batch_size"]
    assert "the run trains at 16 sequences a step (per_device_train_batch_size 4 x gradient_accumulation_steps 2 x " \
           "2 data ranks), not 12" in said, said
    assert "12 is no multiple of per_device_train_batch_size x data ranks (8)" in said, said


@pytest.mark.parametrize("extra,world", [(["--global_batch_size", "8", "--gradient_accumulation_steps", "2"], 1),
                                         (["--global_batch_size", "16", "--gradient_accumulation_steps", "2"], 2)])
def test_a_global_batch_size_that_is_the_runs_batch_is_no_note(extra, world):
    assert "global_batch_size" not in _notes(extra, world)


def test_on_one_data_rank_the_note_says_the_data_ranks_the_value_implies():
    """`check g32.json` (per-device 4, accumulation 1, global_batch_size 32) on one process, where a file meant for
    8 ranks is checked too, said only 'for 32 set gradient_accumulation_steps 8', which on 8 ranks trains at 256."""
    said = _notes(["--global_batch_size", "32"])["global_batch_size"]
    assert "32 is the batch of 8 data ranks at this accumulation" in said, said
    assert "for 32 set gradient_accumulation_steps 8 on one data rank" in said, said


@pytest.mark.parametrize("value,words", [("8.0", "for 8.0 set gradient_accumulation_steps 2"),
                                         ("abc", "abc is not a number"),
                                         ("8.5", "8.5 is not a whole number of sequences")])
def test_a_value_that_is_not_a_whole_number_is_said_so(value, words):
    """`int(str(value))` read 8.0 as 'no multiple' of the batch, and 'abc' so too."""
    said = _notes(["--global_batch_size", value])["global_batch_size"]
    assert words in said and "no multiple" not in said, said
