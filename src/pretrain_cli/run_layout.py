"""The resolved parallel layout of a run: its degrees, this process's rank, and which engine runs it with what
that engine does (`engine_for`, `ENGINE_TRAITS`). Decided once by `config.resolve` like the rest of the
`RunConfig` (`run_config`), and kept apart from it as the part every layer's layout rules read: distributed/
builds the engine named here, planning/ and training/ ask its traits, never its name.

A base module: it imports nothing of the project, and no Paddle.
"""
from __future__ import annotations

from dataclasses import dataclass, replace


def engine_for(world_size: int, tp_degree: int, sharding_stage: int, pp_degree: int = 1, cp_degree: int = 1,
               sequence_parallel: bool = False, manual_tp: bool = False) -> str:
    """"single", "data_parallel" (paddle.DataParallel), "fleet_zero1" (fleet's ZeRO-1), "semi_auto"
    (dist.shard_layer / shard_optimizer: ZeRO-2/3 and tensor parallelism), "pipeline" (fleet's
    PipelineParallel, with tp / sp / cp inside the stages), "tensor_parallel" (tensor parallelism with sequence
    and/or context parallelism on fleet's groups) or "context_parallel" (distributed.steps.context over
    paddle.DataParallel or fleet's ZeRO-1); `sharding_stage` 0 when nothing is
    sharded; `manual_tp`: tensor parallelism by the `tp` layout step even alone (`ParallelConfig.manual_tp`).
    `config.resolve` asks it before the `ParallelConfig` exists."""
    if world_size == 1:
        return "single"
    if pp_degree > 1:
        return "pipeline"
    if tp_degree > 1 and (sequence_parallel or cp_degree > 1 or manual_tp):
        return "tensor_parallel"
    if cp_degree > 1:
        return "context_parallel"
    if tp_degree > 1 or sharding_stage in (2, 3):
        return "semi_auto"
    return "fleet_zero1" if sharding_stage == 1 else "data_parallel"


@dataclass(frozen=True)
class EngineTraits:
    """What a layout's engine does that the rules outside `distributed/` read: they ask these, never the engine's
    name (`ENGINE_TRAITS`, one row per `engine_for` name)."""

    whole_gradients: bool = True  # whole parameters and gradients on every rank, Paddle's optimizer over them
    dp_buffers: bool = False  # paddle.DataParallel's fused all-reduce buffers: one more gradient-sized copy
    placed_pieces: bool = False  # parameters or optimizer state are placed pieces / freed stages: a rollback rebuilds
    distributed_tensors: bool = False  # semi-auto DistTensors: ZeRO-3 gathers, CPU logits
    eager: str = ""  # why the forward stays eager (to_static off), or "" when it can be captured
    global_batch: bool = False  # every loss term is computed over the global batch (each rank's batch a piece of it)


ENGINE_TRAITS = {
    "single": EngineTraits(),
    "data_parallel": EngineTraits(dp_buffers=True),
    "fleet_zero1": EngineTraits(whole_gradients=False),
    "semi_auto": EngineTraits(whole_gradients=False, placed_pieces=True, distributed_tensors=True, global_batch=True,
                              eager="the semi-auto engine (tensor parallelism, ZeRO-2/3: SOT fails on its distributed "
                                    "tensors at the first forward)"),
    "pipeline": EngineTraits(whole_gradients=False, placed_pieces=True,
                             eager="pipeline parallelism (fleet runs each stage's layers eagerly)"),
    "tensor_parallel": EngineTraits(whole_gradients=False, placed_pieces=True,
                                    eager="tensor parallelism on fleet's groups (its collectives are eager autograd "
                                          "functions)"),
    "context_parallel": EngineTraits(dp_buffers=True),  # (with sharding: stage1/2, fleet's ZeRO: no buffers)
}


