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
  just this rank's slice);
- the norms' weights (and a row-parallel bias, added after the sum) now see only this rank's positions: their
  gradients are summed over the tp group once per step (`sum_grads`).

Which TP form runs it: this one (`tensor_parallel`'s PyLayers over the topology's "mp" group), for a pipeline's
stages and for plain TP (`distributed.tensor_engine.TensorParallel`, engine "tensor_parallel") alike. The semi-auto engine's sequence-parallel
plans reshard through reduce-scatter and all-to-all, which its CPU build lacks, so only this form can be verified
here; its slices and checkpoint pieces are the same as the pipeline's TP (`Pipeline.local_box`).

CPU workaround (docs/DISTRIBUTED.md, "What CPU verifies"): gloo has no `reduce_scatter`, so with `gloo` on it is an
`all_reduce` and this rank's slice (`reduce_scatter`, the one switch); on GPU it is
`paddle.distributed.reduce_scatter`. The result is the same; the CPU path moves tp times the bytes.
"""
from __future__ import annotations

SEQ = 1  # the sequence axis of an activation [bsz, seq_len, hidden]


def _cut(x, parts: int, index: int):
    """Positions `index` of `parts` equal slices of `x` on the sequence axis: [bsz, seq_len / parts, hidden]."""
    import paddle

    size = x.shape[SEQ] // parts
    return paddle.slice(x, axes=[SEQ], starts=[index * size], ends=[(index + 1) * size])


def all_gather(x, group):
    """[bsz, s, hidden] on each of the group's ranks -> [bsz, s x ranks, hidden], in group rank order."""
    import paddle
    import paddle.distributed as dist

    parts: list = []
    dist.all_gather(parts, x.contiguous(), group=group)  # a slice may be a strided view
    return paddle.concat(parts, axis=SEQ)


def reduce_scatter(x, group, parts: int, index: int, gloo: bool):
    """The sum of `x` over the group, positions `index` of `parts` kept: [bsz, seq_len / parts, hidden].
    `gloo` (the CPU build): all_reduce then this rank's slice, since gloo has no reduce_scatter."""
    import paddle
    import paddle.distributed as dist

    if gloo:
        y = x.clone()
        dist.all_reduce(y, group=group)
        return _cut(y, parts, index)
    out = paddle.empty_like(_cut(x, parts, index))
    dist.reduce_scatter(out, [t.contiguous() for t in paddle.split(x, parts, axis=SEQ)], group=group)
    return out


def functions(parts: int, index: int, gloo: bool) -> tuple:
    """(enter, leave, scatter, gather) autograd functions; `enter` and `leave` take (x, group) like
    `tensor_parallel`'s pair, which they replace."""
    from paddle.autograd import PyLayer

    class Enter(PyLayer):  # all-gather forward, reduce-scatter backward
        @staticmethod
        def forward(ctx, x, group):
            ctx.group = group
            return all_gather(x, group)

        @staticmethod
        def backward(ctx, dy):
            return reduce_scatter(dy, ctx.group, parts, index, gloo)

    class Leave(PyLayer):  # reduce-scatter forward, all-gather backward
        @staticmethod
        def forward(ctx, x, group):
            ctx.group = group
            return reduce_scatter(x, group, parts, index, gloo)

        @staticmethod
        def backward(ctx, dy):
            return all_gather(dy, ctx.group)

    class Scatter(PyLayer):  # this rank's positions forward, all-gather backward
        @staticmethod
        def forward(ctx, x, group):
            ctx.group = group
            return _cut(x, parts, index).clone()

        @staticmethod
        def backward(ctx, dy):
            return all_gather(dy, ctx.group)

    class Gather(PyLayer):  # all-gather forward; backward this rank's slice (the same loss on every tp rank)
        @staticmethod
        def forward(ctx, x, group):
            return all_gather(x, group)

        @staticmethod
        def backward(ctx, dy):
            return _cut(dy, parts, index).clone()

    return Enter, Leave, Scatter, Gather


def hook_model(lm, group, parts: int, index: int, gloo: bool) -> list:
    """The decoder's boundaries: the residual stream cut entering the first decoder layer, whole again after the
    final norm. Returns the parameters whose gradients `sum_grads` must sum over the tp group (every RMSNorm's
    weight between the regions and a row-parallel bias); `tensor_parallel.split_layers` hooks the regions."""
    _, _, scatter, gather = functions(parts, index, gloo)
    dec = lm.model

    def cut(layer, inputs):
        return (scatter.apply(inputs[0], group),) + tuple(inputs[1:])

    def whole(layer, inputs, out):
        return gather.apply(out, group)

    dec.layers[0].register_forward_pre_hook(cut)
    dec.norm.register_forward_post_hook(whole)
    out = [dec.norm.weight]
    for layer in dec.layers:
        out += [layer.input_layernorm.weight, layer.post_attention_layernorm.weight]
        out += [b for b in (layer.self_attn.o_proj.bias, layer.mlp.down_proj.bias) if b is not None]
    return out


def sum_grads(params: list, group) -> None:
    """The norms' (and a row-parallel bias's) gradients each cover this rank's positions only: summed over the
    tp group, once per step, they are the whole sequence's."""
    import paddle.distributed as dist

    for p in params:
        if p.grad is not None:
            dist.all_reduce(p.grad, group=group)
