"""The order samples reach the ranks in: independent of micro-batch size, data ranks and steps (a fresh build sees the
same), exact on resume, and the same micro-batches for every rank of one data rank."""
from __future__ import annotations

import numpy as np

from pretrain_cli.data import build_datasets
from pretrain_cli.data.loader import BatchIterator, batch_hash, micro_batch
from sample_corpus import corpus


def test_order_independent_of_batch_ranks_and_steps(tmp_path):
    prefix, _ = corpus(tmp_path / "c")
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
    prefix, _ = corpus(tmp_path / "c")
    ds = build_datasets(prefix, "1", 8, 42, need=("train",)).train
    it = BatchIterator(ds, 0, 2, 1, 2, prefetch=2)
    hashes = [batch_hash(next(it)) for _ in range(6)]
    assert it.consumed_samples == 24
    it.close()
    resumed = BatchIterator(ds, 12, 2, 1, 2, prefetch=0)  # after 3 micro-steps
    assert [batch_hash(next(resumed)) for _ in range(3)] == hashes[3:]
    assert hashes[0] == batch_hash(micro_batch(ds, 0, 2, 1, 2))

def test_every_rank_reads_its_data_ranks_batches_itself(tmp_path):
    """What the `distributed_dataloader` note says: the ranks of one data rank (its tp and cp ranks, its pipeline
    stages) each read the same micro-batches from the token files themselves, as `Trainer` opens the loader on every
    rank with its `Topology.data_rank`: nothing to distribute. The note said "Only meaningful with TP/PP" on every
    PaddleNLP file, the DeepSeek-V3 one with its pipeline too."""
    from pathlib import Path

    from pretrain_cli.distributed.layout.topology import Topology
    from pretrain_cli.orchestration.planned import from_file
    from pretrain_cli.run_layout import ParallelConfig

    ds = build_datasets(corpus(tmp_path / "c")[0], "1", 8, 42, need=("train",)).train
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
