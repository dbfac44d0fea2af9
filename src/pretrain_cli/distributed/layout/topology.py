"""The layout of ranks over the parallel axes: the one place that turns degrees into ranks.

Built once from the resolved `ParallelConfig` (`Topology.of`, cached per config) and asked by everything that
needs a rank: the data slice a rank reads (`data_rank`), the optimizer wrapping and the checkpoint's holders
(`replicas`), pipeline stages and tensor-parallel groups (`coord`, `group`), fleet's hybrid configuration
(`init_fleet`, the only `fleet.init`) and the semi-auto engine's mesh (`mesh`). Compare torchtitan's
`ParallelDims` and Megatron's `parallel_state`.

Axis order, outermost first: `AXES` = pp, dp, sharding, cp, mp. A rank is the mixed-radix number of its
coordinates, the last axis fastest (`coordinates`/`rank_of`):

    rank = (((pp_rank × dp + dp_rank) × sharding + sharding_rank) × cp + cp_rank) × tp + tp_rank

So the tp ranks of one stage and one batch are neighbours (on one node when tp divides the GPUs per node:
tensor parallelism's two all-reduces per layer stay on the fast link), the data ranks of one stage come
next, and the pipeline stages are outermost: across nodes only one activation per micro-batch travels
between stages, and the data-parallel gradient all-reduce crosses nodes only when dp × sharding × tp is
larger than a node. The data rank (which slice of the global batch a rank reads) is dp_rank × sharding +
sharding_rank (PaddleNLP's arithmetic, ARCHITECTURE.md facts: degrees); tp ranks, cp ranks (context
parallelism: each holds part of every sequence of its data rank, `distributed.steps.context`) and stages share batches.
fleet has no cp axis of its own here: under ZeRO-1 its sharding axis spans sharding × cp (adjacent in `AXES`).

Expert parallelism (`ep`, `distributed.steps.expert_parallel`) is not an axis of its own: it is drawn from the data
ranks (PaddleNLP's `moe_group: data`). Consecutive data ranks form an expert group (`expert_group`: data rank // ep, on
one node when ep data ranks fit in it), each holding num_experts / ep of the experts (`expert_rank`: data rank % ep);
the ranks holding the same experts (`expert_replicas`: one per expert group, at every cp position) reduce those
experts' gradients.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

# axis -> (its ParallelConfig degree, fleet's hybrid_configs key), outermost first
AXES = {"pp": ("pp_degree", "pp_degree"), "dp": ("dp_degree", "dp_degree"),
        "sharding": ("sharding_degree", "sharding_degree"),
        # context parallelism (distributed.steps.context): no fleet axis, see fleet_hybrid_configs
        "cp": ("cp_degree", None),
        "mp": ("tp_degree", "mp_degree")}
FLEET_ORDER = ["pp", "dp", "sharding", "sep", "mp"]  # fleet's names in AXES order (its "sep" axis: degree 1)


def coordinates(rank: int, degrees: dict) -> dict:
    """{axis: index} of `rank` when the ranks enumerate `degrees` (ordered, outermost first) last-axis fastest."""
    out = {}
    for axis in reversed(list(degrees)):
        rank, out[axis] = divmod(rank, degrees[axis])
    return {axis: out[axis] for axis in degrees}


def rank_of(coords: dict, degrees: dict) -> int:
    rank = 0
    for axis, n in degrees.items():
        rank = rank * n + coords.get(axis, 0)
    return rank


@functools.lru_cache(maxsize=None)
def _all_groups(degrees: tuple, ep: int) -> dict[str, list[tuple[int, ...]]]:
    """`Topology.all_groups` of one tuple of (axis, degree) and expert-parallel degree."""
    topo = Topology(degrees, ep=ep)
    coords = [topo.coords(r) for r in range(topo.world_size)]

    def by(key) -> list[tuple[int, ...]]:
        out: dict[tuple, list[int]] = {}
        for r, c in enumerate(coords):
            out.setdefault(key(c), []).append(r)
        return sorted(tuple(g) for g in out.values())

    def along(axis: str) -> list[tuple[int, ...]]:
        return by(lambda c: tuple(c[a] for a in topo.sizes if a != axis))

    def place(c) -> tuple:  # what an expert group's ranks share besides their data ranks
        return c["pp"], c["cp"], c["mp"]

    # the holders of the same experts: one per expert group, at every cp position (context parallelism's ranks
    # route other tokens of the same sequences through the same experts, whose gradients are summed over all)
    return {"tp": along("mp"), "pp": along("pp"), "cp": along("cp"), "data": by(lambda c: (c["pp"], c["mp"])),
            "ep": by(lambda c: (*place(c), topo._data_rank(c) // ep)),
            "ep_replicas": by(lambda c: (c["pp"], c["mp"], topo._data_rank(c) % ep))}


@dataclass(frozen=True)
class Topology:
    """`degrees`: ((axis, degree), ...) in `AXES` order; `rank`: this process. Pure arithmetic until a method
    builds one of the engines' views (`init_fleet`, `mesh`)."""

    degrees: tuple
    rank: int = 0
    ep: int = 1  # expert-parallel degree: groups of `ep` data ranks split the experts (module docstring)

    @staticmethod
    @functools.lru_cache(maxsize=None)
    def of(parallel) -> "Topology":
        """The topology of a resolved `ParallelConfig` (the same object for the same config)."""
        sizes = {axis: getattr(parallel, degree) for axis, (degree, _) in AXES.items()}
        topo = Topology(tuple(sizes.items()), parallel.rank, parallel.ep_degree)
        if topo.world_size != parallel.world_size:
            raise ValueError(f"degrees {sizes} make {topo.world_size} ranks, the world is {parallel.world_size}")
        if topo.data_world_size % topo.ep:
            raise ValueError(f"ep {topo.ep} does not divide the {topo.data_world_size} data ranks")
        return topo

    # ------------------------------------------------------------------ arithmetic
    @property
    def sizes(self) -> dict:
        return dict(self.degrees)

    @property
    def world_size(self) -> int:
        return functools.reduce(lambda a, b: a * b, self.sizes.values(), 1)

    def degree(self, axis: str) -> int:
        return self.sizes[axis]

    def coords(self, rank: int | None = None) -> dict:
        return coordinates(self.rank if rank is None else rank, self.sizes)

    def coord(self, axis: str, rank: int | None = None) -> int:
        return self.coords(rank)[axis]

    @property
    def stage(self) -> int:
        """This rank's pipeline stage."""
        return self.coord("pp")

    @property
    def tp_rank(self) -> int:
        return self.coord("mp")

    @property
    def data_world_size(self) -> int:
        """Ranks that read different data: dp × sharding."""
        return self.degree("dp") * self.degree("sharding")

    def data_rank_of(self, rank: int) -> int:
        return self._data_rank(self.coords(rank))

    def _data_rank(self, c: dict) -> int:
        return c["dp"] * self.degree("sharding") + c["sharding"]

    @property
    def data_rank(self) -> int:
        """Which slice of the global batch this rank reads."""
        return self.data_rank_of(self.rank)

    def expert_rank(self, rank: int | None = None) -> int:
        """Which 1/ep of every sparse layer's experts `rank` (this rank) holds."""
        return self.data_rank_of(self.rank if rank is None else rank) % self.ep

    def expert_group(self, rank: int | None = None) -> tuple:
        """The ep ranks through `rank` (this rank) that split the experts between them and exchange tokens."""
        return self._through("ep", rank)

    def expert_replicas(self, rank: int | None = None) -> tuple:
        """The ranks holding the same experts as `rank` (this rank): one per expert group; their gradients are
        reduced over these (the data-parallel reduction of the rest of the model spans every data rank)."""
        return self._through("ep_replicas", rank)

    def _through(self, kind: str, rank: int | None) -> tuple:
        rank = self.rank if rank is None else rank
        return next(g for g in self.all_groups()[kind] if rank in g)

    def all_groups(self) -> dict[str, list[tuple[int, ...]]]:
        """{"tp" | "pp" | "cp" | "data" | "ep" | "ep_replicas": every group of ranks of that kind, sorted}: a tp, pp
        or cp group shares every coordinate but that axis's; a data group (dp × sharding, with cp) its stage and tp
        position; an expert group the stage, cp and tp position and data rank // ep (consecutive data ranks), an
        expert-replica group the stage, tp position and data rank % ep (every cp position). Each rank's coordinates
        computed once, cached per layout of degrees (`plan --fit` asks for thousands of candidates over a few dozen
        layouts)."""
        return _all_groups(self.degrees, self.ep)

    def replicas(self, *axes: str, rank: int | None = None) -> tuple:
        """The ranks whose coordinates on `axes` equal `rank`'s (this rank's): the ranks that hold the same
        block of a tensor split (or owned) along those axes and copied along the others."""
        return self._matching(self.rank if rank is None else rank, axes)

    def _matching(self, rank: int, axes, key=None) -> tuple:
        """The ranks whose coordinates on `axes` (and `key(coordinates)`, if given) equal `rank`'s; each rank's
        coordinates computed once (`plan --fit` asks this for every rank of thousands of candidate layouts)."""
        mine = self.coords(rank)
        want = key(mine) if key is not None else None
        out = []
        for r in range(self.world_size):
            c = self.coords(r)
            if all(c[a] == mine[a] for a in axes) and (key is None or key(c) == want):
                out.append(r)
        return tuple(out)

    def group(self, axis: str, rank: int | None = None) -> tuple:
        """The ranks along `axis` through `rank` (this rank): its group on that axis, in axis order."""
        return self.replicas(*(a for a in self.sizes if a != axis), rank=rank)

    def groups(self, axis: str) -> list[tuple]:
        """Every group along `axis` ("mp", "pp" or "cp"), in rank order of their first member (`all_groups`)."""
        return self.all_groups()[{"mp": "tp"}.get(axis, axis)]

    # ------------------------------------------------------------------ the engines' views of it
    def fleet_hybrid_configs(self) -> dict:
        """fleet's `hybrid_configs` degrees and axis order for this topology."""
        out = {AXES[a][1]: n for a, n in self.degrees if AXES[a][1]}
        out["sharding_degree"] *= self.sizes.get("cp", 1)  # ZeRO-1 under context parallelism shards over cp too
        out["order"] = list(FLEET_ORDER)
        return out

    def init_fleet(self, seed: int, backend, pipeline_configs: dict | None = None) -> None:
        """fleet's hybrid topology (its groups are this topology's: same order); `pipeline_configs` for a pipeline
        run. The gloo workarounds are the collectives `backend`'s (`distributed.comms.collectives`): a TCP store of its
        own for each group; a pipeline's unbatched stage-to-stage sends of whole activations. A pipeline also
        needs `ParallelEnv._device_id`, which the CPU build never sets."""
        import paddle.distributed as dist
        from paddle.distributed import fleet

        strategy = fleet.DistributedStrategy()
        strategy.hybrid_configs = self.fleet_hybrid_configs()
        if pipeline_configs is not None:
            strategy.pipeline_configs = backend.pipeline_flags(pipeline_configs, strategy.hybrid_configs)
            # the interleaved schedule's shape cache cleared after every step (evaluation's batch size differs)
            strategy.hybrid_configs["pp_configs"].clear_every_step_cache = bool(pipeline_configs.get("p2p_cache_shape"))
            if not hasattr(dist.ParallelEnv(), "_device_id"):
                dist.ParallelEnv._device_id = 0  # PipelineLayer reads it
        strategy.tensor_parallel_configs = {"tensor_init_seed": seed}
        with backend.stores():
            fleet.init(is_collective=True, strategy=strategy)
        hcg = fleet.get_hybrid_communicate_group()
        for axis, get in (("pp", hcg.get_pipe_parallel_group), ("dp", hcg.get_data_parallel_group),
                          ("sharding", hcg.get_sharding_parallel_group), ("mp", hcg.get_model_parallel_group)):
            # fleet's sharding axis spans sharding × cp (`fleet_hybrid_configs`): the ranks sharing every other axis
            want = self.replicas("pp", "dp", "mp") if axis == "sharding" else self.group(axis)
            if tuple(get().ranks) != want:  # fleet and this topology must name the same ranks (a bug)
                raise ValueError(f"fleet's {axis} group {get().ranks} is not the topology's {want}")

    def mesh(self):
        """The semi-auto engine's 2-D mesh ["dp", "mp"]: the data ranks (dp × sharding) by the tp ranks."""
        import numpy as np
        import paddle.distributed as dist

        if self.degree("pp") > 1:
            raise ValueError("the semi-auto mesh has no pipeline axis")
        ranks = np.arange(self.world_size).reshape(self.data_world_size, self.degree("mp"))  # [dp, mp]
        return dist.ProcessMesh(ranks.tolist(), dim_names=["dp", "mp"])