@dataclass(frozen=True)
class ParallelConfig:
    """Degrees and this process's rank: world = pp × dp × sharding × tp (PaddleNLP arithmetic; ARCHITECTURE.md
    facts: degrees). Which coordinate a rank has on each axis (its stage, data rank, tp rank) and which ranks
    form each group is `distributed.layout.topology.Topology`'s alone.
    """

    world_size: int = 1
    rank: int = 0
    local_rank: int = 0
    dp_degree: int = 1
    sharding_degree: int = 1
    # the ZeRO stage that shards something: 0 = off (when sharding_degree x cp_degree is 1), 1, 2, 3
    sharding_stage: int = 0
    tp_degree: int = 1
    pp_degree: int = 1
    # tensor parallelism splits the embedding and LM head over the vocabulary (only when tp divides it; else
    # they are whole on every tp rank): `distributed.strategies.semi_auto` places them so, `planning.memory`
    # counts them so
    vocab_parallel: bool = False
    virtual_pp_degree: int = 1  # model chunks per pipeline stage (fleet's interleaved schedule)
    # context parallelism: each sequence split over cp ranks (rank = data_rank × cp + cp_rank;
    # distributed.steps.context)
    cp_degree: int = 1
    # Megatron sequence parallelism with tp > 1: norms and residuals cut on the sequence over the tp group
    sequence_parallel: bool = False
    # expert parallelism: a Mixture-of-Experts model's experts split over groups of ep data ranks
    # (`distributed.layout.topology.Topology.expert_group`, `distributed.steps.expert_parallel`)
    ep_degree: int = 1
    # tensor parallelism by the `tp` layout step (`distributed.steps.tensor_parallel`) even without sequence or
    # context parallelism: routed experts over expert groups, and multi-head latent attention except under ZeRO-3
    # (there the semi-auto engine's placements run it, which shard the parameters; `config.parallel` decides it)
    manual_tp: bool = False

    @property
    def data_world_size(self) -> int:
        """Ranks that read different data: dp × sharding (tensor-parallel ranks and pipeline stages share batches)."""
        return self.dp_degree * self.sharding_degree

    @property
    def is_rank0(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def engine(self) -> str:
        """Which engine runs the layout (`distributed.setup` builds it; `planning.memory` models it)."""
        return engine_for(self.world_size, self.tp_degree, self.sharding_stage, self.pp_degree, self.cp_degree,
                          self.sequence_parallel, self.manual_tp)

    @property
    def traits(self) -> EngineTraits:
        """What the engine does, for the rules outside `distributed/` (which never compare engine names). Expert
        parallelism holds only this rank's experts, on any engine: its parameters are placed pieces (a rollback
        rebuilds: a whole checkpoint cannot be written into them)."""
        traits = ENGINE_TRAITS[self.engine]
        return replace(traits, placed_pieces=True) if self.ep_degree > 1 else traits

    def describe(self) -> str:
        """`check`'s and the start-up's resolved line: "world 8, dp 1, sharding stage1 x4, pp 2, ep 4"."""
        return f"world {self.world_size}, {self.axes()}{self.expert_axis()}"

    def axes(self) -> str:
        """The degrees in `distributed.layout.topology.Topology`'s words ("dp 1, sharding stage1 x4, pp 2": its
        dp and sharding axes, tp for its mp, cp, pp), which the strategies' names (the start-up's `layout:` line)
        say after the engine, so that line and `describe` name a layout alike; expert parallelism, drawn from the
        data ranks, follows as `expert_axis`."""
        parts = [f"dp {self.dp_degree}"]
        if self.sharding_stage:
            parts.append(f"sharding stage{self.sharding_stage} x{self.sharding_degree}")
        if self.tp_degree > 1:
            parts.append(f"tp {self.tp_degree}" + (" + sp" if self.sequence_parallel else ""))
        if self.cp_degree > 1:
            parts.append(f"cp {self.cp_degree}")
        if self.pp_degree > 1:
            parts.append(f"pp {self.pp_degree}" + (f" x{self.virtual_pp_degree} virtual" if self.virtual_pp_degree > 1
                                                   else ""))
        return ", ".join(parts)

    def expert_axis(self) -> str:
        """", ep N" under expert parallelism, else "": what follows the degrees (`axes`) in `describe` and in every
        strategy's name that says them (the base strategy's, context parallelism's, `ExpertHybrid`'s), one wording
        for all of them."""
        return f", ep {self.ep_degree}" if self.ep_degree > 1 else ""

    def fleet_sharding(self) -> str:
        """What fleet's sharding group is under context parallelism (fleet has no cp axis: it spans sharding x cp),
        for the names of fleet's engines; "" otherwise."""
        if not (self.sharding_stage and self.cp_degree > 1):
            return ""
        return f" (fleet's sharding group: sharding x cp, {self.sharding_degree * self.cp_degree} ranks)"
