"""Single-device kernels on distributed tensors: run each kernel on this rank's local piece.

Under Paddle's semi-auto engine activations are `DistTensor`s. Paddle's own ops have SPMD rules,
but our fused CPU kernels (custom C++ ops) do not: Paddle then reshards every input to Replicate
(all-gathering the whole batch onto every rank) or, for ops with several inputs, refuses them
("Your custom operator contains multiple inputs..."). Every one of our kernels is row-wise over
batch and sequence and independent per head, so running it on the local piece is exact under batch
sharding (data parallel) and head/column sharding (tensor parallel). `localize` wraps a `Kernels`
table so each op takes the local value (`dtensor_to_local`), runs, and declares the result with the
input's placements (`dtensor_from_local`); autograd flows through both. The model is built with that
table (`distributed.steps.order.build_kernels`: the semi-auto `data` step's build side), before it is laid out.

Weights a kernel reads whole (RMSNorm, and ZeRO-3's sharded pieces of any weight) are gathered
with `dist.reshard` and handed over "Partial" on the axes where the activation is sharded, so the
local gradient the kernel returns is summed across ranks by Paddle, not dropped. Measured exact
(≤ 1e-6) against one process for DP, ZeRO-1/2/3, TP and dp × tp on CPU (docs/DISTRIBUTED.md). The routed
experts' ZeRO-3 shards are gathered inside the grouped GEMM instead (`ZeroGather`), which would otherwise keep
every sparse layer's gathered experts from its forward to its backward.

The fused LM head + loss (`ops.linear_loss`) runs on each rank's rows against the whole head weight
(gathered under ZeRO-3, Partial like RMSNorm's); the ranks' loss sums are added by Paddle. Under tensor
parallelism over a vocabulary tp does not divide the head is whole (Replicate on "mp") and every tp rank runs the
same rows, whose loss pieces are Replicate on "mp" like the rows: the sum counts them once. Where tp splits the
vocabulary each rank would need all of the head, so `config.resolve` keeps the logits and the localized
cross-entropy there (`linear_cross_entropy` is None).
"""
from __future__ import annotations

import dataclasses

from pretrain_cli.distributed.comms.collectives import to_replicated
from pretrain_cli.ops.reference import embedding_reference


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


class ZeroGather:
    """How the experts' GEMM reads a routed expert's ZeRO-3 shard `w` whole (`ops.grouped_gemm_layer.Gathered`,
    `moe_layouts.LocalDispatch`): inside the GEMM, in forward and again in backward, so a sparse layer keeps only
    the shards from its forward to its backward, not its experts whole. `whole()` is `gather_zero`'s all-gather
    (this rank's tp slice whole on "dp"); `shard_grad(dw)` is what autograd ran on the gathered copy's gradient: the
    local dW declared Partial on "dp" where the tokens (`like`) are sharded, all-reduced by the CPU hook
    (`to_replicated`), then resharded to the shard's placements (this rank's slice; NCCL: a reduce-scatter)."""

    def __init__(self, w, like, hook: bool):
        import paddle.distributed as dist

        self.w, self.hook = w, hook
        self.gathered = [dist.Replicate(), *w.placements[1:]]
        self.partial = [dist.Partial() if like.placements[0].is_shard() else dist.Replicate(), *w.placements[1:]]

    def whole(self):
        import paddle
        import paddle.distributed as dist
        from paddle.distributed.auto_parallel.api import dtensor_to_local

        with paddle.no_grad():
            return dtensor_to_local(dist.reshard(self.w, self.w.process_mesh, self.gathered), self.w.process_mesh,
                                    self.gathered)

    def shard_grad(self, dw):
        import paddle
        import paddle.distributed as dist
        from paddle.distributed.auto_parallel.api import dtensor_from_local

        mesh = self.w.process_mesh
        with paddle.no_grad():
            g = dtensor_from_local(dw, mesh, self.partial)
            g = dist.reshard(to_replicated(g) if self.hook else g, mesh, self.w.placements)
            return _local(g)


