"""The "tensor_parallel" engine: tensor parallelism on one pipeline stage with sequence and/or context parallelism.

`Hybrid`'s layout steps (`distributed.steps.order`: the Megatron split with `sequence_parallel`'s regions when asked;
the ring attention the model was built with under `context_parallel_degree`), gradient sync (the norms' gradients
summed over the tp group, then data parallelism or ZeRO-1 on fleet's groups, the mean over the cp ranks too),
gradient norm and checkpoint pieces (each rank its tp slices, whole tensors once); the model runs whole, its
micro-batches as one process's (`Strategy.forward_backward`), each rank's chunks under context parallelism.
"""
from __future__ import annotations

from pretrain_cli.distributed.strategies.hybrid import Hybrid
from pretrain_cli.run_layout import ParallelConfig


class TensorParallel(Hybrid):
    """`tensor_parallel_degree > 1` with `sequence_parallel: true` or `context_parallel_degree > 1` and one stage:
    `tensor_parallel`'s split plus the sequence-parallel hooks, over fleet's hybrid groups (the topology's), data
    parallelism on its "dp" axis and ZeRO-1 on "sharding" (× cp) as a pipeline's; the model whole on one stage.
    The embedding and LM head stay whole on every tp rank (as inside a pipeline stage)."""

    def __init__(self, parallel: ParallelConfig, device: str = "cpu", step_kernels=None, recompute=None):
        super().__init__(parallel, device, step_kernels, recompute)
        self.name = (f"tensor parallel (distributed.steps.tensor_parallel): {parallel.axes()}"
                     f"{parallel.fleet_sharding()}")  # check's words

    def wrap(self, model, optimizer):
        return self.model_inputs(model), self.shard(model, optimizer)  # the model runs whole: no pipeline engine
