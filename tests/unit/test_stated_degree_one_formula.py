"""One formula for "how many processes give the stated degrees" (`config.one_process.least_data_ranks`, by
`stated_unmet`'s rule) in every line that names a count: `config.expert`'s expert_parallel_degree line, which counted
its own lcm (ep 4 and a stated data_parallel_degree 2 on 2 processes: 'run it on 4', where the stated degree's line
then said 'remove the key'); `orchestration.host_fit`'s GPU question ('a multiple of 8', most of them refused);
`plan --fit -o`'s rewrite of a stated degree (`orchestration.planned._stated`, which rewrote one PaddleNLP's dp
gives); and the option the line names under `plan` (`--gpus`, not `check --world_size`)."""
import re

import pytest
from run_helpers import BASE, model_config, resolve_run

from pretrain_cli.config.parser import parse_config
from pretrain_cli.config.resolve import resolve
from pretrain_cli.errors import UserError
from pretrain_cli.run_config import Target

MOE = "micro-qwen3-moe"


def _line(keys, world: int, start: str, model: str = MOE, planned: bool = False) -> str:
    args = parse_config(None, [*BASE, *keys])
    with pytest.raises(UserError) as e:
        resolve(args, model_config(model), Target("cpu", world, 0, 0, None, planned=planned))
    return next(x for x in str(e.value).splitlines() if x.startswith(start))


def test_the_expert_line_and_the_stated_degree_line_agree_where_no_count_gives_both():
    """ep 4 needs 4 data ranks, a stated data_parallel_degree 2 (no sharding) is 2 of them: the expert line said 'run
    it on 4 processes', where the stated degree's line says 'remove the key'. Now both name removing it, and each
    fix the expert line names passes."""
    keys = ["--expert_parallel_degree", "4", "--data_parallel_degree", "2"]
    line = _line(keys, 2, "expert_parallel_degree")
    assert line == ("expert_parallel_degree: 4 does not divide the 2 data ranks (dp x sharding) it is drawn from, and "
                    "no process count gives it with data_parallel_degree 2; remove data_parallel_degree and run it on "
                    "4 processes (4 data ranks: `check --world_size 4`, `NPROC=4 scripts/launch.sh` on CPU), or use a "
                    "divisor of 2 (1: off)")
    there = _line(keys, 4, "data_parallel_degree")
    assert "no process count gives 2 with expert_parallel_degree 4: remove the key" in there
    assert resolve_run("--expert_parallel_degree", "4", world=4, model=MOE).parallel.ep_degree == 4
    assert resolve_run("--expert_parallel_degree", "2", "--data_parallel_degree", "2", world=2, model=MOE).parallel


@pytest.mark.parametrize("keys,world,named", [
    (["--expert_parallel_degree", "4", "--data_parallel_degree", "8"], 2, 8),  # lcm(2, 4) = 4 gave 4 data ranks, not 8
    (["--expert_parallel_degree", "4", "--data_parallel_degree", "4"], 6, 4),  # lcm(6, 4) = 12: 12 data ranks, not 4
    (["--expert_parallel_degree", "4"], 6, 12),  # no stated degree: the fewest with the layout's data ranks kept
])
def test_the_count_the_expert_line_names_passes_the_stated_degree(keys, world, named):
    line = _line(keys, world, "expert_parallel_degree")
    assert int(re.search(r"run it on (\d+) processes", line).group(1)) == named
    assert resolve_run(*keys, world=named, model=MOE).parallel.ep_degree == 4


