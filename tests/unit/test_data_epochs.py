"""How many times a run reads its train split: where a reader wraps around it (and the line the trainer logs then),
and the start-up data line's count of epochs, from build_datasets and from check/train."""
from __future__ import annotations

from pretrain_cli.data import build_datasets
from pretrain_cli.data.blend import BlendedDataset
from pretrain_cli.data.indexed import open_token_file
from pretrain_cli.data.samples import PackedDataset
from sample_corpus import corpus


def test_where_a_reader_wraps_around_the_train_split_and_the_line_the_trainer_logs(tmp_path):
    """A long run on a small corpus reads it many times: the step that starts each epoch after the first gets one
    line (each source's, in a blend), and every sample of an epoch is read once in it, in a new order."""
    import logging
    from types import SimpleNamespace

    from pretrain_cli.training.trainer import Trainer

    prefix, _ = corpus(tmp_path / "c")
    ds = PackedDataset(open_token_file(prefix), 0, 60, 16, 7, "train")
    n = len(ds)
    assert ds.epochs_begun(0, 3) == [("c", 0)] and ds.epochs_begun(1, n - 1) == []
    assert ds.epochs_begun(n - 1, 3) == [("c", 1)] and ds.epochs_begun(n - 2, 2 * n + 5) == [("c", 1), ("c", 2), ("c", 3)]
    seen = [sorted(int(ds._spans(i)[0][0]) * 1000 + ds._spans(i)[0][1] for i in range(e * n, (e + 1) * n))
            for e in range(3)]
    assert all(len(set(s)) == n for s in seen) and seen[0] != seen[1]  # each sample once per epoch; reshuffled
    begun = [e for first in range(0, 3 * n, 3) for e in ds.epochs_begun(first, 3)]  # batches of 3 straddle
    assert begun == [("c", 0), ("c", 1), ("c", 2)]

    other, _ = corpus(tmp_path / "d", n_docs=20, seed=1)
    small = PackedDataset(open_token_file(other), 0, 20, 16, 7, "train")
    blend = BlendedDataset([ds, small], [0.5, 0.5], ["c", "d"])
    begun = [e for first in range(0, 4 * len(small), 4) for e in blend.epochs_begun(first, 4)]
    assert begun.count(("d", 1)) == 1 and begun.count(("c", 0)) == 1 and ("c", 1) not in begun

    lines = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())
    logger = logging.getLogger("pretrain_cli")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        trainer = SimpleNamespace(splits=SimpleNamespace(train=ds), global_batch=3,
                                  state=SimpleNamespace(global_step=0))
        for step, first in enumerate(range(0, 2 * n - 3, 3)):  # (the batches of epochs 1 and 2 only)
            trainer.state.global_step = step
            Trainer._note_epochs(trainer, first)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    step = (n - 1) // 3 + 1  # the step whose batch holds sample n, the first of epoch 2
    assert lines == [f"data: step {step} starts epoch 2 of c's train split: its samples again, in a new order"]
    # a global batch of more than an epoch starts several at once: one line for them (it logged a line each)
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        del lines[:]
        trainer = SimpleNamespace(splits=SimpleNamespace(train=ds), global_batch=4 * n + 1,
                                  state=SimpleNamespace(global_step=0))
        Trainer._note_epochs(trainer, 0)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    assert lines == ["data: step 1 starts epochs 2-5 (its global batch holds more than an epoch) of c's train split: "
                     "its samples again, in a new order"]

def test_the_start_up_data_line_says_how_many_epochs_the_run_reads(tmp_path):
    prefix, _ = corpus(tmp_path / "c")
    splits = build_datasets(prefix, "90,5,5", 16, 7, need=("train",))
    n = splits.train.samples_per_epoch
    assert splits.describe(train_samples=3 * n)[0].endswith(f"; the run's {3 * n:,} train samples from it: 3.00 epochs")
    assert "epochs" not in splits.describe()[0].split("per epoch")[-1]  # no run: no count


def test_check_and_train_start_by_saying_how_many_epochs_the_run_reads(tmp_path):
    import json

    from data_helpers import write_tokens
    from pretrain_cli.orchestration.prepare import prepare
    from pretrain_cli.run_config import Target

    write_tokens(tmp_path / "data", n_docs=40, doc_len=64, vocab_size=64)  # 2,560 tokens: 79 samples of 32 per epoch
    args = tmp_path / "args.json"
    args.write_text(json.dumps({"model_name_or_path": "micro-qwen2", "do_train": True, "input_dir": str(tmp_path / "data"),
                                "output_dir": str(tmp_path / "out"), "split": "1", "max_seq_length": 32,
                                "per_device_train_batch_size": 4, "max_steps": 60}))
    (line,) = prepare(str(args), [], Target()).data_lines
    assert "train 40 docs / 79 samples per epoch" in line and line.endswith(
        "; the run's 240 train samples from it: 3.04 epochs")


def test_a_short_run_on_a_large_source_says_its_epochs_in_significant_digits(tmp_path):
    """0.0127 epochs was shown as 0.00, as if the source were not read."""
    from data_helpers import write_tokens

    prefix = write_tokens(tmp_path / "d")  # 2,560 tokens: 79 samples of 32 per epoch
    splits = build_datasets(prefix, "1", 32, 7, need=("train",))
    assert splits.describe(train_samples=1)[0].endswith("; the run's 1 train samples from it: 0.013 epochs")
    assert splits.describe(train_samples=79)[0].endswith("; the run's 79 train samples from it: 1.00 epochs")


def test_a_split_too_small_for_one_sample_names_a_split_that_fits(tmp_path):
    """'the valid split has 128 tokens ... use more data or a shorter max_seq_length' did not say that `split`
    fixes it too: the line names a value that gives the split one sample, taken from train's share."""
    import pytest

    from data_helpers import write_tokens
    from pretrain_cli.errors import UserError

    prefix = write_tokens(tmp_path / "d")  # 40 documents of 64 tokens
    with pytest.raises(UserError) as e:
        build_datasets(prefix, "949,50,1", 200, 7, need=("train", "valid"))
    assert str(e.value) == (f"{prefix}: the valid split has 128 tokens, fewer than one sample of max_seq_length+1 = "
                            "201; use more data or a shorter max_seq_length, or set split: \"911,88,1\" (this "
                            "source's valid split would then hold 1 sample)")
    assert build_datasets(prefix, "911,88,1", 200, 7, need=("train", "valid")).valid.samples_per_epoch == 1
    with pytest.raises(UserError, match=r"a shorter max_seq_length$"):  # no split leaves train one sample: not named
        build_datasets(prefix, "949,50,1", 1300, 7, need=("train", "valid"))
