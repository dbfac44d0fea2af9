"""Sample construction: the split bounds, packed and padded samples, the loss mask in samples, evaluation windows
and the loss, document boundaries; the split a run resolved and build_datasets' errors. (The samples' order:
test_sample_order.py; blends: test_blend.py; epochs: test_data_epochs.py.)"""
from __future__ import annotations

import numpy as np
import pytest

from pretrain_cli.data import build_datasets
from pretrain_cli.data.indexed import open_token_file
from pretrain_cli.data.indexed_writer import IndexedDatasetWriter
from pretrain_cli.data.loader import micro_batch
from pretrain_cli.data.samples import PackedDataset
from pretrain_cli.data.splits import parse_split, split_bounds
from pretrain_cli.errors import UserError
from sample_corpus import corpus


class FakeTok:
    path = "faketok"
    bos_token_id, eos_token_id, pad_token_id = 1, 2, 0


def test_split_bounds_match_paddlenlp():
    assert split_bounds(parse_split("949,50,1"), 1000) == [0, 949, 999, 1000]
    assert split_bounds(parse_split("949/50/1"), 10) == [0, 10, 10, 10]  # rounding excess moved to the end
    assert split_bounds(parse_split("1"), 7) == [0, 7, 7, 7]
    assert split_bounds(parse_split("8,1,1"), 100) == [0, 80, 90, 100]


def test_packed_samples_concatenate_documents(tmp_path):
    prefix, docs = corpus(tmp_path / "c")
    ds = PackedDataset(open_token_file(prefix), 0, len(docs), 16, 7, "train")
    total = sum(map(len, docs))
    assert len(ds) == (total - 1) // 16
    order, cum, positions = ds._epoch(0)
    stream = np.concatenate([docs[d] for d in order])  # the epoch's shuffled document stream
    inverse = np.argsort(positions)
    for j in range(len(ds)):
        s = ds[int(inverse[j])]
        assert s["input_ids"].dtype == np.int64 and s["input_ids"].shape == (16,)
        np.testing.assert_array_equal(s["input_ids"], stream[j * 16 : j * 16 + 16])
        np.testing.assert_array_equal(s["labels"], stream[j * 16 + 1 : j * 16 + 17])  # shared boundary token
    assert ds._epoch(1)[0].tolist() != order.tolist()  # each epoch reshuffles documents
    assert ds[10 * len(ds) + 3]["input_ids"].shape == (16,)  # unbounded indices

def test_padded_mode_masks_pads(tmp_path):
    prefix, docs = corpus(tmp_path / "c", n_docs=20)
    ds = build_datasets(prefix, "1", 24, 0, sample_mode="padded", tokenizer=FakeTok(), need=("train",)).train
    assert len(ds) == 20
    seen = set()
    for i in range(20):
        s = ds[i]
        ids, labels = s["input_ids"], s["labels"]
        assert ids[0] == 1
        n = int((labels != -100).sum())  # real targets: doc tokens, then [EOT] if it fits
        body = ids[1:n] if n < 24 else ids[1:]
        match = [d for d in docs if np.array_equal(d[: body.size], body) and (n == 24 or len(d) == body.size)]
        assert match, "sample body is not a document prefix"
        if n < 24:
            assert labels[n - 1] == 2 and ids[n] == 2 and (ids[n + 1 :] == 0).all()  # [EOT] then [PAD]s
        np.testing.assert_array_equal(labels[: n - 1], ids[1:n])
        assert (labels[n:] == -100).all()
        seen.add(tuple(ids))
    assert len(seen) == 20  # one epoch = each document once
    with pytest.raises(UserError, match="faketok: tokenizer has no pad token"):
        t = FakeTok()
        t.pad_token_id = None
        build_datasets(prefix, "1", 24, 0, sample_mode="padded", tokenizer=t, need=("train",))

