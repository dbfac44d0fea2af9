"""Sample construction, order invariance, blending, loader and build_datasets errors."""
from __future__ import annotations

import numpy as np
import pytest

from pretrain_cli.data import build_datasets
from pretrain_cli.data.blend import BlendedDataset
from pretrain_cli.data.indexed import open_token_file
from pretrain_cli.data.indexed_writer import IndexedDatasetWriter
from pretrain_cli.data.loader import BatchIterator, batch_hash, micro_batch
from pretrain_cli.data.samples import PackedDataset, parse_split, split_bounds
from pretrain_cli.errors import UserError


def _corpus(path, n_docs=60, seed=0, base=10, vocab=500):
    """Documents with distinct, recognisable tokens: doc d holds ids base+d*... mod vocab."""
    rng = np.random.default_rng(seed)
    docs = [rng.integers(base, vocab, size=int(n)) for n in rng.integers(1, 40, size=n_docs)]
    with IndexedDatasetWriter(path, np.uint16) as w:
        w.add_documents(np.concatenate(docs), [len(d) for d in docs])
        w.finalize()
    return str(path), docs


class FakeTok:
    path = "faketok"
    bos_token_id, eos_token_id, pad_token_id = 1, 2, 0


def test_split_bounds_match_paddlenlp():
    assert split_bounds(parse_split("949,50,1"), 1000) == [0, 949, 999, 1000]
    assert split_bounds(parse_split("949/50/1"), 10) == [0, 10, 10, 10]  # rounding excess moved to the end
    assert split_bounds(parse_split("1"), 7) == [0, 7, 7, 7]
    assert split_bounds(parse_split("8,1,1"), 100) == [0, 80, 90, 100]


def test_packed_samples_concatenate_documents(tmp_path):
    prefix, docs = _corpus(tmp_path / "c")
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


def test_order_independent_of_batch_ranks_and_steps(tmp_path):
    prefix, _ = _corpus(tmp_path / "c")
    ds = build_datasets(prefix, "1", 8, 42, need=("train",)).train
    ref = np.stack([ds[i]["input_ids"] for i in range(96)])  # the global order
    for micro_bs, dp in [(1, 1), (4, 1), (2, 3), (3, 4), (6, 2)]:
        got, consumed = [], 0
        while consumed < 96:
            got += [micro_batch(ds, consumed, micro_bs, r, dp)["input_ids"] for r in range(dp)]
            consumed += micro_bs * dp
        np.testing.assert_array_equal(np.concatenate(got)[:96], ref)
    # a fresh build (e.g. a run with another max_steps) sees identical samples
    again = build_datasets(prefix, "1", 8, 42, need=("train",)).train
    np.testing.assert_array_equal(np.stack([again[i]["input_ids"] for i in range(96)]), ref)
    other_seed = build_datasets(prefix, "1", 8, 43, need=("train",)).train
    assert not np.array_equal(other_seed[0]["input_ids"], ref[0])


def test_batch_iterator_resume_is_exact(tmp_path):
    prefix, _ = _corpus(tmp_path / "c")
    ds = build_datasets(prefix, "1", 8, 42, need=("train",)).train
    it = BatchIterator(ds, 0, 2, 1, 2, prefetch=2)
    hashes = [batch_hash(next(it)) for _ in range(6)]
    assert it.consumed_samples == 24
    it.close()
    resumed = BatchIterator(ds, 12, 2, 1, 2, prefetch=0)  # after 3 micro-steps
    assert [batch_hash(next(resumed)) for _ in range(3)] == hashes[3:]
    assert hashes[0] == batch_hash(micro_batch(ds, 0, 2, 1, 2))


def test_padded_mode_masks_pads(tmp_path):
    prefix, docs = _corpus(tmp_path / "c", n_docs=20)
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


def test_blending_ratios_and_chunks(tmp_path):
    a, _ = _corpus(tmp_path / "a", seed=1)
    b, _ = _corpus(tmp_path / "b", seed=2)
    c, _ = _corpus(tmp_path / "c", seed=3)
    splits = build_datasets(f"0.5 {a} 0.3 {b} 0.2 {c}", "1", 8, 0, need=("train",))
    blend = splits.train
    assert isinstance(blend, BlendedDataset)
    ratios = blend.realized_ratios(10_000)
    assert np.allclose(ratios, [0.5, 0.3, 0.2], atol=0.01)
    assert any("requested 0.500/0.300/0.200" in line for line in splits.describe())
    # closed form == brute-force sort of all keys; prefixes stay within one sample of w*n
    n = 40_000
    ks = np.concatenate([np.full(n, k) for k in range(3)])
    js = np.concatenate([np.arange(n)] * 3)
    order = np.lexsort((ks, (js + 0.5) / blend.weights[ks]))[:n]
    got = [blend.locate(i) for i in range(0, n, 7)]
    assert got == [(int(ks[o]), int(js[o])) for o in order[::7]]
    for m in (1, 17, 1000, 33333):
        assert np.abs(blend.source_counts(m) - m * blend.weights).max() <= 1.0
    # Megatron's greedy loop agrees on realised counts within one sample
    counts = np.zeros(3)
    for i in range(3000):
        counts[np.argmax(blend.weights * (i + 1) - counts)] += 1
    assert np.abs(counts - blend.source_counts(3000)).max() <= 1
    k, j = blend.locate(123_456_789)  # O(1) far positions
    assert blend[123_456_789]["input_ids"].shape == (8,) and 0 <= k < 3 and j > 0