def test_the_gpu_question_offers_only_counts_that_give_the_stated_degree():
    """tp 2 with data_parallel_degree 4 (no stage): 8 processes (4 data ranks) only; the question said 'a multiple of
    8', and 16 is refused ('give 8 data ranks')."""
    from pretrain_cli.config.one_process import stated_process_counts
    from pretrain_cli.orchestration.host_fit import gpu_question

    keys = ["--tensor_parallel_degree", "2", "--data_parallel_degree", "4"]
    gpu = [k for k in BASE if k not in ("--device", "cpu")]
    question = gpu_question(parse_config(None, [*gpu, *keys]))
    assert question.endswith("(N: the GPUs, 8: data_parallel_degree 4 pins the data ranks)")
    with pytest.raises(UserError, match="give 8 data ranks"):
        resolve_run(*keys, world=16)
    assert resolve_run(*keys, world=8).parallel.dp_degree == 4
    # under ZeRO with an explicit sharding degree of 2 the stated 4 is PaddleNLP's dp (it was also taken as the data
    # ranks, 4 processes, where PaddleNLP's dp is 2): 8 processes only
    zero = ["--data_parallel_degree", "4", "--sharding", "stage1", "--sharding_parallel_degree", "2"]
    assert stated_process_counts(parse_config(None, [*BASE, *zero])) == [8]
    assert gpu_question(parse_config(None, [*gpu, *zero])).endswith(
        "(N: the GPUs, 8: data_parallel_degree 4 pins the data ranks)")
    assert resolve_run(*zero, world=8).parallel.dp_degree == 4
    with pytest.raises(UserError, match="give 2 data ranks"):
        resolve_run(*zero, world=4)
    with pytest.raises(UserError, match="give 6 data ranks"):
        resolve_run(*zero, world=12)
    assert gpu_question(parse_config(None, [*gpu, "--tensor_parallel_degree", "2"])).endswith(
        "(N: the GPUs, a multiple of 2)")


def test_the_gpu_question_names_the_key_no_count_gives():
    from pretrain_cli.orchestration.host_fit import gpu_question

    gpu = [k for k in BASE if k not in ("--device", "cpu")]
    question = gpu_question(parse_config(None, [*gpu, "--expert_parallel_degree", "4", "--data_parallel_degree", "2"]))
    assert question.endswith("(N: the GPUs, a multiple of 4, without data_parallel_degree 2: no count gives it with "
                             "the other keys)")


@pytest.mark.parametrize("keys,world,start", [
    (["--data_parallel_degree", "3", "--tensor_parallel_degree", "2", "--pipeline_parallel_degree", "2",
      "--gradient_accumulation_steps", "4"], 4, "data_parallel_degree"),
    (["--expert_parallel_degree", "4"], 6, "expert_parallel_degree"),
])
def test_under_plan_the_line_names_plans_option(keys, world, start):
    """`plan --gpus 4` was told to run `check --world_size 12`: the option of the command the user ran."""
    model = MOE if start.startswith("expert") else "micro-qwen2"
    planned = _line(keys, world, start, model, planned=True)
    assert "`plan --gpus 12`" in planned and "--world_size" not in planned and "NPROC" not in planned
    assert "`check --world_size 12`" in _line(keys, world, start, model)


def test_fit_keeps_a_stated_degree_paddlenlp_gives_without_a_stage():
    """`plan --fit -o` kept a stated degree only where it was the layout's dp or data ranks: without a ZeRO stage
    `sharding_parallel_degree: 2` on 4 processes leaves PaddleNLP's dp 2 (world / (sharding x tp x ...)), which
    `train` accepts, and -o rewrote it to 4. `stated_unmet` decides now."""
    from pretrain_cli.orchestration import planned

    args = parse_config(None, [*BASE, "--data_parallel_degree", "2", "--sharding_parallel_degree", "2"])
    assert resolve_run("--data_parallel_degree", "2", "--sharding_parallel_degree", "2", world=4).parallel
    replan = planned._replanner(planned._unstated(args), model_config(), "cpu", 4, None, 0.0, None)
    found = {"after": {"speed": {}}, "change": {"per_device_train_batch_size": 1}, "diff": []}
    kept = planned._stated(found, [("data_parallel_degree", 2)], replan, args)
    assert kept["change"]["data_parallel_degree"] == 2 and kept["diff"] == []
    moved = planned._stated({**found, "change": {"sharding_parallel_degree": 4}}, [("data_parallel_degree", 2)],
                            replan, args)  # PaddleNLP's dp 1, 4 data ranks: not 2
    assert moved["change"]["data_parallel_degree"] == 4 and moved["diff"] == [("data_parallel_degree", 2, 4)]