def test_a_run_splits_by_the_fractions_it_resolved(tmp_path, monkeypatch):
    """`split` is parsed once, by `config.resolve`; the data layer reads `RunConfig.data.split`."""
    import pretrain_cli.data as data
    from pretrain_cli.orchestration import opened
    from run_helpers import model_config, resolve_run

    prefix, _ = corpus(tmp_path / "c")
    run = resolve_run("--input_dir", prefix, "--split", "8/1/1", "--max_seq_length", "8", "--do_eval")
    assert run.data.split == pytest.approx((0.8, 0.1, 0.1)) and run.data.split_text == "8/1/1"
    want = build_datasets(prefix, "8/1/1", 8, run.loop.seed, need=("train", "valid"))
    monkeypatch.setattr(data, "parse_split", lambda text: pytest.fail(f"split {text!r} parsed again"))
    got = opened.open_splits(run, model_config(), None)
    assert [got.valid[i]["input_ids"].tolist() for i in range(3)] == [want.valid[i]["input_ids"].tolist()
                                                                      for i in range(3)]
    with pytest.raises(UserError, match=r"split: '1/0/0' leaves the valid split empty"):  # as the user wrote it
        build_datasets(prefix, (1.0, 0.0, 0.0), 8, 0, need=("train", "valid"), split_text="1/0/0")


def test_build_errors(tmp_path):
    prefix, _ = corpus(tmp_path / "c")
    with pytest.raises(UserError, match=r"split: '1,0,0' leaves the valid split empty.*do_eval"):
        build_datasets(prefix, "1,0,0", 8, 0, need=("train", "valid"))
    assert build_datasets(prefix, "1,0,0", 8, 0, need=("train",)).valid is None
    with pytest.raises(UserError, match=r"c.bin: max token id 4\d\d >= vocab_size 100"):
        build_datasets(prefix, "1", 8, 0, need=("train",), vocab_size=100)
    with pytest.raises(UserError, match="fewer than one sample"):
        build_datasets(prefix, "1", 100_000, 0, need=("train",))
    with pytest.raises(UserError, match="split: 'a,b' is not numbers"):
        build_datasets(prefix, "a,b", 8, 0)
    with pytest.raises(UserError, match="input_dir: weight -1 .* must be positive"):
        build_datasets(f"-1 {prefix} 1 {prefix}", "1", 8, 0)
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="holds no .idx"):
        build_datasets(str(tmp_path / "empty"), "1", 8, 0)

def test_loss_mask_keeps_masked_targets_out_of_packed_and_padded_samples(tmp_path):
    """`.lsm` (one byte per token): a 0 removes that token from the loss as a target (label -100)."""
    prefix, docs = corpus(tmp_path / "m", n_docs=30)
    stream = np.concatenate(docs)
    mask = (np.random.default_rng(5).random(stream.size) > 0.3).astype(np.uint8)
    mask.tofile(prefix + ".lsm")
    src = open_token_file(prefix)
    ds = PackedDataset(src, 0, len(docs), 16, 7, "train")
    order, _, positions = ds._epoch(0)
    starts = np.concatenate(([0], np.cumsum([len(d) for d in docs])))
    epoch_tokens = np.concatenate([docs[d] for d in order])
    epoch_mask = np.concatenate([mask[starts[d]:starts[d + 1]] for d in order])
    inverse = np.argsort(positions)
    for j in range(len(ds)):
        s = ds[int(inverse[j])]
        want = epoch_tokens[j * 16 + 1: j * 16 + 17].astype(np.int64)
        want[epoch_mask[j * 16 + 1: j * 16 + 17] == 0] = -100
        np.testing.assert_array_equal(s["labels"], want)
        np.testing.assert_array_equal(s["input_ids"], epoch_tokens[j * 16: j * 16 + 16])  # inputs unchanged
    from pretrain_cli.data.samples import PaddedDataset

    padded = PaddedDataset(src, 0, len(docs), 64, 7, "train", bos=1, eos=2, pad=0)
    d = int(padded._epoch(0)[0][0])
    s = padded[0]
    n = len(docs[d])
    want = np.concatenate((docs[d], [2])).astype(np.int64)  # targets: the document, then EOS
    want[:n][mask[starts[d]:starts[d + 1]] == 0] = -100
    np.testing.assert_array_equal(s["labels"][: n + 1], want)
    assert (s["labels"][n + 1:] == -100).all()


