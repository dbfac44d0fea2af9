"""Single-device kernels on distributed tensors: run each kernel on this rank's local piece.

Under Paddle's semi-auto engine activations are `DistTensor`s. Paddle's own ops have SPMD rules,
but our fused CPU kernels (custom C++ ops) do not: Paddle then reshards every input to Replicate
(all-gathering the whole batch onto every rank) or, for ops with several inputs, refuses them
("Your custom operator contains multiple inputs..."). Every one of our kernels is row-wise over
batch and sequence and independent per head, so running it on the local piece is exact under batch
sharding (data parallel) and head/column sharding (tensor parallel). `localize` wraps a `Kernels`
table so each op takes the local value (`dtensor_to_local`), runs, and declares the result with the
input's placements (`dtensor_from_local`); autograd flows through both.

Weights a kernel reads whole (RMSNorm, and ZeRO-3's sharded pieces of any weight) are gathered
with `dist.reshard` and handed over "Partial" on the axes where the activation is sharded, so the
local gradient the kernel returns is summed across ranks by Paddle, not dropped. Measured exact
(≤ 1e-6) against one process for DP, ZeRO-1/2/3, TP and dp × tp on CPU (docs/DISTRIBUTED.md).

The fused LM head + loss (`ops.linear_loss`) runs on each rank's rows against the whole head weight
(gathered under ZeRO-3, Partial like RMSNorm's); the ranks' loss sums are added by Paddle.
Under tensor parallelism the head is split over the vocabulary and each rank would need all of it, so
`config.resolve` keeps the logits and the localized cross-entropy there (`linear_cross_entropy` is None).
"""
from __future__ import annotations

import dataclasses


def to_replicated(grad):
    """The CPU gradient hook: a Partial gradient becomes Replicated (an all-reduce).

    Sharded optimizers (and a concatenated weight's backward) would otherwise reshard Partial → Shard,
    a reduce-scatter that gloo lacks (ARCHITECTURE.md facts: gloo). A tensor-parallel Shard placement on
    another mesh axis is kept. On GPU the reduce-scatter exists and the hook is not installed.
    """
    import paddle.distributed as dist

    if grad.is_dist() and any(p.is_partial() for p in grad.placements):
        return dist.reshard(grad, grad.process_mesh, [dist.Replicate() if p.is_partial() else p
                                                      for p in grad.placements])
    return grad


def _replicate_grad(x, hook: bool):
    """`x` with the CPU gradient hook when its gradient would arrive Partial (see `to_replicated`)."""
    if hook and not x.stop_gradient:
        x.register_hook(to_replicated)
    return x


def _no_partial(x):
    import paddle.distributed as dist

    if any(p.is_partial() for p in x.placements):
        x = dist.reshard(x, x.process_mesh, [dist.Replicate() if p.is_partial() else p for p in x.placements])
    return x


def _local(x):
    from paddle.distributed.auto_parallel.api import dtensor_to_local

    return dtensor_to_local(x, x.process_mesh, x.placements)


def _dist(t, like):
    from paddle.distributed.auto_parallel.api import dtensor_from_local

    return dtensor_from_local(t, like.process_mesh, like.placements)


def gather_zero(w, hook: bool):
    """A weight ZeRO-3 keeps as a piece on the data axis, all-gathered for use (tensor-parallel
    sharding on the other axis is kept). The gathered copy's backward would reshard Partial → Shard
    (a reduce-scatter), so on CPU it gets the `to_replicated` hook first."""
    import paddle.distributed as dist

    if not (w.is_dist() and w.placements[0].is_shard()):
        return w
    return _replicate_grad(dist.reshard(w, w.process_mesh, [dist.Replicate(), *w.placements[1:]]), hook)


def _weight_for(w, like, hook: bool):
    """A weight the kernel reads whole, as its local input: Partial where `like` is sharded."""
    import paddle.distributed as dist
    from paddle.distributed.auto_parallel.api import dtensor_to_local

    if any(p.is_shard() for p in w.placements):
        w = _replicate_grad(dist.reshard(w, w.process_mesh, [dist.Replicate() for _ in w.placements]), hook)
    placements = [dist.Partial() if p.is_shard() else dist.Replicate() for p in like.placements]
    return dtensor_to_local(w, w.process_mesh, placements)