def test_directory_input_and_disk_cache(tmp_path):
    _corpus(tmp_path / "d" / "x", seed=1)
    _corpus(tmp_path / "d" / "y", seed=2)
    cache = tmp_path / "cache"
    s1 = build_datasets(str(tmp_path / "d"), "8,1,1", 8, 5, data_cache=str(cache))
    assert isinstance(s1.train, BlendedDataset) and s1.train.names == ["x", "y"]
    first = [s1.train[i]["input_ids"] for i in range(50)]
    assert list(cache.glob("*.npy")) and not list(cache.glob("*.tmp*"))
    s2 = build_datasets(str(tmp_path / "d"), "8,1,1", 8, 5, data_cache=str(cache))  # loads the cache
    assert all(np.array_equal(x, s2.train[i]["input_ids"]) for i, x in enumerate(first))
    assert s2.valid is not None and s2.test is not None


def test_a_run_splits_by_the_fractions_it_resolved(tmp_path, monkeypatch):
    """`split` is parsed once, by `config.resolve`; the data layer reads `RunConfig.data.split`."""
    import pretrain_cli.data as data
    from pretrain_cli.orchestration import opened
    from run_helpers import model_config, resolve_run

    prefix, _ = _corpus(tmp_path / "c")
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
    prefix, _ = _corpus(tmp_path / "c")
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
    prefix, docs = _corpus(tmp_path / "m", n_docs=30)
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

    prefix, docs = _corpus(tmp_path / "h", n_docs=20)
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


def test_where_a_reader_wraps_around_the_train_split_and_the_line_the_trainer_logs(tmp_path):
    """A long run on a small corpus reads it many times: the step that starts each epoch after the first gets one
    line (each source's, in a blend), and every sample of an epoch is read once in it, in a new order."""
    import logging
    from types import SimpleNamespace

    from pretrain_cli.training.trainer import Trainer

    prefix, _ = _corpus(tmp_path / "c")
    ds = PackedDataset(open_token_file(prefix), 0, 60, 16, 7, "train")
    n = len(ds)
    assert ds.epochs_begun(0, 3) == [("c", 0)] and ds.epochs_begun(1, n - 1) == []
    assert ds.epochs_begun(n - 1, 3) == [("c", 1)] and ds.epochs_begun(n - 2, 2 * n + 5) == [("c", 1), ("c", 2), ("c", 3)]
    seen = [sorted(int(ds._spans(i)[0][0]) * 1000 + ds._spans(i)[0][1] for i in range(e * n, (e + 1) * n))
            for e in range(3)]
    assert all(len(set(s)) == n for s in seen) and seen[0] != seen[1]  # each sample once per epoch; reshuffled
    begun = [e for first in range(0, 3 * n, 3) for e in ds.epochs_begun(first, 3)]  # batches of 3 straddle
    assert begun == [("c", 0), ("c", 1), ("c", 2)]

    other, _ = _corpus(tmp_path / "d", n_docs=20, seed=1)
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


def test_a_blend_located_from_two_threads_at_once_evicts_each_chunk_once(monkeypatch):
    """The trainer's thread (`Trainer._note_epochs` -> `epochs_begun`) and the loader's prefetch thread locate
    positions of one blend at once. Both evicting the oldest cached chunk at the same moment popped the same key
    twice (KeyError, or 'dictionary changed size during iteration', in the training loop). Here the other thread
    evicts exactly while this one is between choosing the chunk to drop and dropping it."""
    import threading

    from pretrain_cli.data import blend as blend_module

    monkeypatch.setattr(blend_module, "_CHUNK", 4)
    monkeypatch.setattr(blend_module, "_CHUNKS_IN_MEMORY", 2)
    blend = BlendedDataset([range(100), range(100)], [0.5, 0.5])
    for position in (0, 4):  # chunks 0 and 1: the cache is full
        blend.locate(position)
    errors, other = [], []

    def prefetch():
        try:
            blend.locate(12)  # chunk 3: evicts the oldest too
        except Exception as e:  # noqa: BLE001 (what the race raised)
            errors.append(repr(e))

    class Chunks(dict):
        def pop(self, key, *default):
            if not other:  # the first eviction: the prefetch thread runs now (with the fix it waits its turn)
                other.append(threading.Thread(target=prefetch))
                other[0].start()
                other[0].join(1.0)
            return super().pop(key, *default)

    blend._chunks = Chunks(blend._chunks)
    blend.locate(8)  # chunk 2: evicts chunk 0
    other[0].join(60)
    assert not other[0].is_alive() and errors == [] and len(blend._chunks) == 2
    assert blend.locate(12) == blend_module.BlendedDataset([range(100), range(100)], [0.5, 0.5]).locate(12)


