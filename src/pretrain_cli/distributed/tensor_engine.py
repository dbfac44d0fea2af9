"""The "tensor_parallel" engine: tensor + sequence parallelism with one pipeline stage (`sequence_parallel: true`).

The pipeline's tensor-parallel machinery without the pipeline: `Pipeline._split_tensor_parallel` (the Megatron
split with `distributed.sequence_parallel`'s hooks), its gradient sync (the norms' gradients summed over the tp
group, then data parallelism or ZeRO-1 on fleet's groups), gradient norm and checkpoint pieces (each rank its tp
slices, whole tensors once); the model runs whole, its micro-batches as one process's (`Strategy`'s loop).
"""
from __future__ import annotations

from pretrain_cli.distributed.pipeline import Pipeline
from pretrain_cli.run_config import ParallelConfig


class TensorParallel(Pipeline):
    """`tensor_parallel_degree > 1` with `sequence_parallel: true` and one stage: `tensor_parallel`'s split plus
    the sequence-parallel hooks, over fleet's hybrid groups (the topology's), data parallelism on its "dp" axis and
    ZeRO-1 on "sharding" as a pipeline's; the model whole on one stage, its trainer calls as one process's. The
    embedding and LM head stay whole on every tp rank (as inside a pipeline stage)."""

    def __init__(self, parallel: ParallelConfig, device: str = "cpu", step_kernels=None):
        super().__init__(parallel, device, step_kernels)
        zero = f", ZeRO-1 over {parallel.sharding_degree}" if parallel.sharding_stage else ""
        self.name = (f"tensor parallel + sequence parallel (distributed.tensor_parallel): tp {parallel.tp_degree} x "
                     f"dp {parallel.data_world_size}{zero}")

    def place(self, model, source=None):
        from pretrain_cli.distributed.materialize import fill
        from pretrain_cli.distributed.tensor_parallel import cut_by_tp
        from pretrain_cli.models.stages import stage_bounds

        self.lm = model
        if source is not None:
            fill(model, source, lambda name: not cut_by_tp(name))
        self._split_tensor_parallel(model, source)
        self.bounds = stage_bounds(len(model.model.layers), 1)  # one stage: `pieces` keeps everything
        return model

    def wrap(self, model, optimizer):
        return model, self.shard(model, optimizer)  # the model runs whole: no pipeline engine

    def forward_backward(self, model, batches: list, amp, forward_loss):
        return super(Pipeline, self).forward_backward(model, batches, amp, forward_loss)  # `Strategy`'s loop