def localize(k, hook: bool):
    """`k` (an `ops.kernels.Kernels`) with every op running on local pieces of distributed tensors.

    Dense inputs go to the original op unchanged (generation, evaluation after gathering).
    """
    rms, rope, attn, attn_cached, attn_doc = k.rms_norm, k.rope, k.attention, k.attention_cached, k.attention_document
    swiglu, swiglu_packed, ce, lce = k.swiglu, k.swiglu_packed, k.cross_entropy, k.linear_cross_entropy

    def rms_norm(x, w, eps):
        if not x.is_dist():
            return rms(x, w, eps)
        x = _no_partial(x)
        return _dist(rms(_local(x), _weight_for(w, x, hook), eps), x)

    def rope_(q, kk, cos, sin, position_ids=None):
        # also for Paddle's reference RoPE: its [s, b*h, d] merge would co-shard batch and heads
        if not q.is_dist():
            return rope(q, kk, cos, sin, position_ids) if position_ids is not None else rope(q, kk, cos, sin)
        q, kk = _no_partial(q), _no_partial(kk)
        cos = cos._local_value() if cos.is_dist() else cos  # tables, not parameters: no gradient
        sin = sin._local_value() if sin.is_dist() else sin
        if position_ids is None:
            qo, ko = rope(_local(q), _local(kk), cos, sin)
        else:  # [bsz, seq_len] rows of this rank's samples
            qo, ko = rope(_local(q), _local(kk), cos, sin, _local(position_ids))
        return _dist(qo, q), _dist(ko, kk)

    def attention(q, kk, v, _op=attn):
        if not q.is_dist():
            return _op(q, kk, v)
        q, kk, v = _no_partial(q), _no_partial(kk), _no_partial(v)
        return _dist(_op(_local(q), _local(kk), _local(v)), q)

    def attention_document(q, kk, v, doc_start):
        if not q.is_dist():
            return attn_doc(q, kk, v, doc_start)
        q, kk, v = _no_partial(q), _no_partial(kk), _no_partial(v)
        return _dist(attn_doc(_local(q), _local(kk), _local(v), _local(doc_start)), q)

    def swiglu_(g, u):
        if not g.is_dist():
            return swiglu(g, u)
        g, u = _no_partial(g), _no_partial(u)
        return _dist(swiglu(_local(g), _local(u)), g)

    def gate_up(x, gate_w, up_w, gate_b=None, up_b=None):
        """Each rank concatenates its own gate and up pieces, `[hidden, 2·inter/tp]` laid out [g_r | u_r],
        declared with gate's placements; so `swiglu_packed` below sees this rank's halves."""
        import paddle

        if not gate_w.is_dist():
            return k.gate_up(x, gate_w, up_w, gate_b, up_b)
        g, u = gather_zero(gate_w, hook), gather_zero(up_w, hook)
        w = _dist(paddle.concat([_local(g), _local(u)], axis=1), g)  # [hidden, 2*inter]
        out = paddle.matmul(x, w)  # [bsz, seq_len, 2*inter], per rank [g_r | u_r]
        if gate_b is not None:
            gb, ub = gather_zero(gate_b, hook), gather_zero(up_b, hook)
            out = out + _dist(paddle.concat([_local(gb), _local(ub)]), gb)  # [2*inter]
        return out

    def swiglu_packed_(gu):
        if not gu.is_dist():
            return swiglu_packed(gu)
        gu = _no_partial(gu)
        return _dist(swiglu_packed(_local(gu)), gu)

    def cross_entropy(logits, labels, ignore_index):
        import paddle.distributed as dist

        if not logits.is_dist():
            return ce(logits, labels, ignore_index)
        logits = _no_partial(logits)
        if any(p.is_shard() and p.get_dim() == 1 for p in logits.placements):  # vocab-parallel: whole rows
            logits = dist.reshard(logits, logits.process_mesh, [
                dist.Replicate() if (p.is_shard() and p.get_dim() == 1) else p for p in logits.placements])
        return _dist(ce(_local(logits), _local(labels), ignore_index), labels)

    def linear_cross_entropy(h, w, labels, ignore_index, vocab_major):
        """This rank's rows `[n, hidden]` against the whole head. Each rank's loss sum becomes its piece of a
        `[ranks]` tensor sharded like the rows, summed by Paddle: declaring the local sum Partial instead would
        send the gradient to one rank only (Replicate -> Partial keeps the value on rank 0, zeros elsewhere)."""
        if not h.is_dist():
            return lce(h, w, labels, ignore_index, vocab_major)
        h = _no_partial(h)
        total = lce(_local(h), _weight_for(w, h, hook), _local(labels), ignore_index, vocab_major)
        pieces = _dist(total.reshape([1]), h)  # [1] per rank -> [data ranks]
        return _replicate_grad(pieces, hook).sum()  # the sum's gradient arrives Partial

    return dataclasses.replace(
        k, rms_norm=rms_norm, rope=rope_, attention=attention, attention_document=attention_document,
        swiglu=swiglu_, gate_up=gate_up,
        swiglu_packed=swiglu_packed_, cross_entropy=cross_entropy,
        linear_cross_entropy=linear_cross_entropy if lce is not None else None,
        attention_cached=lambda q, kk, v: attention(q, kk, v, attn_cached))


def use_local_kernels(model, hook: bool):
    """Give every layer of a built model the localized kernels (they share one `Kernels` table)."""
    k = localize(model.kernels, hook)
    for layer in [model, *model.sublayers()]:
        if hasattr(layer, "kernels"):
            layer.kernels = k
    return model
