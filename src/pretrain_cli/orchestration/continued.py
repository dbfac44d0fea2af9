"""What a `continue_training` run reads first, said when it is what its source run read.

`continue_training` is a fresh run, not a resume: its data position starts at sample 0, and sample i is a pure
function of the token files, each source's train documents, its share of a blend, the seed, max_seq_length and
sample mode (`data.samples`). A run continued from another run's directory on what that run trained on reads, from
its first step, what the source run read from its first: the same text in the same order again, which nothing said.
The source run's record (its args.json) tells; a directory no run of ours wrote has none, and gets no note.
"""
from __future__ import annotations

import math
import os

from pretrain_cli.counts import count
from pretrain_cli.errors import UserError
from pretrain_cli.run_config import RunConfig
from pretrain_cli.storage.checkpoint_dir import CheckpointDir


def _train_reads(input_dir, fractions, started: str) -> list[tuple] | None:
    """(token file, share of the blend, train documents lo, hi) of each source `input_dir` names, as the run started
    in `started` read it (`data.blend.parse_input_dir`, the one reader of input_dir; relative paths from `started`),
    or None where it names nothing readable. Two runs whose lists are equal train on the same samples, however each
    wrote its input_dir (`./data` holding only c, `data/c`, "1 ./data/c") or split (a test share that leaves train
    its documents)."""
    from pretrain_cli.data import open_token_file
    from pretrain_cli.data.blend import parse_input_dir
    from pretrain_cli.data.splits import split_bounds

    text = str(input_dir).strip()
    if len(text.split()) == 1:  # (the one word parse_input_dir looks up on disk: a directory's token files)
        text = os.path.join(started, text)
    try:
        sources = []
        for weight, prefix in parse_input_dir(text):
            path = os.path.realpath(os.path.join(started, prefix))
            src = open_token_file(path)
            lo, hi = split_bounds(fractions, len(src))[:2]
            sources.append((path, float(src.num_tokens) if weight is None else weight, lo, hi))  # (None: by size)
    except (UserError, OSError, ValueError, TypeError):
        return None
    total = sum(w for _, w, _, _ in sources)
    return [(path, w / total, lo, hi) for path, w, lo, hi in sources]


def _same(a: list[tuple] | None, b: list[tuple] | None) -> bool:
    return a is not None and b is not None and len(a) == len(b) and all(
        (x[0], x[2], x[3]) == (y[0], y[2], y[3]) and math.isclose(x[1], y[1], rel_tol=1e-12) for x, y in zip(a, b))


def same_data_note(model_dir, run: RunConfig) -> list[str]:
    """One note when `run` (continue_training, training from its first step) reads the samples its source run (the
    run that wrote `model_dir`) read, in the same order: the same train documents of the same token files (judged by
    path: files re-made at the same path are not told apart, so the note says "if unchanged"), the same shares of a
    blend, seed, max_seq_length and sample mode as the source's args.json records. With another max_seq_length or
    sample mode the samples are other cuts of the documents, in an order drawn for their number: no note."""
    source = CheckpointDir(model_dir)
    if source.record is None:
        return []
    if (source.run("loop", "seed"), source.run("data", "max_seq_length"), source.run("data", "sample_mode")) != (
            run.loop.seed, run.data.max_seq_length, run.data.sample_mode):
        return []
    started, was_input, was_split = (source.args.get("working_directory"), source.run("data", "input_dir"),
                                     source.run("data", "split"))
    if was_input is None or not isinstance(was_split, list):
        return []
    was = _train_reads(was_input, was_split, started if isinstance(started, str) else os.getcwd())
    if not _same(was, _train_reads(run.data.input_dir, list(run.data.split), os.getcwd())):
        return []
    try:
        consumed = int(source.state.get("consumed_samples") or 0)
    except (UserError, TypeError, ValueError):  # no trainer state (an export stopped part way): not said
        consumed = 0
    trained = f" (it trained on the first {count(consumed, 'sample', True)})" if consumed else ""
    return [f"continue_training: the token files (if unchanged since), train documents and seed are those of the run "
            f"that wrote {model_dir} (its {source.record.name}), with its max_seq_length and sample_mode, and a "
            f"continued run starts at sample 0: from its first step this run reads the same samples in the same order "
            f"as that run did from its first{trained}; set another seed to read them in another order, or resume that "
            f"run instead (its command with a higher max_steps, in its output_dir) to go on where its data stopped"]
