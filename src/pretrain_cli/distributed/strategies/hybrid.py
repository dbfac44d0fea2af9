"""The strategy over fleet's hybrid groups with the model-side layout steps applied from outside (`Hybrid`): what a
pipeline (`distributed.strategies.pipeline.Pipeline`, which adds the 1F1B schedule) and tensor + sequence/context
parallelism on one stage (`distributed.strategies.tensor_engine.TensorParallel`) share.

`place` creates this rank's parameters (its stage's; tensor-parallel weights as their slices only) and runs the
layout steps (`distributed.steps.order`: tp, cp, recompute, the pipeline cut); what they leave (`Placement`) says which
parameters are tensor-parallel slices and on which dim (`tp_dims`, read by `local_box` for the checkpoint's pieces)
and which gradients cover this rank's part only (sequence parallelism's norms: its positions; Qwen3's q/k norms:
its heads). The gradient side: those summed over the tp group, then fleet's ZeRO-1/2 over each stage's sharding
group (ZeRO-2 releasing the gradients it does not own after each update), or the mean over the stage's data and cp
ranks; the norm summed over tp slices, owners and stages, a tied embedding's second copy counted once.
"""
from __future__ import annotations

import re

from pretrain_cli.distributed.layout.pieces import split_name
from pretrain_cli.distributed.strategies.strategy import FleetHybrid
from pretrain_cli.models.stages import last_stage_embeds, stage_bounds
from pretrain_cli.run_layout import ParallelConfig


def stage_of(name: str, bounds: list[int], stages: int | None = None) -> int:
    """The stage that holds (the first copy of) an HF-named tensor, by its global layer index. `bounds` has one
    part per model chunk; with virtual stages (`stages` < parts) chunk c runs on stage c mod `stages`, as in
    fleet's interleaved schedule (stage 0 holds chunks 0, P, 2P, ...)."""
    parts = len(bounds) - 1
    m = re.match(r"model\.layers\.(\d+)\.", name)
    if m:
        i = int(m.group(1))
        chunk = max(s for s in range(parts) if bounds[s] <= i)
    else:
        chunk = 0 if name.startswith("model.embed_tokens.") else parts - 1  # model.norm, lm_head: the last
    return chunk % (stages or parts)


