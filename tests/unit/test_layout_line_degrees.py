"""The start-up's `layout:` line names the degrees of every engine (`ParallelConfig.axes`, check's words), so a user
scaling a run up reads which layout was built: plain data parallelism, fleet's ZeRO-1 and expert parallelism named
their engine only ("data parallel (paddle.DataParallel)" on 2 or 64 ranks alike), while the pipeline, semi-auto,
tensor-parallel and context-parallel engines said "dp 1, tp 2, pp 2". Built without joining a process group."""
import pytest

from pretrain_cli.distributed.setup import build_strategy
from pretrain_cli.run_layout import ParallelConfig


@pytest.mark.parametrize("degrees, expected", [
    (dict(world_size=4, dp_degree=4), "data parallel (paddle.DataParallel): dp 4"),
    (dict(world_size=4, dp_degree=2, sharding_stage=1, sharding_degree=2),
     "ZeRO-1 (fleet DygraphShardingOptimizer): dp 2, sharding stage1 x2"),
    (dict(world_size=4, dp_degree=4, ep_degree=2),
     "expert parallel (experts over the data ranks, the rest averaged over them): dp 4, ep 2"),
    (dict(world_size=4, dp_degree=1, sharding_stage=1, sharding_degree=4, ep_degree=4),
     "expert parallel + ZeRO-1 (experts over the data ranks, the rest fleet's DygraphShardingOptimizer): "
     "dp 1, sharding stage1 x4, ep 4"),
])
def test_layout_line_names_the_degrees(degrees, expected):
    assert build_strategy(ParallelConfig(**degrees)).name == expected


def test_engines_with_more_axes_name_them_once():
    """The semi-auto engine names itself; the base's degrees are not said twice (cp, pipeline and the `tp` step's
    engines, which join fleet's groups, are checked by their launched tests: test_context, test_tp_pipeline)."""
    name = build_strategy(ParallelConfig(world_size=4, dp_degree=1, sharding_stage=2, sharding_degree=2,
                                         tp_degree=2)).name
    assert name == "semi-auto: dp 1, sharding stage2 x2, tp 2"


def test_one_process_is_named_alone():
    assert build_strategy(ParallelConfig()).name == "single process"
