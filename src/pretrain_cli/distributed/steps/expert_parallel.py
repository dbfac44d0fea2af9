"""Expert parallelism: a Mixture-of-Experts model's routed experts split over groups of `ep` data ranks.

Applied from outside the single-device model, as the `ep` layout step (`distributed.steps.order`: `apply_ep`, this
module) and the data side in `distributed.strategies.expert_strategy` (`ExpertParallel`, `ExpertZero1`,
`ExpertPipeline`, which reduce the experts on their own; apart, so the steps need no strategy):

- **held experts**: rank r of an expert group (`Topology.expert_rank`) holds experts [r·E/ep, (r+1)·E/ep) of every
  sparse layer (`held_range`); the others are removed from its model before any parameter is created, so a lazily
  built model never creates them (`ExpertParallel.place`: `materialize.fill` skips them; docs/DISTRIBUTED.md,
  start-up). Each kept expert keeps its HF name (`mlp.experts.{e}.*`), so checkpoints are by name as ever.
- **dispatch** (`GatherDispatch` on gloo, the kernel table's `moe_dispatch` the model is built with,
  `expert_kernels`; on NCCL the all-to-all form, `expert_all_to_all`; the same inputs and outputs as
  `moe.dispatch_local`): the group's tokens and routes are all-gathered, each rank runs
  its experts over the rows routed to them (sorted by expert, one grouped computation, as `moe.dispatch_local`),
  and the outputs are summed over the group with this rank's tokens kept (a reduce-scatter). Both are autograd functions
  whose backward is the other, so the combine weights' and the tokens' gradients return to their owners. This is the
  form gloo can run (no all-to-all: docs/DISTRIBUTED.md, "Expert parallelism") and it is exact: each assignment is
  computed once, by its expert's holder. Dropless only.
- **with tensor parallelism** (`tp_group`): each held expert is also cut by the `tp` step like a dense MLP (expert
  tensor parallelism: Megatron-Core's `expert_tensor_parallel_size` = tp), and the ranks of a tp group route the
  same tokens alike, so the expert group (the same tp position on each data rank) gathers as without tp and runs
  its slices between Megatron's two functions over the tp group (`tensor_parallel.SlicedExperts`): the held
  experts ÷ (ep · tp) on each rank, and the tp all-reduce on the held rows only (docs/DISTRIBUTED.md says why).
- **gradients**: the experts are left out of the data ranks' reduction of the rest (`ExpertSide.params`, which the
  strategy reduces) and summed over the ranks that hold the same experts (`Topology.expert_replicas`), then
  divided by the data ranks, as the rest is averaged: the dispatch's backward already summed the group's tokens
  into them. The gradient norm adds the experts' squares over the expert group (each rank holds different ones).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from paddle.autograd import PyLayer  # imported lazily, after the environment


EXPERT = re.compile(r"\.mlp\.experts\.(\d+)\.")  # HF's per-expert names: model.layers.{i}.mlp.experts.{e}.*


def held_range(num_experts: int, ep: int, expert_rank: int) -> range:
    """The experts (global indices) the rank at `expert_rank` of an expert group of `ep` holds."""
    per = num_experts // ep
    return range(expert_rank * per, (expert_rank + 1) * per)


def expert_of(name: str) -> int | None:
    """The routed expert a parameter (HF name; optimizer state "<name>/<slot>") belongs to, or None."""
    m = EXPERT.search(name)
    return int(m.group(1)) if m else None


def sparse_blocks(model) -> list:
    """Every SparseMoeBlock of the model, in layer order."""
    from pretrain_cli.models.moe import SparseMoeBlock

    return [layer for layer in model.sublayers() if isinstance(layer, SparseMoeBlock)]


def keep_held(model, held: range) -> None:
    """Remove every expert outside `held` from each sparse layer (before their parameters exist, on a lazy model)."""
    for block in sparse_blocks(model):
        experts = block.experts
        for e in range(experts.first, experts.first + experts.count):
            if e not in held:
                del experts._sub_layers[str(e)]
        experts.first, experts.count = held.start, len(held)


class Gather(PyLayer):
    """All-gather of the tokens and their combine weights over the expert group (`ex`: the `GatherDispatch`) whose
    backward reduce-scatters their gradients. One autograd function for both, so every rank runs the two
    reduce-scatters in this order: as two, their order in backward followed each rank's graph, which differs on a
    rank whose experts got no row (it reads the gathered tensors only through `0 ·` terms), and the ranks' collectives
    then met different tensors (tests/unit/test_expert_all_to_all.py)."""

    @staticmethod
    def forward(ctx, x, weights, ex):
        ctx.ex, ctx.shapes = ex, ((x.shape, x.dtype), (weights.shape, weights.dtype))
        return ex.backend.all_gather(x, ex.group, axis=0), ex.backend.all_gather(weights, ex.group, axis=0)

    @staticmethod
    def backward(ctx, dxs, dweights):
        import paddle

        ex = ctx.ex
        grads = []
        for dy, (shape, dtype) in zip((dxs, dweights), ctx.shapes):
            dy = paddle.zeros([ex.ep * shape[0], *shape[1:]], dtype=dtype) if dy is None else dy
            grads.append(ex.backend.reduce_scatter(dy, ex.group, ex.ep, ex.me, axis=0))  # [tokens, ...]
        return tuple(grads)


class Combine(PyLayer):
    """`Gather`'s mirror image: reduce-scatter over the expert group, all-gather backward."""

    @staticmethod
    def forward(ctx, y, ex):
        ctx.ex = ex
        return ex.backend.reduce_scatter(y, ex.group, ex.ep, ex.me, axis=0)  # [tokens, ...]

    @staticmethod
    def backward(ctx, dy):
        ex = ctx.ex
        return ex.backend.all_gather(dy, ex.group, axis=0)  # [ep·tokens, ...]


