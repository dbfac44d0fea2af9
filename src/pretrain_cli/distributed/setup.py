"""Joining the process group and choosing the `Strategy` for a resolved `ParallelConfig`.

Each layout's strategy (and the engine under it):

- one process: `Strategy` (none);
- data parallel: `DataParallel` (`paddle.DataParallel`);
- `sharding: stage1`, no TP: `FleetZero1` (fleet `DygraphShardingOptimizer`);
- `sharding: stage2/3`, or `tensor_parallel_degree > 1` (with any stage): `SemiAuto` (`dist.shard_layer` +
  `dist.shard_optimizer`);
- `pipeline_parallel_degree > 1` (with tp, sp, cp, dp, stage1/2): `Pipeline` (`hybrid.Hybrid` + the 1F1B schedule;
  fleet `PipelineLayer` + `PipelineParallel`; the layout steps);
- `tensor_parallel_degree > 1` + `sequence_parallel` or `context_parallel_degree` (with dp, stage1/2):
  `TensorParallel` (`tensor_engine`; fleet's groups; the layout steps);
- `context_parallel_degree > 1` (with dp): `DataParallel` + `context.ContextSide` (our attention over the cp group +
  `paddle.DataParallel`); with `sharding: stage1/2`, `FleetZero1` + `context.ContextSide` (fleet
  `DygraphShardingOptimizer` over cp × sharding; stage2: unowned gradients released after each update);
- `expert_parallel_degree > 1` (with dp; `sharding: stage1`; a pipeline, tp or both, or cp, also with
  `sharding: stage1/2`): `expert_strategy.ExpertParallel` (`ExpertZero1`, `ExpertPipeline`, `ExpertTensor`): the
  experts over groups of data ranks (of each stage, cp and tp position), stepped by the AdamW itself; the rest
  averaged over them or through fleet's ZeRO-1/2 (fleet's 1F1B; the tp step on fleet's groups).

The model side of every layout is `distributed.steps.order` (tp, cp, ep, recompute, pp in that order); the list above
is the data side each engine adds.
"""
from __future__ import annotations

from pretrain_cli.distributed.launcher import launch
from pretrain_cli.distributed.comms import store
from pretrain_cli.distributed.comms.collectives import for_device
from pretrain_cli.distributed.strategies.pipeline import Pipeline, pipeline_configs
from pretrain_cli.distributed.strategies.semi_auto import SemiAuto
from pretrain_cli.distributed.strategies.tensor_engine import TensorParallel
from pretrain_cli.distributed.strategies.strategy import DataParallel, FleetZero1, Strategy
from pretrain_cli.distributed.layout.topology import Topology
from pretrain_cli.errors import RendezvousFailed, UserError
from pretrain_cli.run_config import Loop
from pretrain_cli.run_layout import ParallelConfig


