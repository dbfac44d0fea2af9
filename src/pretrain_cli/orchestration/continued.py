"""What a `continue_training` run reads first, said when it is what its source run read.

`continue_training` is a fresh run, not a resume: its data position starts at sample 0, and sample i is a pure
function of the token files, split, seed, max_seq_length and sample mode (`data.samples`). A run continued from
another run's directory on that run's `input_dir`, `split` and `seed` reads, from its first step, what the source
run read from its first: the same text in the same order again, which nothing said. The source run's record
(its args.json) tells; a directory no run of ours wrote has none, and gets no note.
"""
from __future__ import annotations

import os

from pretrain_cli.counts import count
from pretrain_cli.errors import UserError
from pretrain_cli.run_config import RunConfig
from pretrain_cli.storage.checkpoint_dir import CheckpointDir


def _sources(input_dir, started: str) -> list:
    """`input_dir`'s words, each path as the run that named it read it (from the directory it was started in), a
    blend's weights as numbers: two runs name the same token files however each wrote them."""
    words = []
    for word in str(input_dir).split():
        try:
            words.append(float(word))
        except ValueError:
            words.append(os.path.realpath(os.path.join(started, word)))
    return words


def same_data_note(model_dir, run: RunConfig) -> list[str]:
    """One note when `run` (continue_training, training from its first step) reads the train split its source
    run (the run that wrote `model_dir`) read: the same token files, split and seed in the source's args.json.
    With the same max_seq_length and sample mode too, its samples are the source's in the source's order; with
    another, the same documents in the same order, cut into other samples."""
    source = CheckpointDir(model_dir)
    if source.record is None:
        return []
    started = source.args.get("working_directory")
    was_input = source.run("data", "input_dir")
    if was_input is None or _sources(was_input, started if isinstance(started, str) else os.getcwd()) != \
            _sources(run.data.input_dir, os.getcwd()):
        return []
    if source.run("data", "split") != list(run.data.split) or source.run("loop", "seed") != run.loop.seed:
        return []
    try:
        consumed = int(source.state.get("consumed_samples") or 0)
    except (UserError, TypeError, ValueError):  # no trainer state (an export stopped part way): not said
        consumed = 0
    trained = f" (it trained on the first {count(consumed, 'sample', True)})" if consumed else ""
    same_cut = (source.run("data", "max_seq_length"), source.run("data", "sample_mode")) == (
        run.data.max_seq_length, run.data.sample_mode)
    what = ("the same samples in the same order" if same_cut else
            "the same documents in the same order (cut into other samples: another max_seq_length or sample_mode)")
    return [f"continue_training: input_dir, split and seed are those of the run that wrote {model_dir} (its "
            f"{source.record.name}), and a continued run starts at sample 0: from its first step this run reads {what} "
            f"as that run did from its first{trained}; set another seed to read them in another order, or resume that "
            f"run instead (its command with a higher max_steps, in its output_dir) to go on where its data stopped"]