class GatherDispatch:
    """`SparseMoeBlock.dispatch` over an expert group (module docstring): (x `[tokens, hidden]`, routing, the held
    experts, num_experts, capacity_factor) -> (output `[tokens, hidden]`, this rank's tokens' counts fp32
    `[experts]`, dropped fp32 `[]`: 0)."""

    def __init__(self, group, ep: int, me: int, backend, tp_group=None):
        self.group, self.ep, self.me, self.backend, self.tp_group = group, ep, me, backend, tp_group

    def compute(self, experts):
        """What runs the held experts over their sorted rows: themselves, or under tensor parallelism their
        slices between the tp group's two functions (module docstring)."""
        if self.tp_group is None:
            return experts
        from pretrain_cli.distributed.steps.tensor_parallel import SlicedExperts, expert_weights

        return SlicedExperts(experts.kernels, expert_weights(experts, lambda w: w), self.tp_group)

    def __call__(self, x, routing, experts, num_experts: int, capacity_factor: float = 0.0):
        import paddle

        if capacity_factor > 0:
            raise ValueError("expert parallelism runs dropless (config refuses a capacity factor with it)")
        top_k = routing.indices.shape[1]
        counts = paddle.bincount(routing.indices.reshape([-1]), minlength=num_experts).astype("float32")  # [experts]
        xs, weights = Gather.apply(x, routing.weights, self)  # [ep·tokens, hidden], [ep·tokens, top_k]
        indices = self.backend.all_gather(routing.indices, self.group, axis=0)  # [ep·tokens, top_k]
        flat = indices.reshape([-1])  # [ep·tokens·top_k]
        local = flat - experts.first  # this rank's expert index of each assignment (outside: not held)
        mine = paddle.logical_and(local >= 0, local < experts.count)  # [ep·tokens·top_k]
        picked = paddle.masked_select(paddle.arange(flat.shape[0], dtype="int64"), mine)  # [held assignments]
        order = paddle.gather(picked, paddle.argsort(paddle.gather(local, picked), stable=True))  # by expert
        host_counts = [int(c) for c in paddle.bincount(paddle.gather(local, picked),
                                                       minlength=experts.count).numpy()]
        # every gathered input takes part in the graph, so each rank runs the same collectives in backward
        out = paddle.zeros_like(xs) + 0.0 * (xs.sum() + weights.sum())  # [ep·tokens, hidden]
        if order.shape[0]:
            rows = paddle.gather(xs, order // top_k)  # [held assignments, hidden]
            out_rows = self.compute(experts)(rows, host_counts)  # [held assignments, hidden]
            w = paddle.gather(weights.reshape([-1]), order).astype(out_rows.dtype).unsqueeze(-1)  # [held, 1]
            out = paddle.index_add(out, order // top_k, 0, out_rows * w)  # [ep·tokens, hidden]
        else:  # no row for this rank's experts: they still take part (zero gradients, the same all-reduces; a tp
            # group's ranks route alike, so none of them runs the tp all-reduce)
            out = out + experts.idle([0] * experts.count).astype(out.dtype)
        return Combine.apply(out, self), counts, paddle.zeros([], dtype="float32")


@dataclass
class ExpertSide:
    """What the `ep` step leaves for the data side: this rank's expert group and expert-replica group (None for a
    group of one), the experts it holds and their parameters (reduced by the strategy, not by the data-parallel
    reduction of the rest)."""

    group: object
    replicas: object
    held: range
    params: list


def expert_kernels(kernels, parallel, backend, tp_group=None, kind=None):
    """The `ep` step's build side: every sparse block of the model about to be built dispatches over this rank's
    expert group (its experts' slices over `tp_group` under the `tp` step), chosen before the model exists
    (nothing assigned onto a live layer), with `kind`: `GatherDispatch` (None) or the all-to-all form
    (`expert_all_to_all.AllToAllDispatch`; `distributed.steps.order` chooses by the backend)."""
    from dataclasses import replace

    from pretrain_cli.distributed.layout.topology import Topology

    topo = Topology.of(parallel)
    group, _ = new_groups(topo, backend)
    me = topo.expert_group().index(topo.rank)
    return replace(kernels, moe_dispatch=(kind or GatherDispatch)(group, topo.ep, me, backend, tp_group))


def apply_ep(model, placement):
    """The `ep` step's model side: this rank's experts only (a no-op when the strategy's `place` removed them
    already) and what the data side reduces (`ExpertSide`)."""
    topo = placement.topology
    blocks = sparse_blocks(model)
    group, replicas = new_groups(topo, placement.backend)
    held = held_range(blocks[0].num_experts, topo.ep, topo.expert_rank()) if blocks else range(0)
    keep_held(model, held)
    params = [p for block in blocks for p in block.experts.parameters()]
    placement.experts = ExpertSide(group, replicas, held, params)
    return model


_GROUPS: dict = {}  # Topology -> (expert group, expert-replica group): created once per process


def new_groups(topo, backend) -> tuple:
    """(this rank's expert group, its expert-replica group): every group created on every rank in the same order
    (Paddle's rule for `new_group`), once per topology (the build side and the model side ask, and a rollback
    builds again); None for a group of one."""
    import paddle.distributed as dist

    if topo not in _GROUPS:
        mine = [None, None]
        groups = topo.all_groups()
        with backend.stores():
            for i, kind in enumerate(("ep", "ep_replicas")):
                for ranks in groups[kind]:
                    g = dist.new_group(list(ranks)) if len(ranks) > 1 else None
                    if topo.rank in ranks:
                        mine[i] = g
        _GROUPS[topo] = tuple(mine)
    return _GROUPS[topo]
