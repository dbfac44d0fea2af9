"""The data side of expert parallelism (`distributed.steps.expert_parallel`'s docstring: which ranks hold which
experts, the dispatch, the gradients), apart from the `ep` step so that `distributed.steps.order` declares that step
without importing a strategy. Two strategies, both holding the `ep` step's `ExpertSide` (the experts' groups and
parameters) and reducing the experts themselves; they differ in the rest of the model:

- `ExpertParallel` (no sharding): the non-expert gradients averaged over the data ranks by one bucketed all-reduce
  after the step's last backward (fleet's `fused_allreduce_gradients_with_group`); every rank updates everything
  it holds. Not `paddle.DataParallel`, which reduces every parameter of the model unless each expert parameter
  carries a `no_sync` attribute: the strategy keeps the list instead.
- `ExpertZero1` (`sharding: stage1`, the layout PaddleNLP's Qwen3-MoE recipes use; under context parallelism
  `stage2` too, fleet's ZeRO-1 releasing the rest's unowned gradients after each update, as cp's data side does):
  the non-expert parameters through fleet's ZeRO-1 as `FleetZero1` runs them (each sharding rank owns, updates and keeps
  the AdamW state of a slice; gradients reduced to the owner, the owners' updates broadcast). The experts are not given
  to fleet's sharding optimizer, whose owners and broadcasts take every sharding rank to hold the same parameters: each
  rank updates its own experts itself (their gradients summed over `Topology.expert_replicas`), and keeps their
  AdamW state whole. Not sharded over the replicas: the experts are already split ep ways (the bulk of a MoE
  model's state), and sharding their state further would add a reduce and a broadcast over the replica group,
  which spans nodes when the expert group fills one.

On fleet's hybrid groups (`ExpertHybrid`, the same data side over `Hybrid`'s engines): `ExpertPipeline` inside
pipeline stages (with or without tp in them) and `ExpertTensor` with tensor parallelism on one stage (under tp each
held expert also a tp slice), the rest averaged over the stage's data ranks or, under `sharding: stage1/2`, through
fleet's ZeRO-1/2 over the stage's sharding group with the experts kept out of it as `ExpertZero1` keeps them
(`ExpertGrads.leave_out` / `rejoin` / `update`). ZeRO-2 there is fleet's ZeRO-1 releasing the rest's gradients a
rank does not own after each update (`FleetHybrid.step`, over `Hybrid.trained`: the rest only); a rank's experts'
gradients are all its own to update, so they stay.
"""
from __future__ import annotations

import contextlib

from pretrain_cli.distributed.steps.expert_parallel import ExpertSide, expert_of, held_range, keep_held, sparse_blocks
from pretrain_cli.distributed.strategies.pipeline import Pipeline
from pretrain_cli.distributed.strategies.strategy import FleetZero1, Strategy
from pretrain_cli.distributed.strategies.tensor_engine import TensorParallel