def test_a_blends_epochs_begun_over_a_global_batch_is_the_per_position_answer(monkeypatch):
    """`BlendedDataset.epochs_begun` (the trainer asks it for every step's global batch) asks each source once for its
    run of consecutive samples instead of once per position (~5 ms a step at 4,096 positions x 8 sources): the same
    (source, epoch) pairs, in position order, as locating every position, on random blends and windows that cross the
    blend's chunks, begin several epochs of one source, or hold no sample of another."""
    from types import SimpleNamespace

    from pretrain_cli.data import blend as blend_module
    from pretrain_cli.data.samples import PackedDataset

    class Source:  # a split's epochs (`PackedDataset.epochs_begun`) without its token files
        epochs_begun = PackedDataset.epochs_begun

        def __init__(self, n, name):
            self.samples_per_epoch, self.source = n, SimpleNamespace(prefix=f"/data/{name}")

        def __len__(self):
            return self.samples_per_epoch

    monkeypatch.setattr(blend_module, "_CHUNK", 64)
    rng = np.random.default_rng(0)
    checked = begun = 0
    for trial in range(20):
        k = int(rng.integers(1, 9))
        sources = [Source(int(n), f"s{i}") for i, n in enumerate(rng.integers(1, 40, k))]
        blend = BlendedDataset(sources, list(rng.random(k) + 0.01), [f"s{i}" for i in range(k)])
        for _ in range(20):
            first, count = int(rng.integers(0, 5000)), int(rng.integers(0, 300))
            want = [e for i in range(first, first + count)
                    for e in sources[blend.locate(i)[0]].epochs_begun(blend.locate(i)[1], 1)]
            assert blend.epochs_begun(first, count) == want, (trial, first, count)
            checked, begun = checked + 1, begun + len(want)
    assert checked == 400 and begun > 1000  # (windows that begin many epochs, of several sources)
    # the cost: 4,096 positions of 8 sources asked each source once for its run (+ a bisection per epoch begun);
    # locating every position in Python asked them 4,096 times
    calls = []
    monkeypatch.setattr(Source, "epochs_begun", lambda self, j, n: calls.append(n) or PackedDataset.epochs_begun(
        self, j, n))
    sources = [Source(int(n), f"s{i}") for i, n in enumerate(rng.integers(500, 5000, 8))]
    blend = BlendedDataset(sources, list(rng.random(8) + 0.1))
    assert len(blend.epochs_begun(10_000, 4096)) >= 2 and len(calls) < 100, len(calls)


def test_the_start_up_data_line_says_how_many_epochs_the_run_reads(tmp_path):
    prefix, _ = _corpus(tmp_path / "c")
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


def test_every_rank_reads_its_data_ranks_batches_itself(tmp_path):
    """What the `distributed_dataloader` note says: the ranks of one data rank (its tp and cp ranks, its pipeline
    stages) each read the same micro-batches from the token files themselves, as `Trainer` opens the loader on every
    rank with its `Topology.data_rank`: nothing to distribute. The note said "Only meaningful with TP/PP" on every
    PaddleNLP file, the DeepSeek-V3 one with its pipeline too."""
    from pathlib import Path

    from pretrain_cli.distributed.layout.topology import Topology
    from pretrain_cli.orchestration.planned import from_file
    from pretrain_cli.run_layout import ParallelConfig

    ds = build_datasets(_corpus(tmp_path / "c")[0], "1", 8, 42, need=("train",)).train
    par = ParallelConfig(world_size=16, pp_degree=2, dp_degree=2, cp_degree=2, tp_degree=2)
    by_data_rank: dict = {}
    for rank in range(16):
        topo = Topology.of(ParallelConfig(**{**par.__dict__, "rank": rank}))
        ids = micro_batch(ds, 8, 2, topo.data_rank, topo.data_world_size)["input_ids"]
        by_data_rank.setdefault(topo.data_rank, []).append(ids)
    assert sorted(by_data_rank) == [0, 1] and all(len(v) == 8 for v in by_data_rank.values())  # 2 x tp x cp x pp
    for same in by_data_rank.values():
        assert all(np.array_equal(ids, same[0]) for ids in same)
    assert not np.array_equal(by_data_rank[0][0], by_data_rank[1][0])
    dsv3 = Path(__file__).resolve().parents[1] / "e2e" / "paddlenlp_configs" / "deepseek_v3_pretrain_argument.json"
    note = next(n for n in from_file(str(dsv3), [], device="H100", gpus=8, suggest_changes=False).notes
                if n.startswith("distributed_dataloader:"))
    assert "Only meaningful with TP/PP" not in note and "pipeline stages read the same ones" in note
