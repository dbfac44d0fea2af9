"""The only module that knows about processes: init, wrapping a finished model, collectives.

Model code is single-device; data parallelism is applied here from outside
(`paddle.DataParallel`), like torchtitan's `parallelize_fn` or nanoGPT's `DDP(model)`.
"""
from __future__ import annotations

import contextlib

from pretrain_cli.config import ParallelConfig


def init_distributed(parallel: ParallelConfig) -> None:
    """Join the process group when launched with more than one process (gloo on CPU, NCCL on GPU)."""
    if parallel.world_size <= 1:
        return
    import paddle.distributed as dist

    dist.init_parallel_env()


def is_rank0(parallel: ParallelConfig) -> bool:
    return parallel.rank == 0


def wrap_model(model, parallel: ParallelConfig, recompute: bool = False):
    """`paddle.DataParallel` for more than one data rank; the model itself is returned otherwise."""
    if parallel.world_size <= 1:
        return model
    import paddle

    return paddle.DataParallel(model, find_unused_parameters=False)


class Comm:
    """Scalar collectives the trainer needs; SUM then divide (gloo has no AVG)."""

    def __init__(self, parallel: ParallelConfig):
        self.world = parallel.world_size

    def _reduce(self, value: float, op) -> float:
        import paddle
        import paddle.distributed as dist

        t = paddle.to_tensor([float(value)], dtype="float64")
        dist.all_reduce(t, op=op)
        return float(t.numpy()[0])

    def sum(self, value: float) -> float:
        import paddle.distributed as dist

        return self._reduce(value, dist.ReduceOp.SUM)

    def mean(self, value: float) -> float:
        return self.sum(value) / self.world

    def any(self, flag: bool) -> bool:
        import paddle.distributed as dist

        return self._reduce(1.0 if flag else 0.0, dist.ReduceOp.MAX) > 0

    def no_sync(self, model):
        return model.no_sync() if hasattr(model, "no_sync") else contextlib.nullcontext()

    def barrier(self) -> None:
        import paddle.distributed as dist

        dist.barrier()


def build_comm(parallel: ParallelConfig) -> Comm | None:
    return Comm(parallel) if parallel.world_size > 1 else None
