"""Blends of several token files (`data.blend.BlendedDataset`): the realised ratios and the closed-form order, a
directory's files blended and cached on disk, a blend located from two threads at once, and its epochs begun over a
global batch."""
from __future__ import annotations

import numpy as np

from pretrain_cli.data import build_datasets
from pretrain_cli.data.blend import BlendedDataset
from sample_corpus import corpus


def test_blending_ratios_and_chunks(tmp_path):
    a, _ = corpus(tmp_path / "a", seed=1)
    b, _ = corpus(tmp_path / "b", seed=2)
    c, _ = corpus(tmp_path / "c", seed=3)
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
    corpus(tmp_path / "d" / "x", seed=1)
    corpus(tmp_path / "d" / "y", seed=2)
    cache = tmp_path / "cache"
    s1 = build_datasets(str(tmp_path / "d"), "8,1,1", 8, 5, data_cache=str(cache))
    assert isinstance(s1.train, BlendedDataset) and s1.train.names == ["x", "y"]
    first = [s1.train[i]["input_ids"] for i in range(50)]
    assert list(cache.glob("*.npy")) and not list(cache.glob("*.tmp*"))
    s2 = build_datasets(str(tmp_path / "d"), "8,1,1", 8, 5, data_cache=str(cache))  # loads the cache
    assert all(np.array_equal(x, s2.train[i]["input_ids"]) for i, x in enumerate(first))
    assert s2.valid is not None and s2.test is not None

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
