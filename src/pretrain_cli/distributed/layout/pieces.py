"""What a rank holds of the model and its optimizer state, as pieces of global tensors: the checkpoint's unit.

A checkpoint is written by every rank at once, each rank writing only the pieces it owns, and read
back by any layout slice by slice (`training/checkpoint.py`, docs/CHECKPOINTS.md). Between the two
sits this module's vocabulary, shared by every `Strategy`:

- `Piece`: one rectangular block of a global tensor that this rank holds — the tensor's Hugging Face
  name (optimizer state: `"<hf name>/<slot>"`, slot one of `SLOTS`), its global shape, the block's
  offsets and shape in it, HF layout (Linear weights `[out, in]`), the ranks holding an identical copy
  (`holders`, this rank among them), and the rank's tensor itself: `view()` hands the block to a synchronous
  writer when it gets to it (numpy; bf16 as uint16 bits), without a copy where it can; an asynchronous save
  copies it into its own host buffers (`training.async_save`).
- `Box`: where a tensor's local part sits in the global tensor, in Paddle's layout; the load side of
  the same fact (`Strategy.local_box`).

The pieces a rank yields are decided by its strategy (`Strategy.pieces`): whole tensors in one process,
data parallel and fleet ZeRO-1 (whose optimizer state lives on the owning rank only), placed blocks
under the semi-auto engine (ZeRO-2/3 shards, TP slices, from each DistTensor's mesh and placements).
A pipeline strategy yields its stage's tensors with the stage's data-parallel ranks as holders (with tensor
parallelism inside the stages: its tp slices, each held by the stage's ranks with the same tp coordinate).
`writer_of` picks one writer per replicated piece, the same choice on every holder without any
communication, spreading the bytes over the holders instead of loading them all on the lowest rank.
"""
from __future__ import annotations

from dataclasses import dataclass
import numpy as np

# Paddle AdamW accumulator tables -> the slot names in a checkpoint; "master" is O2's fp32 weight copy
ACCUMULATORS = {"moment1": "moment1", "moment2": "moment2", "beta1_pow_acc": "beta1_pow", "beta2_pow_acc": "beta2_pow"}
SLOTS = (*ACCUMULATORS.values(), "master")


def state_name(hf: str, slot: str) -> str:
    """The checkpoint name of optimizer state `slot` of HF tensor `hf`: `"<hf name>/<slot>"`."""
    return f"{hf}/{slot}"


def split_name(name: str) -> tuple[str, str | None]:
    """(HF tensor name, optimizer slot) of a checkpoint tensor name; the slot is None for a weight."""
    hf, _, slot = name.partition("/")
    return hf, slot or None


@dataclass(frozen=True)
class Box:
    """A block of a global tensor: `offsets` and `shape` per dimension inside `global_shape`."""

    global_shape: tuple
    offsets: tuple
    shape: tuple

    @property
    def whole(self) -> bool:
        return tuple(self.shape) == tuple(self.global_shape)

    def transposed(self) -> "Box":
        """The same block of the transposed (2-D) tensor: Paddle `[in, out]` <-> HF `[out, in]`."""
        return Box(tuple(reversed(self.global_shape)), tuple(reversed(self.offsets)), tuple(reversed(self.shape)))


@dataclass(frozen=True)
class Piece:
    """One block of one global tensor held by this rank (see the module docstring)."""

    name: str
    kind: str  # "weights" or "optimizer": which file of the rank it goes to
    box: Box  # HF layout
    dtype: str  # safetensors code: F32, BF16, F16
    holders: tuple  # ranks with an identical copy, sorted
    tensor: object  # this rank's Paddle tensor (its local value is the block, Paddle layout)
    transpose: bool = False  # HF layout is the transpose of Paddle's (2-D Linear weights and their state)

    def view(self) -> np.ndarray:
        """The block in HF layout without a copy where it can be (`host_view`): what a synchronous save writes."""
        return host_view(self.tensor, self.transpose)

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.box.shape, dtype=np.int64)) * (4 if self.dtype == "F32" else 2)


def dtype_code(tensor) -> str:
    kind = str(tensor.dtype).split(".")[-1]
    return {"float32": "F32", "bfloat16": "BF16", "float16": "F16"}[kind]


