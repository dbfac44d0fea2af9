"""Megatron sequence parallelism (`sequence_parallel: true`) on top of `tensor_parallel`'s Megatron split.

Plain tensor parallelism keeps every activation outside the two tensor-parallel regions (attention, MLP) whole on
every tp rank: the embedding output, both RMSNorms of every layer and the residual stream, computed tp times.
Sequence parallelism shards those on the sequence dimension over the tp group instead, so each tp rank holds and
normalises `seq_len / tp` positions of them; attention and the MLP still see the whole sequence:

- entering a region (`self_attn`, `mlp` pre-hooks, replacing `copy_to_tp`): all-gather on the sequence; backward
  reduce-scatter (each rank's slice of the summed input gradient);
- leaving it (`o_proj`, `down_proj` post-hooks, replacing `reduce_from_tp`'s all-reduce): reduce-scatter on the
  sequence, summing the row-parallel partial products and keeping this rank's positions; backward all-gather;
- the residual stream enters the decoder cut (`scatter`: a pre-hook on the first decoder layer; backward
  all-gather, so the embedding's gradient is whole and equal on every tp rank) and leaves it whole (`gather`, a
  post-hook on the final norm: every tp rank computes the same loss over the whole sequence, so the backward is
  just this rank's slice); a multi-token prediction module's decoder layer the same (cut entering it, whole leaving
  it), its projection, its norms around the layer and the head computed whole as the main model's head;
- the norms' weights (and a row-parallel bias, added after the sum) now see only this rank's positions: their
  gradients are summed over the tp group once per step (`tensor_parallel.sum_grads`).

Which TP form runs it: this one (`tensor_parallel`'s PyLayers over the topology's "mp" group), for a pipeline's
stages and for plain TP (`distributed.strategies.tensor_engine.TensorParallel`, engine "tensor_parallel") alike. The
semi-auto engine's sequence-parallel plans reshard through reduce-scatter and all-to-all, which its CPU build lacks, so
only this form can be verified here; its slices and checkpoint pieces are the same as the pipeline's TP
(`Pipeline.local_box`).

CPU workaround (docs/DISTRIBUTED.md, "What CPU verifies"): gloo has no `reduce_scatter`; the run's collectives
backend (`distributed.comms.collectives`) makes it an `all_reduce` and this rank's slice there, and
`paddle.distributed.reduce_scatter` on NCCL. The result is the same; the CPU path moves tp times the bytes.
"""
from __future__ import annotations

from dataclasses import dataclass

from paddle.autograd import PyLayer  # imported lazily, after the environment (only the layout steps import this)

SEQ = 1  # the sequence axis of an activation [bsz, seq_len, hidden]


@dataclass(frozen=True)
class SeqShard:
    """This rank's share of the sequence in its tp group: slice `index` of `parts`, exchanged over `group`
    through the run's collectives `backend` (`distributed.comms.collectives`: reduce-scatter on gloo is an all-reduce
    and a slice)."""

    group: object
    parts: int
    index: int
    backend: object

    def cut(self, x):
        """[bsz, seq_len, hidden] -> this rank's [bsz, seq_len / parts, hidden] (a copy, not a view)."""
        import paddle

        size = x.shape[SEQ] // self.parts
        return paddle.slice(x, axes=[SEQ], starts=[self.index * size], ends=[(self.index + 1) * size]).clone()

    def gather(self, x):
        """[bsz, s, hidden] on each rank -> [bsz, s x parts, hidden], in group rank order."""
        return self.backend.all_gather(x, self.group, SEQ)

    def reduce_scatter(self, x):
        """The sum of `x` over the group, this rank's positions kept: [bsz, seq_len / parts, hidden]."""
        return self.backend.reduce_scatter(x, self.group, self.parts, self.index, SEQ)


class Exchange(PyLayer):
    """One exchange of the sequence over the tp group and its adjoint: forward `shard.<forward>(x)`, backward
    `shard.<backward>(dy)`. The four Megatron-SP pairs (`ENTER`, `LEAVE`, `SCATTER`, `GATHER`) are its uses."""

    @staticmethod
    def forward(ctx, x, shard, forward: str, backward: str):
        ctx.shard, ctx.backward_name = shard, backward
        return getattr(shard, forward)(x)

    @staticmethod
    def backward(ctx, dy):
        return getattr(ctx.shard, ctx.backward_name)(dy)


ENTER = ("gather", "reduce_scatter")  # entering a region: all-gather forward, reduce-scatter backward
LEAVE = ("reduce_scatter", "gather")  # leaving it: reduce-scatter forward, all-gather backward
SCATTER = ("cut", "gather")  # the residual stream cut entering the decoder: this rank's positions, all-gather back
GATHER = ("gather", "cut")  # whole again after the final norm: all-gather, backward this rank's slice (every tp
#                             rank computes the same loss)


def regions(shard: SeqShard) -> tuple:
    """(enter, leave): the functions `tensor_parallel.split_layers` hooks around each region instead of its
    all-reduce pair."""
    return (lambda x: Exchange.apply(x, shard, *ENTER)), (lambda x: Exchange.apply(x, shard, *LEAVE))


def hook_model(lm, shard: SeqShard) -> list:
    """The decoder's boundaries: the residual stream cut entering the first decoder layer, whole again after the
    final norm; each MTP module's layer cut entering it and whole leaving it (`split_layers` hooks its regions as a
    decoder layer's, which gathered a whole input to twice the sequence). Returns the parameters whose gradients
    `tensor_parallel.sum_grads` must sum over the tp group (every RMSNorm's weight between the regions and a
    row-parallel bias); `tensor_parallel.split_layers` hooks the regions."""
    dec = lm.model

    def cut(layer, inputs):
        return (Exchange.apply(inputs[0], shard, *SCATTER),) + tuple(inputs[1:])

    def whole(layer, inputs, out):
        return Exchange.apply(out, shard, *GATHER)

    dec.layers[0].register_forward_pre_hook(cut)
    dec.norm.register_forward_post_hook(whole)
    out = [dec.norm.weight]
    mtp = list(getattr(dec.layers, "mtp", []))  # `models.mtp.MTPModule`: its layer is `_block[0]`
    for module in mtp:
        module._block[0].register_forward_pre_hook(cut)
        module._block[0].register_forward_post_hook(whole)
    for layer in list(dec.layers) + mtp:
        out += [layer.input_layernorm.weight, layer.post_attention_layernorm.weight]
        out += [b for b in (layer.self_attn.o_proj.bias, layer.mlp.down_proj.bias) if b is not None]
    return out

