"""How a finished single-device model is spread over processes: one `Strategy` per layout.

Model code is single-device; parallelism is applied here from outside, like torchtitan's
`parallelize_fn` or nanoGPT's `DDP(model)`. The trainer and the checkpoint code call the same
methods whatever the layout, in this order: `place` (before the optimizer exists), `wrap`, then per
step `shard_batch`, `no_sync`, `sync_grads`, `grad_norm`, `clip`, `step`, and for checkpoints
`gather_weights` / `gather_optimizer_state` (full tensors on rank 0, whatever the layout).

- `Strategy` (one process): every method is the identity;
- `DataParallel`: `paddle.DataParallel` (gradients all-reduced in backward, once per accumulated step);
- `FleetZero1` (`sharding: stage1`): fleet's `DygraphShardingOptimizer`: each rank owns, updates and
  keeps the AdamW state of a slice of the parameters. Kept over the semi-auto engine's stage 1 because
  it is faster here (docs/DISTRIBUTED.md) and supports a sharding degree below the data-parallel world;
- `SemiAuto` (`distributed/semi_auto.py`: ZeRO-2/3 and tensor parallelism): Paddle's semi-auto engine.

`distributed.setup` picks the strategy for a resolved `ParallelConfig` and joins the process group.
"""
from __future__ import annotations

import contextlib

from pretrain_cli.ops.kernels import StepKernels


def _nbytes(t) -> int:
    if t is None:
        return 0
    v = t._local_value() if getattr(t, "is_dist", lambda: False)() else t
    return int(v.numel()) * v.element_size()


class Strategy:
    """One process: the model and optimizer as they are."""

    name = "single process"
    global_batch = False  # True: each rank's batch is declared a piece of one global batch (semi-auto)

    def __init__(self, parallel, device: str = "cpu", step_kernels: StepKernels | None = None):
        """`step_kernels`: the optimizer step's kernels (`ops.kernels.select_step`); with a fused AdamW, `clip`
        only records the coefficient and `step` hands it to the update."""
        self.parallel, self.device = parallel, device
        self.step_kernels = step_kernels or StepKernels()
        self._clip_coef = 1.0

    # ------------------------------------------------------------------ building
    def place(self, model):
        """Lay the parameters out over the processes; before the optimizer is created."""
        return model

    def wrap(self, model, optimizer):
        return model, optimizer

    def wrap_scaler(self, scaler):
        """fp16's loss scaler, made to agree across ranks on whether a step overflowed (GPU only)."""
        return scaler

    # ------------------------------------------------------------------ a step
    def shard_batch(self, tensor):
        """This rank's micro-batch as the model's input."""
        return tensor

    def no_sync(self, model, last_micro_batch: bool):
        """Skip the gradient all-reduce for all but the last micro-batch of an accumulated step."""
        return contextlib.nullcontext()

    def sync_grads(self) -> None:
        """Bring gradients to where the update needs them (after the last backward of a step)."""

    def grad_params(self, model) -> list:
        """Parameters whose gradients this rank holds fully reduced (its share of the global norm)."""
        return list(model.parameters())

    def grad_norm(self, model):
        """The global gradient L2 norm as a 0-D dense tensor (fp32), the same on every rank: a `squared_l2_norm`
        per parameter (what Paddle's ClipGradByGlobalNorm uses), or the fused step's one pass over all."""
        import paddle

        grads = [p.grad for p in self.grad_params(model) if p.grad is not None]
        return paddle.sqrt(self.global_norm_sq(self.step_kernels.global_sq_norm(grads)))

    def global_norm_sq(self, sq):
        return sq

    def clip(self, model, coef: float) -> None:
        if self.step_kernels.adamw is not None:  # the fused update scales the gradients as it reads them
            self._clip_coef = coef
            return
        import paddle

        with paddle.no_grad():
            for p in self.grad_params(model):
                if p.grad is not None:
                    p.grad.scale_(coef)

    def step(self, optimizer) -> None:
        if self.step_kernels.adamw is None:
            optimizer.step()
            return
        optimizer.step(grad_scale=self._clip_coef)
        self._clip_coef = 1.0

    def to_host(self, tensor):
        """A scalar the step computed, as a dense tensor whose value is the global one."""
        return tensor

    # ------------------------------------------------------------------ checkpoints and reports
    def gather_weights(self, model) -> dict | None:
        """{parameter name: full numpy} on rank 0 where the parameters are sharded; None where rank 0's own
        parameters are already whole (the save reads them directly). A collective where it gathers."""
        return None

    def gather_optimizer_state(self, model, read) -> dict | None:
        """The full optimizer state (HF names) on rank 0, None elsewhere; a collective where it is sharded.

        `read(to_numpy)` reads this rank's state as {"<hf name>/<slot>": numpy array}; `to_numpy` None means
        `tensor.numpy()`."""
        return read(None) if self.parallel.is_rank0 else None

    def local_bytes(self, model, optimizer) -> dict:
        """What this rank physically holds: parameters and optimizer state (AdamW moments, O2 master copies)."""
        inner = optimizer
        while hasattr(inner, "_inner_opt"):
            inner = inner._inner_opt
        state = sum(_nbytes(t) for table in inner._accumulators.values() for t in table.values())
        state += sum(_nbytes(t) for t in (getattr(inner, "_master_weights", None) or {}).values())
        return {"parameters": sum(_nbytes(p) for p in model.parameters()), "optimizer_state": state}


class DataParallel(Strategy):
    name = "data parallel (paddle.DataParallel)"

    def wrap(self, model, optimizer):
        import paddle

        return paddle.DataParallel(model, find_unused_parameters=False), optimizer

    def no_sync(self, model, last_micro_batch: bool):
        return contextlib.nullcontext() if last_micro_batch else model.no_sync()


class FleetZero1(DataParallel):
    """ZeRO-1 through fleet: each sharding rank updates (and holds the AdamW state of) its own parameters."""

    name = "ZeRO-1 (fleet DygraphShardingOptimizer)"

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

    def wrap_scaler(self, scaler):
        from paddle.distributed import fleet

        return fleet.distributed_scaler(scaler)

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

    def gather_optimizer_state(self, model, read) -> dict | None:
        """One `all_gather_object` of {key: (shape, dtype)} (small), then one broadcast per tensor from its
        owner, so no rank ever holds more than its shard plus one tensor (rank 0: the full state)."""
        import numpy as np
        import paddle
        import paddle.distributed as dist

        from pretrain_cli.models.convert import hf_param_names

        local = read(None)
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