def _weight_for(w, like, hook: bool):
    """A weight the kernel reads whole, as its local input: Partial where `like` is sharded."""
    import paddle.distributed as dist
    from paddle.distributed.auto_parallel.api import dtensor_to_local

    if any(p.is_shard() for p in w.placements):
        w = _replicate_grad(dist.reshard(w, w.process_mesh, [dist.Replicate() for _ in w.placements]), hook)
    placements = [dist.Partial() if p.is_shard() else dist.Replicate() for p in like.placements]
    return dtensor_to_local(w, w.process_mesh, placements)


def _on_pieces(op, roles: str, like, hook: bool):
    """`op` on this rank's local pieces. `roles` says what each argument is: "p" a distributed activation (made
    non-Partial, its local value passed), "w" a weight the kernel reads whole (`_weight_for` the first argument),
    "t" a table without gradient (its local value), "-" anything else (passed as is). The result is declared
    with the placements of argument `like` (a tuple of results: of each argument in the tuple `like`). Dense
    inputs go to `op` unchanged (generation, evaluation after gathering)."""

    def local_op(*args):
        if not args[0].is_dist():
            return op(*args)
        args = [_no_partial(a) if r == "p" else a for a, r in zip(args, roles)]
        local = [_local(a) if r == "p" else _weight_for(a, args[0], hook) if r == "w"
                 else a._local_value() if r == "t" and a.is_dist() else a for a, r in zip(args, roles)]
        out = op(*local)
        # a kernel may return views (the RoPE kernels' q and k): a DistTensor made from a view's strides is read
        # wrongly by the next Paddle op's rule (MLA's concat of the RoPE part took half the rows), so each is made
        # contiguous first (a no-op for a contiguous one)
        if isinstance(like, tuple):
            return tuple(_dist(o.contiguous(), args[i]) for o, i in zip(out, like))
        return _dist(out.contiguous(), args[like])

    return local_op


def _same_graph(grouped_mlp):
    """The experts' grouped kernel with one graph on every rank (`moe_layouts.LocalDispatch` runs it on each rank's
    own tokens): the CPU choice between padded GEMMs and per-expert segments follows the local counts, and the
    segments skip an expert without rows, so ranks would build different backward graphs. Their weights' Partial
    gradients are all-reduced by hooks as backward reaches them (`to_replicated`), so a different order (or a
    missing gradient) pairs different tensors in one collective (gloo: "op.preamble.length <= op.nbytes"), and
    under ZeRO-3 each expert's gathers run where its GEMM reads it (`ZeroGather`), so a rank that skipped one would
    hang the others. The padded path uses every expert's weights in the same ops whatever the counts; so does the
    GPU's grouped GEMM, whose fp16 runs (no fp16 kernel) take the padded path here instead of the CPU's choice."""
    import functools

    from pretrain_cli.ops.grouped import grouped_mlp_cpu, grouped_mlp_gpu, grouped_mlp_padded

    if grouped_mlp is grouped_mlp_gpu:
        return functools.partial(grouped_mlp_gpu, fp16_path=grouped_mlp_padded)
    return grouped_mlp_padded if grouped_mlp is grouped_mlp_cpu else grouped_mlp


class _RankPieces:
    """`PackedGemm`'s packing on distributed tensors: gate and up side by side per rank, `[hidden, 2·inter/tp]` laid
    out [g_r | u_r], declared with gate's placements; the backward's two products as Paddle's distributed matmuls
    (`_C_ops.matmul_grad` refuses distributed tensors: "The output tensor is nullptr"); the packed gradient made
    non-Partial in gate's placements and cut back into each weight's own."""

    @staticmethod
    def pack(ws):
        import paddle

        return _dist(paddle.concat([_local(w) for w in ws], axis=-1), ws[0])  # [hidden, 2*inter]

    @staticmethod
    def products(x, w, dy):
        import paddle

        dx = paddle.matmul(dy, w, transpose_y=True)  # x's shape
        dw = paddle.matmul(x.reshape([-1, x.shape[-1]]), dy.reshape([-1, dy.shape[-1]]), transpose_x=True)
        return dx, dw  # [hidden, 2*inter]

    @staticmethod
    def unpack(dw, ws):
        import paddle
        import paddle.distributed as dist

        if list(dw.placements) != list(ws[0].placements):
            dw = dist.reshard(dw, dw.process_mesh, ws[0].placements)
        pieces = paddle.split(_local(dw), [_local(w).shape[-1] for w in ws], axis=-1)
        return [_dist(p.contiguous(), w) for p, w in zip(pieces, ws)]