def init_process_group(parallel: ParallelConfig, seed: int = 0, loop: Loop | None = None, device: str = "cpu") -> None:
    """Join the process group when launched with more than one process (gloo on CPU, NCCL on GPU: the collectives
    backend of `device`); a pipeline also reads the micro-batching of `loop` (`run_config.Loop`)."""
    if not parallel.distributed:
        return
    import paddle.distributed as dist

    from pretrain_cli.distributed.launcher import job, progress

    # a rank that dies inside the join (gloo's store asserting in C++) leaves this record: a transient failure
    job.record(parallel.rank, RendezvousFailed.exit_code, "joining", "died while joining the process group")
    # ... and its launcher's join watch learns it waits there, and how long the run lets the other nodes' ranks take
    # to come (the start-up allowance of hang_timeout: a node alive whose ranks never come is named after it)
    job.joined(parallel.rank, False, progress.allowance("start-up", loop.hang_timeout if loop else None, 0.0))
    try:
        store.join_global(parallel.rank)  # without the fixed waits of Paddle's store client (its docstring)
        fleet_engine = parallel.engine in ("pipeline", "fleet_zero1", "tensor_parallel") or (
            parallel.engine == "context_parallel" and parallel.sharding_stage in (1, 2))
        if fleet_engine:  # fleet's engines: its hybrid groups, from the topology
            pipeline = pipeline_configs(loop, parallel) if parallel.engine == "pipeline" else None
            Topology.of(parallel).init_fleet(seed, for_device(device), pipeline)
        else:
            dist.init_parallel_env()
    except ValueError as e:  # gloo binds its sockets to the address this host's name resolves to
        if "cannot be obtained" not in str(e):
            raise
        import socket

        raise UserError(f"rank {parallel.rank}: gloo cannot resolve this host's name ({socket.gethostname()}) to an "
                        f"address; add it to /etc/hosts, or set GLOO_SOCKET_IFNAME to the network interface the nodes "
                        f"reach each other on (`ip -br addr` lists them; lo on one machine)") from None
    except (RuntimeError, OSError) as e:
        last = str(e).strip().splitlines()[-1] if str(e).strip() else e
        raise RendezvousFailed(f"rank {parallel.rank}: could not join the process group of {parallel.world_size} "
                               f"processes (master {launch.master()}): {last}; check that every node runs the same "
                               f"command, that --master is reachable and its port is free (scripts/launch.sh "
                               f"retries with new ports)") from None
    job.clear(parallel.rank)
    if dist.get_world_size() != parallel.world_size:
        raise UserError(f"rank {parallel.rank}: the process group has {dist.get_world_size()} processes, the "
                        f"launcher said {parallel.world_size}; launch with python -m paddle.distributed.launch")


def follow_micro_batching(parallel: ParallelConfig, loop: Loop) -> None:
    """fleet's pipeline micro-batching set to `loop`'s before the model is wrapped, when fleet reads it: the join
    handed fleet the accumulation this rank knew then, which a resume decided after the join changes on another
    number of data ranks (the ranks other than 0 take rank 0's checkpoint, and the global batch kept from it, once
    joined: `training.same_run.resume`; a damaged checkpoint's fallback resumes an older one). Only a pipeline."""
    if not parallel.distributed or parallel.engine != "pipeline":
        return
    from paddle.distributed import fleet

    kept = ("accumulate_steps", "micro_batch_size")  # (the others are the backend's: `Topology.init_fleet`)
    fleet.fleet._user_defined_strategy.pipeline_configs = {
        k: v for k, v in pipeline_configs(loop, parallel).items() if k in kept}


def build_strategy(parallel: ParallelConfig, device: str = "cpu", step_kernels=None, recompute=None) -> Strategy:
    """The strategy for `parallel.engine` (decided in config, modelled by planning.memory); `step_kernels`
    (`ops.kernels.select_step`) is the optimizer step one process and plain data parallel run; `recompute`
    (`run_config.Recompute` or None) the layout's recompute step."""
    context = FleetZero1 if parallel.sharding_stage in (1, 2) else DataParallel  # cp's data side
    engines = {"single": Strategy, "data_parallel": DataParallel, "fleet_zero1": FleetZero1, "semi_auto": SemiAuto,
               "pipeline": Pipeline, "context_parallel": context, "tensor_parallel": TensorParallel}
    if parallel.ep_degree > 1:  # config.expert: on the data ranks; ZeRO-1, or ZeRO-1/2 with a pipeline or tp
        from pretrain_cli.distributed.strategies.expert_strategy import (ExpertParallel, ExpertPipeline, ExpertTensor,
                                                                         ExpertZero1)

        # ZeRO-2 under context parallelism is fleet's (cp's data side): ZeRO-1 releasing the rest's unowned gradients
        fleet_zero = parallel.sharding_stage == 1 or parallel.sharding_stage == 2 and parallel.cp_degree > 1
        kind = (ExpertPipeline if parallel.pp_degree > 1 else ExpertTensor if parallel.tp_degree > 1
                else ExpertZero1 if fleet_zero else ExpertParallel)
        return kind(parallel, device, step_kernels, recompute)
    return engines[parallel.engine](parallel, device, step_kernels, recompute)
