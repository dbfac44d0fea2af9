"""A Mixture-of-Experts model under the engines that split its weights: the semi-auto engine (ZeRO-2/3, tensor
parallelism alone) and the manual `tp` step (tensor parallelism with sequence/context parallelism or in a pipeline).

**Experts under tensor parallelism** are split by the one TP plan (`models.tp_plan`: every expert's gate/up
column-parallel, its down row-parallel, by HF name, as a dense MLP), not kept whole: a rank holds 1/tp of every
expert, so expert memory falls with tp as the dense weights' does, and the grouped kernel (`ops.grouped`) runs
unchanged on the slices (each rank concatenates its own gate and up columns, `[hidden, 2·inter/tp]` laid out
[g_r | u_r], so `swiglu_packed` sees its halves). The router (and Qwen2-MoE's shared-expert gate) stays whole and
runs on every tp rank on the same tokens, so every tp rank routes alike. Megatron's two functions sit around the
experts alone, not the whole block: `copy_to_tp` on the rows sent to the experts and `reduce_from_tp` on their
outputs *before* the combine weights multiply them. Both placements are forced by the router: its path to the
block's input is not split, so an all-reduce of the whole block input's gradient would count it tp times, and the
combine weights' gradient (`dy · expert_out`) needs the summed expert output, not one rank's part.

**Under the semi-auto engine** activations are distributed tensors and the dispatch (a sort by expert, a host
read of the counts, gathers) has no SPMD rule that keeps it local: `LocalDispatch` runs `moe.dispatch_local` on
this rank's tokens (its piece of the global batch) with this rank's blocks of the expert weights (the tp slice kept;
the local gradient declared Partial on "dp" like every weight a kernel reads, `local_kernels`), and declares the
output a piece of the global batch again. ZeRO-3's shards go to the grouped GEMM as shards, which gathers each
weight whole where it reads it, in forward and again in backward (`local_kernels.ZeroGather`): a sparse layer keeps
its experts' shards until its backward, not the experts whole (a DeepSeek-V3 layer's are 21 GiB in bf16 at tp 1).
The router, its losses and the shared expert stay on Paddle's SPMD rules, so the balance loss is the global batch's,
as one process computes it.
"""
from __future__ import annotations

from pretrain_cli.distributed.steps.tensor_parallel import SlicedExperts, expert_weights


class LocalDispatch:
    """`SparseMoeBlock.dispatch` under the semi-auto engine (module docstring; the kernel table's `moe_dispatch`, the
    `data` step's build side, `order._local_kernels`); `group` the tp group of this rank
    (None without tensor parallelism), `hook` the CPU gradient hook (`local_kernels.to_replicated`) or None."""

    def __init__(self, group, hook):
        self.group, self.hook = group, hook

    def _weight(self, w, like):
        """This rank's block of expert weight `w` as a local tensor, its gradient declared Partial where the tokens
        (`like`) are sharded; a ZeRO-3 shard as itself, gathered by the grouped GEMM where it reads it
        (`local_kernels.ZeroGather`), the tp slice kept."""
        import paddle.distributed as dist
        from paddle.distributed.auto_parallel.api import dtensor_to_local

        from pretrain_cli.distributed.steps.local_kernels import ZeroGather, _local
        from pretrain_cli.ops.grouped_gemm_layer import Gathered

        if not w.is_dist():
            return w
        if w.placements[0].is_shard():  # ZeRO-3: kept as the shard until the GEMM (and its backward) reads it
            return Gathered(_local(w), ZeroGather(w, like, self.hook is not None))
        placements = [dist.Partial() if p.is_shard() else dist.Replicate() for p in like.placements[:1]]
        return dtensor_to_local(w, w.process_mesh, placements + list(w.placements[1:]))

    def __call__(self, x, routing, experts, num_experts: int, capacity_factor: float = 0.0):
        from pretrain_cli.distributed.steps.local_kernels import _dist, _local, _no_partial
        from pretrain_cli.models.moe import Routing, dispatch_local

        if not x.is_dist():  # generation / evaluation after gathering: one process's
            return dispatch_local(x, routing, experts, num_experts, capacity_factor)
        x = _no_partial(x)
        weights = _no_partial(routing.weights)
        local = Routing(None, None, routing.indices._local_value(), _local(weights))  # this rank's tokens
        sliced = SlicedExperts(experts.kernels, expert_weights(experts, lambda w: self._weight(w, x)), self.group)
        out, counts, dropped = dispatch_local(_local(x), local, sliced, num_experts, capacity_factor)
        return _dist(out, x), counts, dropped  # [tokens, hidden]: this rank's piece of the global batch


def tp_group(topology, backend):
    """This rank's tp group, every tp group created on every rank in the same order (Paddle's rule for
    `new_group`); None without tensor parallelism."""
    import paddle.distributed as dist

    if topology.degree("mp") < 2:
        return None
    mine = None
    with backend.stores():
        for ranks in topology.groups("mp"):
            g = dist.new_group(list(ranks))
            if topology.rank in ranks:
                mine = g
    return mine