class ExpertGrads:
    """The experts' side of a step, whatever reduces the rest: their gradients summed over their holders and
    averaged over the data ranks, their share of the global norm, where their pieces live."""

    def __init__(self, side: ExpertSide, data_ranks: int, step_kernels):
        self.side, self.data_ranks, self.step_kernels = side, data_ranks, step_kernels
        self.ids = {id(p) for p in side.params}
        self._inner = None  # the AdamW under fleet's sharding optimizer (`rejoin`), which `update` steps them with

    def reduce(self) -> None:
        """Summed over the ranks holding the same experts (at every cp position), divided by the data ranks (× cp:
        `_averaged_over`; the dispatch's backward already summed the expert group's tokens into them)."""
        import paddle
        import paddle.distributed as dist

        with paddle.no_grad():
            for p in self.side.params:
                if p.grad is None:  # (every held expert is in the graph: `Experts.idle`; never skip a collective)
                    p.grad = paddle.zeros_like(p)
                if self.side.replicas is not None:
                    dist.all_reduce(p.grad, group=self.side.replicas)
                p.grad.scale_(1.0 / self.data_ranks)

    def leave_out(self, optimizer) -> list:
        """This rank's experts taken out of `optimizer`'s list before fleet's sharding optimizer is built over it
        (its owners and broadcasts take every sharding rank to hold the same parameters, and it keys them by
        Paddle's names, which an expert another rank holds shares); returned, for `rejoin`."""
        held = [p for p in optimizer._parameter_list if id(p) in self.ids]
        optimizer._parameter_list = optimizer._param_groups = [p for p in optimizer._parameter_list
                                                               if id(p) not in self.ids]
        return held

    def rejoin(self, hpo, held: list) -> None:
        """`held` (`leave_out`) back in the lists of fleet's optimizer `hpo` that are not its owners': the list
        fleet clears gradients of, and the AdamW's own (its accumulators for them are created, checkpointed and
        loaded like any, `training.checkpoint`); `update` steps them."""
        from pretrain_cli.distributed.layout.pieces import inner_optimizer

        dso = hpo._inner_opt
        dso._parameter_list = list(dso._origin_parameter_list) + held  # (`_origin_parameter_list` stays the rest)
        self._inner = inner_optimizer(hpo)
        self._inner._parameter_list = self._inner._param_groups = list(self._inner._parameter_list) + held

    def update(self) -> None:
        """This rank's experts stepped by the AdamW under fleet's sharding optimizer (after fleet's own step)."""
        import paddle

        with paddle.no_grad():
            self._inner._apply_optimize(loss=None, startup_program=None,
                                        params_grads=[(p, p.grad) for p in self.side.params])

    def sq_norm(self):
        """The experts' squared gradient norm, summed over the expert group (each rank holds different ones)."""
        import paddle
        import paddle.distributed as dist

        grads = [p.grad for p in self.side.params if p.grad is not None]
        sq = self.step_kernels.global_sq_norm(grads) if grads else paddle.zeros([], dtype="float32")
        sq = sq.astype("float32")
        if self.side.group is not None:
            dist.all_reduce(sq, group=self.side.group)
        return sq


class ExpertParallel(Strategy):
    """Data parallelism with the experts split over expert groups (module docstring)."""

    name = "expert parallel (experts over the data ranks, the rest averaged over them)"

    experts: ExpertGrads | None = None  # set by `place`
    _dense: tuple = ()  # the non-expert parameters with gradients, set by `wrap`

    def place(self, model, source=None):
        """Only this rank's experts are created: the others are removed first (`keep_held`), then the rest is
        created and the layout steps run (the `ep` step leaves the groups and this rank's experts)."""
        from pretrain_cli.distributed.layout.materialize import fill

        blocks = sparse_blocks(model)
        if blocks:
            keep_held(model, held_range(blocks[0].num_experts, self.topology.ep, self.topology.expert_rank()))
        if source is not None:
            fill(model, source)
        model = self.apply_steps(model, source)
        self.experts = ExpertGrads(self.placement.experts, _averaged_over(self.parallel), self.step_kernels)
        return model

    def dense(self, params) -> list:
        """The parameters of `params` that are not this rank's experts."""
        return [p for p in params if id(p) not in self.experts.ids]

    def wrap(self, model, optimizer):
        self._dense = tuple(p for p in self.dense(model.parameters()) if not p.stop_gradient)
        return self.model_inputs(model), optimizer

    def sync_grads(self) -> None:
        """The rest averaged over every data rank (one bucketed all-reduce per dtype), the experts over theirs."""
        from paddle.distributed.fleet.utils.hybrid_parallel_util import fused_allreduce_gradients_with_group

        fused_allreduce_gradients_with_group(list(self._dense), None)  # (None: every rank is a data rank)
        self.experts.reduce()

    def grad_norm(self, model):
        """The global norm: the replicated parameters' squares once, the experts' summed over the expert group."""
        import paddle

        dense = [p.grad for p in self.dense(self.grad_params(model)) if p.grad is not None]
        return paddle.sqrt(self.step_kernels.global_sq_norm(dense).astype("float32") + self.experts.sq_norm())

    def local_box(self, tensor, name: str | None = None):
        return expert_box(self, super().local_box(tensor, name), name)


def _averaged_over(parallel) -> int:
    """The ranks the experts' summed gradients are averaged over, as the rest's: the data ranks, and under context
    parallelism their cp ranks too (each rank's loss is its chunks' share × C: `distributed.steps.context`)."""
    return parallel.data_world_size * parallel.cp_degree


def expert_box(strategy, box_holders: tuple, name: str | None) -> tuple:
    """An expert's weights and optimizer state are on the ranks holding that expert (`expert_replicas`): its tp
    slice (the box the strategy's base cut) on those at this tp position, a whole tensor (AdamW's beta powers, or
    any without tp) on those at every tp position; every other tensor is where the base puts it (`box_holders`)."""
    box, holders = box_holders
    if name is None or expert_of(name) is None:
        return box, holders
    topo = strategy.topology
    if not box.whole or strategy.parallel.tp_degree == 1:
        return box, topo.expert_replicas()
    return box, tuple(sorted(r for t in topo.group("mp") for r in topo.expert_replicas(t)))