def test_loss_mask_changes_the_loss_to_the_hand_computed_one(tmp_path):
    """The trainer's loss over a masked sample equals the mean over the unmasked targets, computed by hand."""
    from pretrain_cli import runtime

    paddle = runtime.import_paddle()
    from pretrain_cli.ops.loss import causal_lm_loss_sum, mean_loss

    prefix, docs = corpus(tmp_path / "h", n_docs=20)
    total = sum(map(len, docs))
    mask = np.ones(total, np.uint8)
    mask[::3] = 0
    mask.tofile(prefix + ".lsm")
    sample = PackedDataset(open_token_file(prefix), 0, len(docs), 12, 3, "train")[4]
    logits = np.random.default_rng(1).standard_normal((1, 12, 500)).astype("float32")
    got = float(mean_loss(*causal_lm_loss_sum(paddle.to_tensor(logits), paddle.to_tensor(sample["labels"][None]))))
    lse = np.log(np.exp(logits[0].astype("float64")).sum(-1))
    kept = [t for t in range(12) if sample["labels"][t] != -100]
    assert 0 < len(kept) < 12
    want = np.mean([lse[t] - logits[0, t, sample["labels"][t]] for t in kept])
    assert got == pytest.approx(want, abs=1e-5)


def test_eval_windows_apply_the_loss_mask():
    from pretrain_cli.training.evaluation import window_batches

    tokens = np.arange(21)
    mask = np.ones(21, np.uint8)
    mask[[3, 12]] = 0
    b = next(window_batches(tokens, 5, 4, loss_mask=mask))
    assert b["labels"][0].tolist() == [1, 2, -100, 4, 5]  # token 3 is window 0's third target
    assert b["labels"][2].tolist() == [11, -100, 13, 14, 15]
    assert b["input_ids"][0].tolist() == [0, 1, 2, 3, 4]


def test_document_fields_from_starts():
    from pretrain_cli.data.samples import document_fields

    f = document_fields([0, 3, 4, 8], 8)  # the document starting at 8 holds only the last label
    assert f["doc_start"].tolist() == [0, 0, 0, 3, 4, 4, 4, 4]
    assert f["position_ids"].tolist() == [0, 1, 2, 0, 0, 1, 2, 3]
    assert set(document_fields([0], 4, reset_position_ids=False)) == {"doc_start"}


def test_document_mask_samples_carry_where_each_document_begins(tmp_path):
    """Document d is the token 10 + d repeated, so boundaries in a sample are where the token changes."""
    rng = np.random.default_rng(3)
    docs = [np.full(int(n), 10 + d) for d, n in enumerate(rng.integers(1, 30, size=50))]
    with IndexedDatasetWriter(tmp_path / "c", np.uint16) as w:
        w.add_documents(np.concatenate(docs), [len(d) for d in docs])
        w.finalize()
    src = open_token_file(str(tmp_path / "c"))
    plain = PackedDataset(src, 0, 50, 16, 7, "train")
    masked = PackedDataset(src, 0, 50, 16, 7, "train", document_mask=True)
    kept = PackedDataset(src, 0, 50, 16, 7, "train", document_mask=True, reset_position_ids=False)
    for i in range(len(plain)):
        a, b = plain[i], masked[i]
        assert set(a) == {"input_ids", "labels"} and set(kept[i]) == {"input_ids", "labels", "doc_start"}
        np.testing.assert_array_equal(a["input_ids"], b["input_ids"])  # same tokens, same order
        np.testing.assert_array_equal(a["labels"], b["labels"])
        t = b["input_ids"]
        want = [min(j for j in range(p + 1) if (t[j:p + 1] == t[p]).all()) for p in range(16)]
        assert b["doc_start"].tolist() == want
        assert b["position_ids"].tolist() == [p - s for p, s in enumerate(want)]
        np.testing.assert_array_equal(kept[i]["doc_start"], b["doc_start"])
    batch = micro_batch(masked, 4, 3)
    assert batch["doc_start"].shape == batch["position_ids"].shape == (3, 16)
    assert batch["doc_start"].dtype == np.int64
    assert set(micro_batch(plain, 4, 3)) == {"input_ids", "labels"}
    splits = build_datasets(str(tmp_path / "c"), "1", 16, 7, document_mask=True, need=("train",))
    np.testing.assert_array_equal(splits.train[5]["doc_start"], masked[5]["doc_start"])