def split(total: int, parts: int) -> list[int]:
    """Paddle's split of one dimension over `parts` ranks: ceil-sized chunks, the last one smaller."""
    size = -(-total // parts)
    return [max(0, min(size, total - i * size)) for i in range(parts)]


def mesh_box(global_shape, mesh_shape, coords, shard_dims) -> Box:
    """The block a rank at mesh `coords` holds when mesh dim i shards tensor dim `shard_dims[i]` (None:
    replicated along it). Several mesh dims sharding one tensor dim nest in mesh order, as in Paddle."""
    shape, offsets = list(global_shape), [0] * len(global_shape)
    for mesh_dim, tdim in enumerate(shard_dims):
        if tdim is None:
            continue
        chunks = split(shape[tdim], mesh_shape[mesh_dim])
        c = coords[mesh_dim]
        offsets[tdim] += sum(chunks[:c])
        shape[tdim] = chunks[c]
    return Box(tuple(global_shape), tuple(offsets), tuple(shape))


def dist_layout(tensor, rank: int) -> tuple[Box, tuple]:
    """(this rank's `Box`, the holders of the same block) for a DistTensor: from its mesh and placements."""
    return placed_box(tuple(tensor.shape), tensor.process_mesh, tensor.placements, rank)


def placed_box(global_shape, mesh, placements, rank: int) -> tuple[Box, tuple]:
    """`dist_layout` of a tensor of `global_shape` before it exists: the block `rank` holds under `placements` on
    `mesh` (what `distributed.layout.materialize` creates), and the ranks holding the same block."""
    ids = np.array(mesh.process_ids).reshape(mesh.shape)
    shard_dims = []
    for p in placements:
        if p.is_partial():
            raise ValueError("a Partial tensor has no value of its own to save")
        shard_dims.append(p.get_dim() if p.is_shard() else None)
    coords = tuple(int(c[0]) for c in np.nonzero(ids == rank))
    box = mesh_box(tuple(global_shape), tuple(mesh.shape), coords, shard_dims)
    # the same block sits on every rank whose coordinates agree on the sharding mesh dims
    index = tuple(slice(None) if d is None else coords[i] for i, d in enumerate(shard_dims))
    return box, tuple(sorted(int(r) for r in np.asarray(ids[index]).ravel()))


def local_value(tensor):
    return tensor._local_value() if getattr(tensor, "is_dist", lambda: False)() else tensor


def host_view(tensor, transpose: bool) -> np.ndarray:
    """The local value as numpy in HF layout without a copy where it can be (an fp32 CPU tensor: a DLPack view,
    transposed as a view), else its `Tensor.numpy()` copy. Valid while the tensor is not updated."""
    import paddle

    t = local_value(tensor)
    arr = np.from_dlpack(t.detach()) if t.place.is_cpu_place() and t.dtype == paddle.float32 else t.numpy()
    return arr.T if transpose and arr.ndim == 2 else arr


def writer_of(pieces) -> dict:
    """{piece name: the rank that writes it}. Pieces held by one rank are written by it; a replicated piece
    goes to the least-loaded of its holders (bytes so far among pieces with the same holder set, in
    enumeration order): every holder enumerates the same pieces of that set in the same order, so each
    computes the same choice alone."""
    load: dict = {}
    out = {}
    for p in pieces:
        if len(p.holders) == 1:
            out[p.name] = p.holders[0]
            continue
        counts = load.setdefault(p.holders, {r: 0 for r in p.holders})
        rank = min(p.holders, key=lambda r: (counts[r], r))
        counts[rank] += p.nbytes
        out[p.name] = rank
    return out


def inner_optimizer(optimizer):
    """The Paddle AdamW under fleet / sharding wrappers (they keep it as `_inner_opt`)."""
    while hasattr(optimizer, "_inner_opt"):
        optimizer = optimizer._inner_opt
    return optimizer


def state_tensors(model, optimizer=None):
    """(name, kind, tensor, transpose) for every parameter and, with `optimizer`, every optimizer-state tensor
    this rank has (in model order, the same order on every rank). Optimizer state is read from the
    accumulator tables by parameter, not by parsing Paddle's generated names: under O2 the moments belong to
    the fp32 master copy (`<param>_fp32_master_0_moment1_0`). Absent state (fleet ZeRO-1's other ranks'
    parameters, a step not taken yet) is simply not listed."""
    from pretrain_cli.models.convert import hf_params

    named = hf_params(model)
    for hf, p, transpose in named:
        yield hf, "weights", p, transpose
    if optimizer is None:
        return
    inner = inner_optimizer(optimizer)
    master = getattr(inner, "_master_weights", None) or {}
    for hf, p, transpose in named:
        target = master.get(p.name, p)
        for key, slot in ACCUMULATORS.items():
            t = inner._accumulators.get(key, {}).get(target.name)
            if t is not None:
                yield state_name(hf, slot), "optimizer", t, transpose and len(t.shape) == 2
        if p.name in master:
            yield state_name(hf, "master"), "optimizer", master[p.name], transpose