class ExpertZero1(FleetZero1):
    """Expert parallelism with the rest of the model under fleet's ZeRO-1 (module docstring)."""

    name = "expert parallel + ZeRO-1 (experts over the data ranks, the rest fleet's DygraphShardingOptimizer)"

    experts: ExpertGrads | None = None  # set by `place`

    place = ExpertParallel.place
    dense = ExpertParallel.dense

    def wrap(self, model, optimizer):
        """fleet's sharding optimizer over the non-expert parameters only; the experts join the AdamW's own list
        afterwards (its accumulators for them are created and checkpointed like any, `training.checkpoint`) and
        the list fleet clears gradients of. Not `fleet.distributed_model`: its start-up broadcast of every
        parameter from the first sharding rank would overwrite this rank's experts with another's (the other
        parameters are equal on every rank already: each rank creates them from the same seed or checkpoint)."""
        held = self.experts.leave_out(optimizer)
        self.shard_optimizer(optimizer)
        self.experts.rejoin(self._hpo, held)
        return self.model_inputs(model), self._hpo

    def no_sync(self, model, last_micro_batch: bool):
        return contextlib.nullcontext()  # (gradients are reduced once, in `sync_grads`)

    def sync_grads(self) -> None:
        super().sync_grads()  # the rest: reduced to each owner (+ the dp all-reduce)
        self.experts.reduce()

    def grad_params(self, model) -> list:
        """The owned slice of the rest and this rank's experts (what `clip` scales)."""
        return list(self._owned) + list(self.experts.side.params)

    def grad_norm(self, model):
        import paddle

        sq = self.step_kernels.global_sq_norm([p.grad for p in self._owned if p.grad is not None])
        return paddle.sqrt(self.global_norm_sq(sq.astype("float32")) + self.experts.sq_norm())

    def step(self, optimizer) -> None:
        """fleet's update of the owned slice and its broadcast, then this rank's experts by the same AdamW."""
        super().step(optimizer)
        self.experts.update()

    def local_box(self, tensor, name: str | None = None):
        return expert_box(self, super().local_box(tensor, name), name)


