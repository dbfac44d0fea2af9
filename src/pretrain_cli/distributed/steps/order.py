"""A layout as a sequence of steps: each a function of the model, the `Topology`'s groups and the resolved
`ParallelConfig`, applied from outside in one fixed order (compare torchtitan's `parallelize_llama`: `apply_tp` →
`apply_cp` → activation checkpointing → `apply_fsdp`; Megatron's module-level autograd functions that take their
group). Adding a parallel axis means adding a step here, not an engine.

**The order** (`ORDER`), outermost change last:

1. `tp`: the Megatron split of every decoder layer over the topology's "mp" group (`tensor_parallel.split_layers`:
   q/k/v, gate/up by output columns, o/down by input rows; the two autograd functions `copy_to_tp` /
   `reduce_from_tp` hooked around attention and MLP). With `sequence_parallel` those two are the
   sequence-parallel pair (`sequence_parallel.functions`) and the residual stream is cut between the regions,
   as torchtitan's `apply_tp` puts `SequenceParallel` entries in the same plan.
2. `cp`: context parallelism. Chosen when the model is built (`build_kernels`): its attention kernels are the ring
   over the topology's "cp" group and its RoPE table spans the whole sequence; the batch side (each rank's
   chunks, global positions, the whole sequence's loss) is `context.ContextSide`, which the strategy holds.
3. `ep`: expert parallelism (`expert_parallel`): each rank keeps its experts and dispatches over its expert
   group. The groups are drawn from the data/ZeRO ranks, not an axis of their own: `Topology.expert_group` and
   `Topology.expert_replicas` name the ranks, `expert_parallel.new_groups` creates them. It runs after the
   attention-side steps and before recompute, so recompute wraps the layers with their experts already
   dispatched.
4. `recompute`: activation recompute (`models.recompute.apply_recompute`) around the already split layers.
5. `pp`: the pipeline cut: fleet's `PipelineLayer` over the model's own sublayers
   (`pipeline_stages.build_pipeline_layer`).
6. `data`: the gradient and optimizer side: data parallelism, ZeRO-1/2 (fleet), ZeRO-2/3 and semi-auto TP
   (`semi_auto`): the `Strategy`'s `wrap`, `sync_grads`, `grad_norm` and `step`, not a model change here.

Each step's `build` (optional) changes the kernel table the model is built with (`build_kernels`: nothing is
assigned onto a live layer); its `apply` (optional) takes the finished model and the shared `Placement` and
returns the model. `Placement` is what the steps leave for the strategy: which parameters are tensor-parallel
slices and on which dim (`tp_dims`: the checkpoint's pieces), which gradients cover this rank's part only
(`tp_summed`: its positions, its heads), the pipeline's layer, loss and bounds.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from pretrain_cli.distributed.comms.collectives import Collectives
from pretrain_cli.distributed.layout.topology import Topology
from pretrain_cli.run_layout import ParallelConfig

ORDER = ("tp", "cp", "ep", "recompute", "pp", "data")


@dataclass
class Placement:
    """What the steps of one rank share: the run's layout, its topology and collectives backend, where lazily built
    parameters get their values (`source`, `distributed.layout.materialize`), and what each step leaves behind."""

    parallel: ParallelConfig
    topology: Topology
    backend: Collectives
    source: object = None
    recompute: object = None  # run_config.Recompute or None
    tp_dims: dict = field(default_factory=dict)  # HF name -> the Paddle dim its tensor-parallel slice is cut on
    # parameters whose gradients cover this rank's part only, summed over the tp group once a step: sequence
    # parallelism's norms (its positions), Qwen3's q/k norms (its heads: `tensor_parallel.head_shared`)
    tp_summed: list = field(default_factory=list)
    pipeline: tuple | None = None  # (PipelineLayer, StageLoss, bounds) after the `pp` step
    experts: object = None  # the `ep` step's groups and held experts (`expert_parallel.ExpertSide`)
    sequence: object = None  # context parallelism's batch side (`context.ContextSide`): the pipeline's loss reads it

    def group(self, axis: str):
        """The process group of this rank along `axis` (fleet's hybrid groups are the topology's)."""
        from paddle.distributed import fleet

        hcg = fleet.get_hybrid_communicate_group()
        return {"mp": hcg.get_model_parallel_group, "pp": hcg.get_pipe_parallel_group,
                "dp": hcg.get_data_parallel_group}[axis]()


@dataclass(frozen=True)
class Step:
    """One layout step: `name` (its place in `ORDER`), `wanted(parallel)`, and its effects: `build(kernels,
    parallel, backend) -> kernels` before the model exists, `apply(model, placement) -> model` after."""

    name: str
    wanted: Callable[[ParallelConfig], bool]
    build: Callable | None = None
    apply: Callable | None = None


# ---------------------------------------------------------------------------------------------------- the steps
def _split_tp(model, placement: Placement):
    """`tp` (+ `sequence_parallel`): each decoder layer of this stage cut to this rank's slice over the mp group;
    a lazily built tensor-parallel weight created as its slice only; the whole weights whose gradient is this rank's
    part listed for the strategy to sum (`tp_summed`)."""
    from pretrain_cli.distributed.steps.tensor_parallel import head_shared, split_layers

    p, topo, backend = placement.parallel, placement.topology, placement.backend
    group, regions, summed = placement.group("mp"), None, []
    if p.sequence_parallel:
        from pretrain_cli.distributed.steps import sequence_parallel as sp

        shard = sp.SeqShard(group, p.tp_degree, topo.tp_rank, backend)
        summed = sp.hook_model(model, shard)
        regions = sp.regions(shard)
    dims = split_layers(model.model.layers, p.tp_degree, topo.tp_rank, group, placement.source, regions)
    placement.tp_summed = summed + head_shared(model.model.layers)
    placement.tp_dims = {name: dims[id(w)] for name, w in model.named_parameters() if id(w) in dims}  # HF names
    return model


def _tp_kernels(kernels, parallel: ParallelConfig, backend: Collectives):
    """`tp`'s build side: a MoE model's sparse blocks run their experts' slices between Megatron's two functions
    over the mp group (`tensor_parallel.TPDispatch`; the split itself is `_split_tp`, on the finished model), and the
    row-parallel projections stay Linears (their output hooks sum the slices' products)."""
    from dataclasses import replace

    from paddle.distributed import fleet

    from pretrain_cli.distributed.steps.tensor_parallel import TPDispatch

    group = fleet.get_hybrid_communicate_group().get_model_parallel_group()
    # the row-parallel projections' outputs (o_proj, down_proj) are summed over the group (a hook on the Linear)
    # before the residual add: the fused `linear_residual` and `linear_add_rms_norm` would add the residual on
    # every rank and skip the sum
    return replace(kernels, moe_dispatch=TPDispatch(group), linear_residual=None, linear_add_rms_norm=None)


def _context_kernels(kernels, parallel: ParallelConfig, backend: Collectives):
    from pretrain_cli.distributed.steps.context import context_kernels

    return context_kernels(kernels, parallel, backend)


def _expert_kernels(kernels, parallel: ParallelConfig, backend: Collectives):
    """`ep`'s build side: every sparse block dispatches over this rank's expert group (under the `tp` step, whose
    dispatch it replaces, its experts' slices between the two functions over the mp group): by all-to-all where
    the backend has one (NCCL: `expert_all_to_all`), else by all-gather (`expert_parallel.GatherDispatch`).
    Declared here (as the model side), so the step is there whatever was imported first."""
    from pretrain_cli.distributed.steps.expert_parallel import expert_kernels

    kind = tp_group = None
    if backend.all_to_all_dispatch:  # pragma: no cover - GPU only
        from pretrain_cli.distributed.steps.expert_all_to_all import AllToAllDispatch

        kind = AllToAllDispatch
    if manual_tp(parallel):
        from paddle.distributed import fleet

        tp_group = fleet.get_hybrid_communicate_group().get_model_parallel_group()
    return expert_kernels(kernels, parallel, backend, tp_group, kind)


def _expert_parallel(model, placement: Placement):
    """`ep`'s model side: this rank's experts kept, the others removed."""
    from pretrain_cli.distributed.steps.expert_parallel import apply_ep

    return apply_ep(model, placement)


def _recompute(model, placement: Placement):
    from pretrain_cli.models.recompute import apply_recompute

    return apply_recompute(model, placement.recompute)


def _cut_pipeline(model, placement: Placement):
    """`pp`: fleet's PipelineLayer over the model's sublayers; the strategy frees what this stage does not hold."""
    from pretrain_cli.distributed.steps.pipeline_stages import build_pipeline_layer

    placement.pipeline = build_pipeline_layer(model, placement.parallel, placement.backend, placement.sequence)
    return placement.pipeline[0]


def _local_kernels(kernels, parallel: ParallelConfig, backend: Collectives):
    """The semi-auto `data` step's build side: activations are distributed tensors, so every custom kernel runs
    on this rank's local piece (`local_kernels.localize`), and a MoE block's dispatch on this rank's tokens and
    weight blocks (`moe_layouts.LocalDispatch`)."""
    from dataclasses import replace

    from pretrain_cli.distributed.steps.local_kernels import localize
    from pretrain_cli.distributed.steps.moe_layouts import LocalDispatch, tp_group

    kernels = localize(kernels, hook=backend.gradient_hook is not None)
    group = tp_group(Topology.of(parallel), backend)
    return replace(kernels, moe_dispatch=LocalDispatch(group, backend.gradient_hook))


def manual_tp(parallel: ParallelConfig) -> bool:
    """Whether tensor parallelism is this module's `tp` step (inside a pipeline, with sequence or context
    parallelism: `Hybrid`'s engines), rather than the semi-auto engine's placements (with ZeRO-2/3 or alone)."""
    return parallel.tp_degree > 1 and parallel.engine in ("pipeline", "tensor_parallel")


def semi_auto(parallel: ParallelConfig) -> bool:
    """Whether the `data` step is Paddle's semi-auto engine (ZeRO-2/3, or tensor parallelism on its own)."""
    return parallel.engine == "semi_auto"


STEPS: dict = {
    "tp": Step("tp", manual_tp, build=_tp_kernels, apply=_split_tp),
    "cp": Step("cp", lambda p: p.cp_degree > 1, build=_context_kernels),
    "ep": Step("ep", lambda p: p.ep_degree > 1, build=_expert_kernels, apply=_expert_parallel),
    "recompute": Step("recompute", lambda p: True, apply=_recompute),
    "pp": Step("pp", lambda p: p.pp_degree > 1, apply=_cut_pipeline),
    "data": Step("data", semi_auto, build=_local_kernels),
}


def register(step: Step) -> None:
    """Add or replace the step for an axis (its `name` one of `ORDER`)."""
    if step.name not in ORDER:
        raise ValueError(f"step {step.name!r} has no place in {ORDER}")
    STEPS[step.name] = step


def steps_for(parallel: ParallelConfig) -> list[Step]:
    """The steps `parallel` wants, in `ORDER`."""
    return [STEPS[n] for n in ORDER if n in STEPS and STEPS[n].wanted(parallel)]


def build_kernels(kernels, parallel: ParallelConfig, backend: Collectives):
    """The kernel table the model is built with, every layout entry chosen here (before the model exists, so
    nothing of a live layer is replaced): on more than one process a MoE block's expert counts summed over every
    rank (`comm.sum_over_ranks`: the balancing bias's counts, the same update on every replica, and with
    `moe_aux_loss_scope: global` the balance loss's expert shares; resolve allows that scope only when every rank
    is a data rank, and the bias's sign of mean − count is unchanged when tp ranks count the same tokens); with a
    pipeline over the stage's data ranks only (`comm.sum_over_stage_data_ranks`: each stage holds other layers, so
    each updates its biases from its own layers' counts, as one process updates each layer's from that layer's).
    Then each wanted step's `build`, in order. A dense model never reads the counts."""
    if parallel.world_size > 1:
        from dataclasses import replace

        from pretrain_cli.distributed.comms.comm import sum_over_ranks, sum_over_stage_data_ranks

        reduce = sum_over_stage_data_ranks if parallel.pp_degree > 1 else sum_over_ranks
        kernels = replace(kernels, reduce_counts=reduce)
    for step in steps_for(parallel):
        if step.build is not None:
            kernels = step.build(kernels, parallel, backend)
    return kernels


def apply_steps(model, placement: Placement):
    """The finished model through every wanted step's `apply` in `ORDER`."""
    for step in steps_for(placement.parallel):
        if step.apply is not None:
            model = step.apply(model, placement)
    return model

