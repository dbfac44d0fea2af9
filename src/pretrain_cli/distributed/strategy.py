"""How a finished single-device model is spread over processes: one `Strategy` per layout.

Model code is single-device; parallelism is applied here from outside, like torchtitan's
`parallelize_fn` or nanoGPT's `DDP(model)`. The trainer calls the same methods whatever the layout
(`wrap`, `no_sync`, `sync_grads`, `grad_params`, `global_norm_sq`, `step`, `gather_optimizer_state`):

- `Strategy` (one process): every method is the identity;
- `DataParallel`: `dist.init_parallel_env()` + `paddle.DataParallel` (gradients all-reduced in backward);
- `FleetZero1` (`sharding: stage1`): fleet's `DygraphShardingOptimizer`, each rank owning and
  updating a slice of the parameters and their AdamW state.
"""
from __future__ import annotations

import contextlib

from pretrain_cli.distributed import launch
from pretrain_cli.errors import UserError


def init_process_group(parallel, seed: int = 0) -> None:
    """Join the process group when launched with more than one process (gloo on CPU, NCCL on GPU)."""
    if not parallel.distributed:
        return
    import paddle.distributed as dist

    try:
        if parallel.zero_stage == 1:
            from paddle.distributed import fleet

            strategy = fleet.DistributedStrategy()
            strategy.hybrid_configs = {"dp_degree": parallel.dp_degree, "mp_degree": parallel.tp_degree,
                                       "pp_degree": parallel.pp_degree, "sharding_degree": parallel.sharding_degree,
                                       "order": ["dp", "pp", "sharding", "sep", "mp"]}
            strategy.tensor_parallel_configs = {"tensor_init_seed": seed}
            fleet.init(is_collective=True, strategy=strategy)
        else:
            dist.init_parallel_env()
    except (RuntimeError, OSError) as e:
        last = str(e).strip().splitlines()[-1] if str(e).strip() else e
        raise UserError(f"rank {parallel.rank}: could not join the process group of {parallel.world_size} "
                        f"processes (master {launch.master()}): {last}; check that every node runs the same "
                        f"command, that --master is reachable and its port is free") from None
    if dist.get_world_size() != parallel.world_size:
        raise UserError(f"rank {parallel.rank}: the process group has {dist.get_world_size()} processes, the "
                        f"launcher said {parallel.world_size}; launch with python -m paddle.distributed.launch")


class Strategy:
    """One process: the model and optimizer as they are."""

    def __init__(self, parallel):
        self.parallel = parallel

    def wrap(self, model, optimizer):
        return model, optimizer

    def no_sync(self, model, last_micro_batch: bool):
        """Skip the gradient all-reduce for all but the last micro-batch of an accumulated step."""
        return contextlib.nullcontext()

    def sync_grads(self) -> None:
        """Bring gradients to where the update needs them (after the last backward of a step)."""

    def grad_params(self, model) -> list:
        """Parameters whose gradients this rank holds fully reduced (its share of the global norm)."""
        return list(model.parameters())

    def global_norm_sq(self, sq):
        """The global squared gradient norm from this rank's share."""
        return sq

    def step(self, optimizer) -> None:
        optimizer.step()

    def gather_optimizer_state(self, model, read_local) -> dict | None:
        """The full optimizer state (HF names) on rank 0, None elsewhere; a collective where it is sharded.

        `read_local()` reads this rank's state as {"<hf name>/<slot>": numpy array}.
        """
        return read_local() if self.parallel.is_rank0 else None


class DataParallel(Strategy):
    def wrap(self, model, optimizer):
        import paddle

        return paddle.DataParallel(model, find_unused_parameters=False), optimizer

    def no_sync(self, model, last_micro_batch: bool):
        return contextlib.nullcontext() if last_micro_batch else model.no_sync()


class FleetZero1(Strategy):
    """ZeRO-1 through fleet: each sharding rank updates (and holds the AdamW state of) its own parameters."""

    def wrap(self, model, optimizer):
        from paddle.distributed import fleet

        model = fleet.distributed_model(model)
        self._hpo = fleet.distributed_optimizer(optimizer)
        self._dso = self._hpo._inner_opt
        hcg = self._dso._hcg
        self._group = hcg.get_sharding_parallel_group()
        self._params = list(self._dso._origin_parameter_list)
        self._owned = self._dso.filter_parameters(self._params, hcg)
        self._owner = {name: self._group.ranks[r] for name, r in self._dso._param2rank.items()}
        return model, self._hpo

    def no_sync(self, model, last_micro_batch: bool):
        return contextlib.nullcontext() if last_micro_batch else model.no_sync()

    def sync_grads(self) -> None:
        self._hpo._hybrid_sync_grad(self._params)  # reduce to the owning sharding rank (+ dp all-reduce)

    def grad_params(self, model) -> list:
        return self._owned

    def global_norm_sq(self, sq):
        import paddle.distributed as dist

        dist.all_reduce(sq, op=dist.ReduceOp.SUM, group=self._group)  # owners hold disjoint parameters
        return sq

    def step(self, optimizer) -> None:
        self._hpo._step(self._params)  # update owned parameters, then broadcast them; grads already synced

    def gather_optimizer_state(self, model, read_local) -> dict | None:
        """One `all_gather_object` of {key: (shape, dtype)} (small), then one broadcast per tensor from its
        owner, so no rank ever holds more than its shard plus one tensor (rank 0: the full state)."""
        import numpy as np
        import paddle
        import paddle.distributed as dist

        from pretrain_cli.models.convert import hf_param_names

        local = read_local()
        metas: list = []
        dist.all_gather_object(metas, {k: (list(v.shape), str(v.dtype)) for k, v in local.items()}, group=self._group)
        params = dict(model.named_parameters())
        rank = self.parallel.rank
        out = {} if rank == 0 else None
        my = self._group.ranks.index(rank)
        for ours, (hf, _) in sorted(hf_param_names(model).items()):
            owner = self._owner[params[ours].name]
            src = self._group.ranks.index(owner)
            for key in sorted(k for k in metas[src] if k.startswith(hf + "/")):
                shape, dtype = metas[src][key]
                t = paddle.to_tensor(np.ascontiguousarray(local[key])) if my == src else paddle.zeros(shape, dtype=dtype)
                dist.broadcast(t, src=owner, group=self._group)
                if out is not None:
                    out[key] = t.numpy()
        return out


def build_strategy(parallel) -> Strategy:
    if not parallel.distributed:
        return Strategy(parallel)
    if parallel.zero_stage == 1:
        return FleetZero1(parallel)
    return DataParallel(parallel)