class ExpertHybrid:
    """Expert parallelism on fleet's hybrid groups (`Hybrid`'s engines: a pipeline, with or without tp in its
    stages, `ExpertPipeline`; tensor parallelism on one stage, `ExpertTensor`): each stage's expert groups are drawn
    from its own data ranks at one tp position (`Topology.expert_group` keeps the stage and tp coordinates), its
    sparse layers dispatch over them (every rank of a group runs the same schedule, so the same collectives in the
    same order), and the rest is reduced as `Hybrid` reduces it: averaged over the stage's data ranks, or under
    `sharding: stage1/2` through fleet's ZeRO-1/2 over the stage's sharding group, which is given the rest only
    (`trained`) and the experts after it as `ExpertZero1` does (PaddleNLP's DeepSeek-V3 layout: pp × ZeRO-1 × ep;
    ZeRO-2 releases only the rest's unowned gradients). Under tensor parallelism each held expert is a tp slice too
    (the `tp` step cuts it like an MLP), so its share of the norm is summed over the tp group as well."""

    experts: ExpertGrads | None = None  # set by `place`

    def __init__(self, parallel, device: str = "cpu", step_kernels=None, recompute=None):
        super().__init__(parallel, device, step_kernels, recompute)
        self.name += parallel.expert_axis()  # (after its engine's degrees, which say no ep)

    dense = ExpertParallel.dense

    def place(self, model, source=None):
        """This rank's experts only (the others removed before anything is created), then the stage's
        parameters and the steps (`Hybrid.place`; the tp step creates the held experts as slices); the experts
        the strategy reduces are this stage's."""
        blocks = sparse_blocks(model)
        if blocks:
            keep_held(model, held_range(blocks[0].num_experts, self.topology.ep, self.topology.expert_rank()))
        layer = super().place(model, source)
        stage = {id(p) for p in layer.parameters()}
        side = self.placement.experts
        side = ExpertSide(side.group, side.replicas, side.held, [p for p in side.params if id(p) in stage])
        self.experts = ExpertGrads(side, _averaged_over(self.parallel), self.step_kernels)
        return layer

    def trained(self, model) -> list:
        """The rest: what `Hybrid` reduces, shards and counts in its norm (the experts are the strategy's own)."""
        return self.dense(super().trained(model))

    def shard(self, model, optimizer):
        """`Hybrid.shard` over the rest; under ZeRO-1/2 the experts are out of the optimizer's list while fleet's
        sharding optimizer is built, then back in the lists it clears and the AdamW steps (`ExpertGrads.rejoin`)."""
        held = self.experts.leave_out(optimizer) if self.parallel.sharding_stage else []
        optimizer = super().shard(model, optimizer)
        if self._hpo is not None:
            self.experts.rejoin(self._hpo, held)
        return optimizer

    def sync_grads(self) -> None:
        super().sync_grads()
        self.experts.reduce()

    def grad_params(self, model) -> list:
        return list(self._owned) + list(self.experts.side.params)

    def grad_norm(self, model):
        """`Hybrid.grad_norm`'s stage sum with this stage's experts added before the sum over the stages: the rest's
        squares (tp slices summed over the tp group; ZeRO-1's owned parts over the sharding group), the experts'
        summed over their group (and over the tp group when they are tp slices), never over the sharding group,
        whose ranks hold other experts or the same ones."""
        import paddle
        import paddle.distributed as dist

        whole, sliced = ([p.grad for p in ps if p.grad is not None] for ps in self._counted)
        sq = self.step_kernels.global_sq_norm(whole).astype("float32")
        experts = self.experts.sq_norm()  # [] fp32, over the expert group
        if self.parallel.tp_degree > 1:  # the tp slices' squares, the experts' and the rest's, over the tp group
            part = self.step_kernels.global_sq_norm(sliced).astype("float32") if sliced else paddle.zeros_like(sq)
            both = paddle.stack([part, experts])  # [2]: one all-reduce
            dist.all_reduce(both, op=dist.ReduceOp.SUM, group=self.hcg.get_model_parallel_group())
            sq, experts = sq + both[0], both[1]
        if self._hpo is not None:  # the owners' parts of the rest
            dist.all_reduce(sq, op=dist.ReduceOp.SUM, group=self.hcg.get_sharding_parallel_group())
        sq = sq + experts
        dist.all_reduce(sq, op=dist.ReduceOp.SUM, group=self.pp_group)
        return paddle.sqrt(sq)

    def step(self, optimizer) -> None:
        """`Hybrid`'s step (fleet's update of the owned slice and its broadcast, ZeRO-2 then releasing the rest's
        unowned gradients; or the AdamW over everything); under ZeRO-1/2 then this rank's experts by the same
        AdamW."""
        super().step(optimizer)
        if self._hpo is not None:
            self.experts.update()

    def local_bytes(self, model, optimizer) -> dict:
        """`Hybrid.local_bytes` (whose gradients are the rest's, `trained`) with this rank's experts' gradients,
        which every rank keeps whole between steps under any sharding stage (each updates its own experts)."""
        out = super().local_bytes(model, optimizer)
        out["gradients"] += sum(int(p.grad.numel()) * p.grad.element_size() for p in self.experts.side.params
                                if p.grad is not None and p.grad._is_initialized())
        return out

    def local_box(self, tensor, name: str | None = None):
        return expert_box(self, super().local_box(tensor, name), name)


class ExpertPipeline(ExpertHybrid, Pipeline):
    """Expert parallelism inside pipeline stages (`ExpertHybrid`), with tp in the stages too: each held expert then
    a tp slice (the `tp` step runs inside each stage as for a dense model), its groups at one stage and tp position."""

    def wrap(self, model, optimizer):
        """fleet's pipeline engine; its start-up broadcast of every parameter from the stage's first data rank
        would overwrite this rank's experts with another's, so they are put back after it."""
        import paddle

        with paddle.no_grad():
            kept = [(p, p.clone()) for p in self.experts.side.params]
            out = super().wrap(model, optimizer)
            for p, value in kept:
                p.set_value(value)
        return out


class ExpertTensor(ExpertHybrid, TensorParallel):
    """Expert parallelism with tensor parallelism on one stage (`ExpertHybrid`): attention, the shared experts and
    each held expert cut by the `tp` step, the experts spread over the data ranks of each tp position. Nothing is
    broadcast at start-up (`TensorParallel.wrap` builds no fleet engine), so each rank's experts stay its own."""
