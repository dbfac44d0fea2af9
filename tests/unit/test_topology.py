"""distributed.layout.topology: the one rank layout every parallel part asks (no Paddle needed for the arithmetic)."""
from __future__ import annotations

import pytest

from pretrain_cli.distributed.layout.topology import AXES, Topology, coordinates, rank_of
from pretrain_cli.run_layout import ParallelConfig


def _topo(rank=0, pp=1, dp=1, sharding=1, tp=1, stage=0):
    return Topology.of(ParallelConfig(world_size=pp * dp * sharding * tp, rank=rank, pp_degree=pp, dp_degree=dp,
                                      sharding_degree=sharding, sharding_stage=stage, tp_degree=tp))


def test_ranks_enumerate_the_axes_last_axis_fastest():
    degrees = {"pp": 4, "dp": 1, "sharding": 2, "mp": 8}  # the 70B layout: tp 8 x pp 4 x ZeRO-1 over 2
    assert tuple(AXES) == ("pp", "dp", "sharding", "cp", "mp")
    assert coordinates(0, degrees) == {"pp": 0, "dp": 0, "sharding": 0, "mp": 0}
    assert coordinates(13, degrees) == {"pp": 0, "dp": 0, "sharding": 1, "mp": 5}
    assert coordinates(63, degrees) == {"pp": 3, "dp": 0, "sharding": 1, "mp": 7}
    assert all(rank_of(coordinates(r, degrees), degrees) == r for r in range(64))


def test_tp_groups_are_neighbours_and_stages_outermost():
    t = _topo(rank=5, pp=4, sharding=2, tp=8, stage=1)
    assert t.world_size == 64 and t.stage == 0 and t.tp_rank == 5 and t.data_rank == 0
    assert t.group("mp") == tuple(range(8))  # one node of 8 GPUs holds one tensor-parallel group
    assert t.group("pp") == (5, 21, 37, 53)  # the stages of one tp slice: the only traffic between nodes
    assert t.group("sharding") == (5, 13)
    assert len(t.groups("mp")) == 8 and all(len(g) == 8 for g in t.groups("mp"))
    assert sorted(r for g in t.groups("pp") for r in g) == list(range(64))


def test_data_rank_is_paddlenlp_arithmetic_and_shared_by_tp_ranks_and_stages():
    ranks = [_topo(rank=r, pp=2, dp=2, sharding=2, tp=2, stage=1) for r in range(16)]
    assert [t.data_rank for t in ranks[:8]] == [0, 0, 1, 1, 2, 2, 3, 3]  # dp_rank x sharding + sharding_rank
    assert [t.data_rank for t in ranks[8:]] == [t.data_rank for t in ranks[:8]]  # stage 1 reads what stage 0 reads
    assert ranks[0].data_world_size == 4


def test_replicas_name_the_holders_of_a_block():
    t = _topo(rank=3, pp=2, dp=2, tp=2)  # coords pp 0, dp 1, mp 1
    assert t.replicas() == tuple(range(8))
    assert t.replicas("pp") == (0, 1, 2, 3)  # a whole tensor of stage 0
    assert t.replicas("pp", "mp") == (1, 3)  # its tp slice 1: one per data-parallel replica
    z = _topo(rank=6, pp=2, sharding=2, tp=2, stage=1)  # pp 1, sharding 1, mp 0
    assert z.replicas("pp", "sharding", "mp") == (6,)


def test_fleet_and_semi_auto_views_use_the_same_order():
    t = _topo(pp=2, dp=2, tp=2)
    assert t.fleet_hybrid_configs() == {"pp_degree": 2, "dp_degree": 2, "sharding_degree": 1, "mp_degree": 2,
                                        "order": ["pp", "dp", "sharding", "sep", "mp"]}
    with pytest.raises(ValueError, match="no pipeline axis"):
        t.mesh()


def test_built_once_per_config():
    p = ParallelConfig(world_size=4, rank=1, dp_degree=2, tp_degree=2)
    assert Topology.of(p) is Topology.of(ParallelConfig(world_size=4, rank=1, dp_degree=2, tp_degree=2))
    with pytest.raises(ValueError, match="make 2 ranks"):
        Topology.of(ParallelConfig(world_size=4, dp_degree=2))


@pytest.mark.parametrize("dp,sharding", [(2, 1), (1, 2)], ids=["tp2_pp2_dp2", "tp2_pp2_stage1"])
def test_pipeline_tp_checkpoint_blocks_cover_each_tensor_once_per_replica(dp, sharding):
    """The 8-rank layouts CPU does not launch here: every rank's block of a tp-split weight and its moments, and
    the holders each rank names, agree across ranks; a stage's two tp slices tile the tensor, and under ZeRO-1
    the optimizer state's holders are the owner's replicas only."""
    from types import SimpleNamespace

    from pretrain_cli.distributed.strategies.pipeline import Pipeline

    name = "model.layers.0.self_attn.q_proj.weight"
    blocks = {}
    for rank in range(8):
        p = ParallelConfig(world_size=8, rank=rank, pp_degree=2, dp_degree=dp, sharding_degree=sharding,
                           sharding_stage=1 if sharding > 1 else 0, tp_degree=2)
        strategy = Pipeline(p)
        strategy.tp_dims = {name: 1}  # Paddle [in, out]: column-parallel, split on out
        local = SimpleNamespace(shape=[64, 32])
        for slot in ("", "/moment1"):
            box, holders = strategy.local_box(local, name + slot)
            assert box.global_shape == (64, 64) and rank in holders
            blocks.setdefault((slot, holders), set()).add(box.offsets)
        whole, held = strategy.local_box(SimpleNamespace(shape=[64]), "model.norm.weight")
        assert whole.whole and held is None  # holders: Pipeline.holders (the stage's ranks)
        assert strategy.holders(None, "weights") == strategy.topology.replicas("pp")
    assert all(len(offsets) == 1 for offsets in blocks.values())  # every holder of a block names the same block
    weights = {h: o for (slot, h), o in blocks.items() if slot == ""}
    assert sorted(weights) == [(0, 2), (1, 3), (4, 6), (5, 7)]  # per stage and tp rank: its dp/sharding replicas
    assert {next(iter(o)) for h, o in weights.items() if h[0] < 4} == {(0, 0), (0, 32)}
    moments = sorted(h for slot, h in blocks if slot == "/moment1")
    assert moments == ([(0, 2), (1, 3), (4, 6), (5, 7)] if sharding == 1 else [(0,), (1,), (2,), (3,), (4,), (5,), (6,), (7,)])
