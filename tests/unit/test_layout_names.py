"""The start-up log's `layout:` line (the strategy's name) and `check`'s resolved line (`ParallelConfig.describe`) name
one layout in the same words, the Topology's (dp and sharding axes, tp, cp, pp; ep last). PaddleNLP's DeepSeek-V3
file on 8 processes logged "pipeline (fleet 1F1B): pp 2 x dp 4, ZeRO-1 over 4, ep 4" where check said "dp 1,
sharding stage1 x4": its 4 data ranks called dp there, and dp 1 here. (No process group: the names only.)"""
import pytest

from pretrain_cli.run_layout import ParallelConfig
from run_helpers import resolve_run


def _layout_words(parallel: ParallelConfig) -> str:
    """`describe` without the world: what a strategy's name says after its engine."""
    return parallel.describe().split(", ", 1)[1]


def _strategy(parallel: ParallelConfig):
    from pretrain_cli.distributed.strategies.expert_strategy import ExpertPipeline, ExpertTensor
    from pretrain_cli.distributed.strategies.pipeline import Pipeline
    from pretrain_cli.distributed.strategies.semi_auto import SemiAuto
    from pretrain_cli.distributed.strategies.tensor_engine import TensorParallel

    expert = parallel.ep_degree > 1
    return {"pipeline": ExpertPipeline if expert else Pipeline, "semi_auto": SemiAuto,
            "tensor_parallel": ExpertTensor if expert else TensorParallel}[parallel.engine](parallel)


def test_the_deepseek_v3_file_s_layout_line_says_what_check_says():
    from pathlib import Path

    from pretrain_cli.config.resolve import resolve
    from pretrain_cli.orchestration import planned
    from pretrain_cli.run_config import Target

    v3 = Path(__file__).resolve().parents[1] / "e2e" / "paddlenlp_configs" / "deepseek_v3_pretrain_argument.json"
    args, cfg = planned.parse(str(v3), [])
    p = resolve(args, cfg, Target("cpu", 8)).parallel
    assert p.describe() == "world 8, dp 1, sharding stage1 x4, pp 2, ep 4"
    assert _strategy(p).name == "pipeline (fleet 1F1B): dp 1, sharding stage1 x4, pp 2, ep 4"


@pytest.mark.parametrize("keys,world,model", [
    (["--pipeline_parallel_degree", "2"], 4, "micro-qwen2"),
    (["--pipeline_parallel_degree", "3", "--virtual_pp_degree", "2", "--sharding", "stage1",
      "--gradient_accumulation_steps", "6"], 6, "llama-171m"),
    (["--pipeline_parallel_degree", "2", "--tensor_parallel_degree", "2", "--sharding", "stage2"], 8, "micro-qwen2"),
    (["--tensor_parallel_degree", "2", "--sequence_parallel", "true", "--sharding", "stage1"], 4, "micro-qwen2"),
    (["--tensor_parallel_degree", "2", "--sharding", "stage3"], 4, "micro-qwen2"),
    (["--tensor_parallel_degree", "2"], 2, "micro-qwen2"),
    (["--tensor_parallel_degree", "2", "--expert_parallel_degree", "2", "--sharding", "stage1"], 4,
     "micro-deepseek-v3"),
])
def test_every_named_layout_says_check_s_words(keys, world, model):
    p = resolve_run(*keys, world=world, model=model).parallel
    engine, words = _strategy(p).name.split(": ", 1)
    assert words == _layout_words(p), (engine, words, p.describe())


def test_expert_parallelism_is_said_by_one_function():
    """", ep N" after the degrees (`ParallelConfig.expert_axis`), which `describe`, the base strategy's name, context
    parallelism's and `ExpertHybrid`'s all append: each wrote it out itself."""
    assert ParallelConfig(world_size=8, dp_degree=8, ep_degree=4).expert_axis() == ", ep 4"
    assert ParallelConfig(world_size=8, dp_degree=8).expert_axis() == ""
    p = ParallelConfig(world_size=8, dp_degree=1, sharding_stage=1, sharding_degree=4, pp_degree=2, ep_degree=4)
    assert p.describe() == f"world 8, {p.axes()}{p.expert_axis()}"
    assert _strategy(p).name == f"pipeline (fleet 1F1B): {p.axes()}{p.expert_axis()}"
