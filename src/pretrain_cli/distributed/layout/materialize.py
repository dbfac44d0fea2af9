"""Creating a lazily built model's parameters on the rank that holds them, at the size it holds them.

`training.run.build_model` builds the single-device model under `paddle.LazyGuard`: every parameter has
its name, shape and dtype but no storage. The layout (`Strategy.place`) then creates, parameter by
parameter, only this rank's block, from a `Source`:

- `InitSource`: the run's initial values (`models.init.block`: a pure function of seed, HF name and block,
  so a ZeRO-3 shard or TP slice is exactly its slice of one process's tensor);
- `training.weight_source.WeightSource`: the block read from a checkpoint or a Hugging Face / PaddleNLP
  directory (byte ranges of the tensors this rank holds).

Parameters a rank does not hold (another pipeline stage's) are never created. The transient while
creating one is the block's host copy plus, for the initialiser, one drawn chunk (`models.init.CHUNK`);
a parameter that already has storage (an eagerly built model, as tests and the benchmark harness pass) is
left as it is.
"""
from __future__ import annotations

from pretrain_cli.distributed.layout.pieces import Box, placed_box


class InitSource:
    """The initial values of `cfg`'s parameters for run seed `seed`."""

    dtype = None  # the dtype blocks are created in: the parameter's, or (set by `lay_out` after AMP's O2 cast) O2's
    kept = frozenset()  # ids of the parameters O2 leaves fp32 (`after_o2`), created in their own dtype

    def __init__(self, cfg, seed: int, workers: int = 1):
        """`workers`: the threads drawing a tensor's chunks at once (the process's CPU threads)."""
        self.cfg, self.seed, self.workers = cfg, seed, workers

    def __call__(self, name: str, box: Box):
        from pretrain_cli.models.init import block

        return block(self.cfg, self.seed, name, box.global_shape, box.offsets, box.shape, self.workers)


def after_o2(source, model, dtype: str) -> None:
    """Blocks `source` creates from now on (ZeRO-3's, after AMP's O2 cast) take O2's `dtype`, but those of the
    parameters O2 leaves fp32 keep theirs: the layers whose `_cast_to_low_precision` is off, which
    `paddle.amp.decorate` skips (amp/auto_cast.py 3.3.1, `need_keep_fp32`; the MoE routers,
    `models.moe.fp32_router`)."""
    source.dtype = dtype
    source.kept = frozenset(id(p) for layer in model.sublayers(include_self=True)
                            if not getattr(layer, "_cast_to_low_precision", True)
                            for p in layer.parameters(include_sublayers=False))


def pending(param) -> bool:
    """Whether `param` was built lazily and has no storage yet."""
    return not param._is_initialized()


def whole_box(param) -> Box:
    shape = tuple(int(d) for d in param.shape)
    return Box(shape, (0,) * len(shape), shape)


def fill_whole(name: str, param, source) -> None:
    """Create `param` whole on this rank from `source`: the host block is copied straight into the parameter's
    new storage (no Paddle tensor in between: the transient is the one host block)."""
    import paddle

    value = source(name, whole_box(param))
    if str(param.dtype).split(".")[-1] != "float32":
        value = paddle.to_tensor(value).astype(param.dtype)
    param.set_value(value)


def read_block(name: str, param, source, box: Box):
    """`box` of parameter `param` (HF name `name`) read from `source` as a Paddle tensor in the dtype the run
    holds it in: `source.dtype` when set (AMP's O2 cast dtype, which a parameter without storage does not take
    on: it keeps the dtype it was built in) unless O2 leaves the parameter fp32 (`after_o2`), else the parameter's
    own. One rule for every layout that creates a parameter as its block only (`fill_placed`,
    `tensor_parallel.split_layers`)."""
    import paddle

    block = paddle.to_tensor(source(name, box))  # box.shape
    dtype = param.dtype if source.dtype is None or id(param) in getattr(source, "kept", ()) else source.dtype
    return block.astype(dtype) if block.dtype != dtype else block


def fill_placed(name: str, param, source, mesh, placements, rank: int):
    """`param` as a DistTensor parameter on `mesh` with `placements`, created from this rank's block only
    (what `dist.shard_tensor` would cut from the whole tensor, without the whole tensor ever existing). The
    parameter object stays the same (a lazy DistTensor parameter, placed without storage, takes `placements`).

    The DistTensor is given the parameter's global shape: `dtensor_from_local` would infer it as the local block
    times the ranks, which differs between ranks when a dimension does not split evenly (vocab_size 513 over 2:
    blocks of 257 and 256 rows, "global" shapes 514 and 512), and the gathers of ZeRO-3's pieces then disagree on
    the sizes (gloo: "op.preamble.length <= op.nbytes", an abort)."""
    import paddle

    shape = [int(d) for d in param.shape]
    box, _ = placed_box(tuple(shape), mesh, placements, rank)
    local = read_block(name, param, source, box)
    placed = paddle.Tensor(local, dims=shape, process_mesh=mesh, placements=placements, place=local.place)
    param._set_impl(placed)  # the same parameter object, now placed
    return param


def fill(model, source, keep=None) -> int:
    """Create every pending parameter of `model` whole (those `keep(name)` accepts, if given); returns how many."""
    done = 0
    for name, param in model.named_parameters():
        if pending(param) and (keep is None or keep(name)):
            fill_whole(name, param, source)
            done += 1
    return done