class Hybrid(FleetHybrid):
    """Tensor (+ sequence, + context) parallelism and pipeline stages over fleet's hybrid groups (the topology's),
    data parallelism and ZeRO-1/2 on its "dp" / "sharding" axes; subclasses name the layout and run the step."""

    def __init__(self, parallel: ParallelConfig, device: str = "cpu", step_kernels=None, recompute=None):
        super().__init__(parallel, device, step_kernels, recompute)
        self.lm = self.loss = self.bounds = None
        self.tp_dims: dict = {}  # HF name -> the Paddle dim its tensor-parallel slice is cut on
        self._tp_summed: list = []  # the parameters whose gradients cover this rank's part only (`Placement.tp_summed`)

    # ------------------------------------------------------------------ building
    def place(self, model, source=None):
        """The stages over `model`'s own sublayers (each decoder layer cut to this rank's tp slice); the optimizer
        is then built over this stage's parameters. A lazily built model gets only this stage's parameters created
        (from `source`; the embedding also on the last stage when a tied head or multi-token prediction reads it
        there, `models.stages.last_stage_embeds`, its copy broadcast by fleet from the first), the others' never
        have storage (an eagerly built one has theirs freed); under tp the tensor-parallel weights are created as
        this rank's slices only (the `tp` step: `tensor_parallel.split_layers`), never whole. Then
        the layout steps in their order (`distributed.steps.order`: tp, cp, recompute, the pipeline cut)."""
        from pretrain_cli.distributed.layout.materialize import fill
        from pretrain_cli.distributed.steps.tensor_parallel import cut_by_tp

        self.lm = model
        tp = self.parallel.tp_degree > 1
        if source is not None:
            pp, stage = self.parallel.pp_degree, self.topology.stage
            bounds = stage_bounds(len(model.model.layers), pp * self.parallel.virtual_pp_degree)  # one part per chunk
            copy = last_stage_embeds(model.config) and stage == pp - 1  # the embedding's copy (tied head, MTP)
            fill(model, source, lambda name: (stage_of(name, bounds, pp) == stage and not (tp and cut_by_tp(name)))
                 or (copy and name == "model.embed_tokens.weight"))
        layer = self.apply_steps(model, source)
        self.tp_dims, self._tp_summed = self.placement.tp_dims, self.placement.tp_summed
        if self.placement.pipeline is None:  # one stage (`TensorParallel`): the model runs whole
            self.bounds = stage_bounds(len(model.model.layers), 1)  # `pieces` keeps everything
            return layer
        layer, self.loss, self.bounds = self.placement.pipeline
        held = {id(p) for p in layer.parameters()}
        for p in model.parameters():  # names and shapes stay (checkpoint pieces are by name)
            if id(p) not in held and p._is_initialized():
                p._clear_data()
        return layer

    def trained(self, model) -> list:
        """The parameters whose gradients `sync_grads` reduces and fleet's ZeRO-1 shards: the optimizer's
        (`training.optim`; DeepSeek's balancing bias, no gradient and its own update, is no sharding owner's, which
        fleet's optimizer would look up). Expert parallelism leaves its experts out (`ExpertHybrid`)."""
        return [p for p in model.parameters() if not p.stop_gradient]

    def shard(self, model, optimizer):
        """fleet's ZeRO-1 (also ZeRO-2's) over each stage's sharding group, and which gradients this rank counts
        in the norm (its owned ones; the embedding's last-stage copy not; tp slices apart from whole tensors)."""
        from paddle.distributed import fleet

        self.hcg = fleet.get_hybrid_communicate_group()
        self.pp_group = self.hcg.get_pipe_parallel_group()
        self._params = self.trained(model)
        self._owned, self._hpo = self._params, None
        if self.parallel.sharding_stage:
            optimizer = self._hpo = fleet.distributed_optimizer(optimizer)
            self._owned = self._hpo._inner_opt.filter_parameters(self._params, self.hcg)
        copy = last_stage_embeds(self.lm.config) and self.topology.stage > 0  # the embedding's second copy
        counted = [p for p in self._owned if not (copy and p is self.lm.model.embed_tokens.weight)]
        sliced = {id(p) for p in self.lm.parameters() if getattr(p, "is_distributed", False)}
        self._counted = ([p for p in counted if id(p) not in sliced], [p for p in counted if id(p) in sliced])
        return optimizer

    # ------------------------------------------------------------------ a step
    def sync_grads(self) -> None:
        """The gradients that cover this rank's part only (sequence parallelism's norms, Qwen3's q/k norms) summed
        over the tp group first. Then ZeRO-1/2: fleet's optimizer (`FleetHybrid`: each gradient reduced to its owner);
        else the mean over this stage's replicas."""
        if self._tp_summed:  # a stage's own (another stage's norms have no gradient here)
            from pretrain_cli.distributed.steps.tensor_parallel import sum_grads

            sum_grads(self._tp_summed, self.hcg.get_model_parallel_group())
        if self._hpo is not None:
            return super().sync_grads()
        from paddle.distributed.fleet.utils.hybrid_parallel_util import fused_allreduce_gradients_with_group

        # the mean over this stage's replicas: its data ranks, then its cp ranks (fleet's sharding axis is the
        # topology's sharding x cp, `Topology.fleet_hybrid_configs`: with no ZeRO it is the cp group)
        for group in (self.hcg.get_data_parallel_group(), self.hcg.get_sharding_parallel_group()):
            if group.nranks > 1:
                fused_allreduce_gradients_with_group(self._params, group, scale=1.0 / group.nranks)

    def grad_params(self, model) -> list:
        return self._owned

    def grad_norm(self, model):
        """Each stage's squared norm (ZeRO-1: each owner's part), summed over the pipeline; a tied weight's second
        copy is counted once, a tensor-parallel slice's part summed over its tp group, whole tensors once."""
        import paddle
        import paddle.distributed as dist

        whole, sliced = ([p.grad for p in ps if p.grad is not None] for ps in self._counted)
        sq = self.step_kernels.global_sq_norm(whole)
        if self.parallel.tp_degree > 1:
            part = self.step_kernels.global_sq_norm(sliced) if sliced else paddle.zeros_like(sq)
            dist.all_reduce(part, op=dist.ReduceOp.SUM, group=self.hcg.get_model_parallel_group())
            sq = sq + part
        if self._hpo is not None:
            dist.all_reduce(sq, op=dist.ReduceOp.SUM, group=self.hcg.get_sharding_parallel_group())
        dist.all_reduce(sq, op=dist.ReduceOp.SUM, group=self.pp_group)
        return paddle.sqrt(sq)

    def local_bytes(self, model, optimizer) -> dict:
        """Also the gradients held between steps (reported after the first update): every parameter's under
        ZeRO-1 (zeroed in place), only the owned ones' under ZeRO-2."""
        out = super().local_bytes(model, optimizer)
        out["gradients"] = sum(int(p.grad.numel()) * p.grad.element_size() for p in self._params
                               if p.grad is not None and p.grad._is_initialized())
        return out

    # ------------------------------------------------------------------ checkpoints
    def pieces(self, model, optimizer=None) -> list:
        """Only this stage's tensors (the whole model object exists on every rank, but only the stage's layers
        train here): each stage writes its own layers' weights and state, by HF name (`stage_of`). A tied
        embedding's copy on the last stage is the first stage's tensor: written once, from there."""
        stage, pp = self.topology.stage, self.parallel.pp_degree
        held = super().pieces(model, optimizer)
        return [p for p in held if stage_of(split_name(p.name)[0], self.bounds, pp) == stage]

    def holders(self, tensor, kind: str, sliced: bool = False) -> tuple:
        """The ranks of this stage (its data-parallel and tensor-parallel replicas); a tensor-parallel slice only
        on the ranks with this tp coordinate; under ZeRO-1/2 the optimizer state only on the replicas of its owner
        (the same place on fleet's sharding axis: the topology's sharding x cp)."""
        owned = kind == "optimizer" and self.parallel.sharding_stage
        return self.topology.replicas("pp", *(("sharding", "cp") if owned else ()), *(("mp",) if sliced else ()))

    def local_box(self, tensor, name: str | None = None):
        """A tensor-parallel slice (the weight or its moments and master copy, by HF name): its block of the
        global tensor, cut on `tp_dims[name]` at this rank's tp coordinate; anything else whole."""
        hf, slot = split_name(name or "")
        dim = self.tp_dims.get(hf)
        if dim is None or slot not in (None, "moment1", "moment2", "master"):
            return super().local_box(tensor, name)
        from pretrain_cli.distributed.layout.pieces import Box

        shape = tuple(tensor.shape)
        whole, offsets = list(shape), [0] * len(shape)
        whole[dim], offsets[dim] = shape[dim] * self.parallel.tp_degree, shape[dim] * self.topology.tp_rank
        kind = "weights" if not slot else "optimizer"
        return Box(tuple(whole), tuple(offsets), shape), self.holders(tensor, kind, sliced=True)