def localize(k, hook: bool):
    """`k` (an `ops.kernels.Kernels`) with every op running on local pieces of distributed tensors (`_on_pieces`;
    the three that need more than that below), and `whole_weight` gathering a weight ZeRO-3 keeps in pieces.

    The embedding lookup's SPMD rule refuses ZeRO-3's [Shard on dp, Shard(0) on mp when vocab-split] embedding
    next to batch-sharded ids, and a tied LM head's implicit gather of it would get a reduce-scatter backward
    (no CPU kernel): both read the dp-gathered weight (`gather_zero`), as the fused head + loss does, so a tied
    weight's gradients arrive with one placement.
    """
    ce, lce = k.cross_entropy, k.linear_cross_entropy

    def gate_up(x, gate_w, up_w, gate_b=None, up_b=None):
        """Each rank concatenates its own gate and up pieces, `[hidden, 2·inter/tp]` laid out [g_r | u_r],
        declared with gate's placements; so `swiglu_packed` sees this rank's halves. One GEMM that keeps x and
        the two weights for backward, not the concatenation (`ops.grouped_gemm_layer.PackedGemm`). Not under
        ZeRO-3: there the weights it would keep are the gathered copies, as many bytes as the concatenation (O1:
        fp32 against its half cast), so the matmul keeps the concatenation as before."""
        import paddle

        if not gate_w.is_dist():
            return k.gate_up(x, gate_w, up_w, gate_b, up_b)
        from pretrain_cli.ops.grouped_gemm_layer import packed_gemm

        g, u = gather_zero(gate_w, hook), gather_zero(up_w, hook)
        if g is gate_w and u is up_w:
            out = packed_gemm(x, g, u, packing=_RankPieces)  # [bsz, seq_len, 2*inter], per rank [g_r | u_r]
        else:
            out = paddle.matmul(x, _RankPieces.pack([g, u]))  # the same, keeping the gathered [hidden, 2*inter]
        if gate_b is not None:
            gb, ub = gather_zero(gate_b, hook), gather_zero(up_b, hook)
            out = out + _dist(paddle.concat([_local(gb), _local(ub)]), gb)  # [2*inter]
        return out

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
        k, rms_norm=_on_pieces(k.rms_norm, "pw-", 0, hook),
        add_rms_norm=None,  # the residual add on the distributed tensors, then the norm above on pieces
        # also for Paddle's reference RoPE: its [s, b*h, d] merge would co-shard batch and heads
        rope=_on_pieces(k.rope, "ppttp", (0, 1), hook),
        attention=_on_pieces(k.attention, "ppp", 0, hook),
        attention_cached=_on_pieces(k.attention_cached, "ppp", 0, hook),
        attention_document=_on_pieces(k.attention_document, "pppp", 0, hook),
        swiglu=_on_pieces(k.swiglu, "pp", 0, hook), swiglu_packed=_on_pieces(k.swiglu_packed, "p", 0, hook),
        gate_up=gate_up, mlp_in=None,  # the gate|up GEMM above, then `swiglu_packed` on pieces
        attn_in=None,  # the Linears on the distributed tensors, then `rope` above on pieces
        linear_residual=None,  # the down projection and the residual add on the distributed tensors
        linear_add_rms_norm=None,  # o_proj and the residual add likewise, then the norm above on pieces
        embedding=embedding_reference,  # Paddle's lookup on the distributed ids and the gathered weight
        cross_entropy=cross_entropy, grouped_mlp=_same_graph(k.grouped_mlp),
        linear_cross_entropy=linear_cross_entropy if lce is not None else None,
        whole_weight=lambda w: gather_zero(w, hook))
