"""Context parallelism (`context_parallel_degree: C`): every sequence split over C ranks, attention across them.

**The split.** A sequence of S tokens is cut into 2C chunks of c = S / 2C; cp rank r holds chunks r and
2C−1−r (the load-balanced causal split of Megatron and torchtitan): under a causal mask a late chunk attends
to many keys and an early one to few, so pairing them gives every rank the same work. Every per-token
field of the batch (ids, labels, `position_ids`, `doc_start`) is cut the same way (`shard_batch`).

**Attention** is a ring (torchtitan's and ring-flash-attention's schedule): in C steps each rank holds the
K/V block of cp rank (r − i) mod C, runs its queries against the chunks of it they may see, one (query chunk,
key chunk) block at a time through `kernels.attention_block` (flash attention's per-block output and
log-sum-exp on GPU, Paddle's ops elsewhere; `ops.block_attention`), merges by log-sum-exp (online softmax)
and passes the block to the next rank (`distributed.comms.ring`: overlapped `batch_isend_irecv` on GPU, blocking
send/recv over per-edge groups on gloo). Key chunks after the query chunk are not computed; the diagonal
block is causal; document masking adds `doc_start ≤ key position` to every block; queries go in tiles of
`ROW_TILE` rows, so a block's scores are at most `[b, heads, ROW_TILE, c]` (a diagonal tile is a square causal
block and a full block of the keys before it: `_tiles`). A rank holds two K/V blocks at
most (the one computed, the one arriving), never the whole sequence's. The backward recomputes each block
from the final output and log-sum-exp and runs the ring again, each K/V block travelling with its fp32 dK/dV
accumulator, which after C passes is back with the block's owner: C − 1 K/V and C dK/dV exchanges of one
rank's block each, no collective over the whole sequence.

**Positions.** RoPE uses each token's global position (`position_ids`, supplied when the batch has none),
so the table is built for the whole sequence (`WholeSequenceRotary`); `doc_start` holds global positions.

**Loss and gradients.** The loss is the token-count-weighted mean over the whole sequence: each rank's sum
is divided by its cp group's total count. Weights are whole on every rank and data-parallel over the cp
group too: `paddle.DataParallel` over every rank averages gradients over dp × cp, so each rank's loss is
scaled by C. The model stays single-device: it is built with the ring as its attention kernels and a RoPE table
spanning the whole sequence (`context_kernels`, the `cp` step of `distributed.steps.order`); the strategy's
`ContextSide` cuts the batch and wraps the model in `ContextModel` (positions in, whole-sequence loss out) inside
whatever the data side is: `DataParallel`, fleet's ZeRO-1 over the cp × sharding ranks, or tensor parallelism.

**Mixture-of-Experts.** The router and the experts are per token: each rank routes its own chunks. The router
losses' sums over a sequence's or a micro-batch's tokens are the cp group's (`context_sums.SequenceSums`, the kernel
table's `sequence_sums`), so every cp rank forms one process's balance and z losses and its part of their gradient.

**Multi-token prediction** (DeepSeek-V3, `models.mtp`): each depth reads the token after each position, which for a
chunk's last one is on another rank: the kernel table's `next_tokens` (`steps.context_shift`) gives each rank its
chunks of the whole sequence's shift. The module's attention is the ring, its RoPE the whole sequence's; each
depth's mean loss is over the cp group's counted tokens (`context_sums.SequenceSums`), as one process's over the
whole sequence.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import paddle  # imported after the environment: the layout steps, the strategies and tests import this lazily
import paddle.nn as nn

from pretrain_cli.ops.block_attention import ROW_TILE, block_backward, merge


_RINGS: dict = {}  # (parallel, edges) -> RingExchange: every group is made once per process (`new_group` order)


def cp_group(parallel, backend=None):
    """This rank's `RingExchange` (its `group`, `ranks` and neighbours) in its context-parallel group: the
    topology's "cp" axis (`distributed.layout.topology`: the cp ranks of one data rank are neighbours); `backend`: the
    run's collectives (`distributed.comms.collectives`; default gloo's, whose exchange is `distributed.comms.ring`'s
    per-edge groups). Made once per process: the kernels (built again for a rollback) and the strategy share it."""
    from pretrain_cli.distributed.comms.collectives import for_device
    from pretrain_cli.distributed.comms.ring import ring_groups
    from pretrain_cli.distributed.layout.topology import Topology

    backend = backend or for_device("cpu")
    key = (parallel, backend)
    if key not in _RINGS:
        _RINGS[key] = ring_groups([list(r) for r in Topology.of(parallel).groups("cp")], parallel.rank, backend)[2]
    return _RINGS[key]


def chunks_of(cp: int, cp_rank: int) -> tuple[int, int]:
    """The two of the 2·cp sequence chunks a cp rank holds (load-balanced causal split)."""
    return cp_rank, 2 * cp - 1 - cp_rank


def local_positions(seq_len: int, cp: int, cp_rank: int) -> np.ndarray:
    """int64 `[seq_len / cp]`: the global positions of the tokens a cp rank holds, in its order."""
    c = seq_len // (2 * cp)
    return np.concatenate([np.arange(i * c, (i + 1) * c) for i in chunks_of(cp, cp_rank)]).astype(np.int64)


def shard_sequence(tensor, cp: int, cp_rank: int):
    """`[bsz, seq_len, ...]` → this cp rank's `[bsz, seq_len / cp, ...]`: its two chunks, concatenated."""
    import paddle

    c = tensor.shape[1] // (2 * cp)
    return paddle.concat([tensor[:, i * c:(i + 1) * c] for i in chunks_of(cp, cp_rank)], axis=1)  # [bsz, 2c, ...]


def _blocks(cp: int, cp_rank: int, c: int, doc_start):
    """For each of this rank's two query chunks: the (rank, half, visible, causal, diagonal) key blocks it attends
    to. `visible` None: every key; else a bool mask `[bsz|1, 1, 1, c, c]`; `causal`: it is the plain diagonal."""
    import paddle

    tri = paddle.tril(paddle.ones([c, c], dtype="bool")).reshape([1, 1, 1, c, c])  # [1, 1, 1, c, c]
    plan = []
    for slot, qc in enumerate(chunks_of(cp, cp_rank)):
        doc = None
        if doc_start is not None:
            doc = doc_start[:, slot * c:(slot + 1) * c].reshape([-1, 1, 1, c, 1])  # [bsz, 1, 1, c, 1]
        blocks = []
        for j in range(cp):
            for half, kc in enumerate(chunks_of(cp, j)):
                if kc > qc:
                    continue  # every key after every query: nothing visible
                visible = tri if kc == qc else None
                if doc is not None:
                    kpos = paddle.arange(kc * c, (kc + 1) * c, dtype="int64").reshape([1, 1, 1, 1, c])
                    in_doc = kpos >= doc  # [bsz, 1, 1, c, c]
                    visible = in_doc if visible is None else paddle.logical_and(in_doc, visible)
                blocks.append((j, half, visible, kc == qc and doc is None, kc == qc))
        plan.append(blocks)
    return plan


def _tiles(blocks, c: int, tile: int):
    """The query rows of one chunk in tiles of at most `tile` (`ROW_TILE`: one block's scores stay
    `[b, heads, tile, c]`), each with its blocks as (rank, half, k0, k1, visible, causal): keys [k0, k1) of that
    block. On the diagonal a tile [r0, r1) sees keys [0, r1), cut in two: keys [0, r0), all before every row
    (a full block), and keys [r0, r1), the square causal diagonal; the two merge by log-sum-exp like any blocks.
    A non-square causal block is never made: Paddle's flash attention aligns that mask top-left (query i sees keys
    0..i: flash_fwd_kernel.h of PaddlePaddle/flash-attention, `n_block_max` from `m_block`, no seqlen_k − seqlen_q
    offset), and `F.scaled_dot_product_attention` refuses flash for it (nn/functional/sdpa.py 3.3.1,
    `check_flash_causal_non_square_seqlens`)."""
    for r0 in range(0, c, tile):
        r1 = min(c, r0 + tile)
        tiled = []
        for j, half, visible, causal, diagonal in blocks:
            rows = None if visible is None else visible[:, :, :, r0:r1]  # [bsz|1, 1, 1, rows, c]
            if not diagonal:
                tiled.append((j, half, 0, c, rows, causal))
                continue
            if r0 > 0:  # the keys before the tile's first row: every row sees them (but for document bounds)
                tiled.append((j, half, 0, r0, None if rows is None or causal else rows[..., :r0], False))
            tiled.append((j, half, r0, r1, rows[..., r0:r1], causal))
        yield r0, r1, tiled


def _heads(x, n_kv: int):
    """`[bsz, len, heads, d]` → `[bsz, n_kv, heads / n_kv, len, d]` (GQA by broadcasting)."""
    bsz, length, heads, d = x.shape
    return x.transpose([0, 2, 1, 3]).reshape([bsz, n_kv, heads // n_kv, length, d])  # [bsz, n_kv, rep, len, d]


class _Ring:
    """What one context-parallel attention call needs besides q, k, v: the neighbour exchange, this rank's place,
    the block kernel, and (document masking) `doc_start`."""

    def __init__(self, exchange, cp: int, cp_rank: int, block, doc_start=None, tile: int = ROW_TILE):
        self.exchange, self.cp, self.cp_rank, self.block, self.doc_start = exchange, cp, cp_rank, block, doc_start
        self.tile = tile

    def steps(self, plan: list, c: int):
        """Per ring step i: (j, the rank whose K/V block this rank holds then, [(slot, tile index, r0, r1, that
        block's (half, k0, k1, visible, causal) entries)]); step i holds rank (cp_rank − i) mod C's block."""
        tiles = [list(_tiles(blocks, c, self.tile)) for blocks in plan]
        for i in range(self.cp):
            j = (self.cp_rank - i) % self.cp
            work = [(slot, t, r0, r1, [e[1:] for e in tiled if e[0] == j])
                    for slot, per_slot in enumerate(tiles) for t, (r0, r1, tiled) in enumerate(per_slot)]
            yield i, j, [w for w in work if w[4]]  # blocks the causal mask hides entirely are not computed


class RingAttention(paddle.autograd.PyLayer):
    """q `[bsz, 2c, n_heads, d]`, k/v `[bsz, 2c, n_kv, d]` (this rank's chunks) → out like q. C ring steps:
    at step i this rank holds the K/V block of cp rank (r − i) mod C (two blocks at most: the one computed
    and the one arriving), runs its queries against it and merges by log-sum-exp."""

    @staticmethod
    def forward(ctx, q, k, v, ring):
        with paddle.no_grad():
            return RingAttention._forward(ctx, q, k, v, ring)

    @staticmethod
    def _forward(ctx, q, k, v, ring):
        n_kv, c = k.shape[2], q.shape[1] // 2
        qh = _heads(q, n_kv)  # [bsz, n_kv, rep, 2c, d]
        kv = paddle.stack([_heads(k, n_kv), _heads(v, n_kv)])  # [2, bsz, n_kv, 1, 2c, d]: this rank's block
        plan = _blocks(ring.cp, ring.cp_rank, c, ring.doc_start)
        acc: dict = {}  # (slot, tile) -> (out, lse) merged over the blocks seen so far
        for i, j, work in ring.steps(plan, c):
            pending = ring.exchange.start(kv) if i < ring.cp - 1 else None  # the next block, during compute
            for slot, t, r0, r1, entries in work:
                qs = qh[:, :, :, slot * c + r0:slot * c + r1]  # [bsz, n_kv, rep, rows, d]
                out, lse = acc.get((slot, t), (None, None))
                for half, k0, k1, visible, causal in entries:
                    kb = kv[0, :, :, :, half * c + k0:half * c + k1]  # [bsz, n_kv, 1, k1 - k0, d]
                    vb = kv[1, :, :, :, half * c + k0:half * c + k1]  # [bsz, n_kv, 1, k1 - k0, d]
                    out, lse = merge(out, lse, *ring.block(qs, kb, vb, visible, causal))
                acc[(slot, t)] = (out, lse)
            if pending is not None:
                kv = pending.wait()
        keys = sorted(acc)  # (slot, tile) in sequence order: every tile sees its own diagonal, so none is missing
        outs = paddle.concat([acc[key][0] for key in keys], axis=3)  # [bsz, n_kv, rep, 2c, d]
        lses = paddle.concat([acc[key][1] for key in keys], axis=3)  # [bsz, n_kv, rep, 2c, 1]
        ctx.saved = (qh, k, v, outs, lses, plan, ring, q.shape)
        return outs.reshape([q.shape[0], q.shape[2], 2 * c, q.shape[3]]).transpose([0, 2, 1, 3])  # like q

    @staticmethod
    def backward(ctx, dout):
        """The ring again, each K/V block travelling with its dK/dV accumulator (fp32): at step i this rank adds
        its queries' share to the block it holds, then passes both on; after C steps every accumulator is
        back with its owner, so no rank ever holds the whole sequence's dK/dV."""
        qh, k, v, outs, lses, plan, ring, q_shape = ctx.saved
        n_kv, c = k.shape[2], q_shape[1] // 2
        doh = _heads(dout, n_kv)  # [bsz, n_kv, rep, 2c, d]
        kv = paddle.stack([_heads(k, n_kv), _heads(v, n_kv)])  # [2, bsz, n_kv, 1, 2c, d]
        dkv = paddle.zeros(kv.shape, dtype="float32")  # [2, bsz, n_kv, 1, 2c, d]: the held block's dK, dV
        dqs: dict = {}
        for i, j, work in ring.steps(plan, c):
            pending = ring.exchange.start(kv) if i < ring.cp - 1 else None
            parts = [[], []]  # per half of the held block: its (dk, dv) shares, [bsz, n_kv, 1, c, d] each
            for slot, t, r0, r1, entries in work:
                rows = slice(slot * c + r0, slot * c + r1)
                qs, dos = qh[:, :, :, rows], doh[:, :, :, rows]  # [bsz, n_kv, rep, rows, d] each
                out, lse = outs[:, :, :, rows], lses[:, :, :, rows]
                for half, k0, k1, visible, _ in entries:
                    kb = kv[0, :, :, :, half * c + k0:half * c + k1]  # [bsz, n_kv, 1, k1 - k0, d]
                    vb = kv[1, :, :, :, half * c + k0:half * c + k1]  # [bsz, n_kv, 1, k1 - k0, d]
                    g_q, g_k, g_v = block_backward(qs, kb, vb, out, lse, dos, visible)
                    dqs[(slot, t)] = g_q if (slot, t) not in dqs else dqs[(slot, t)] + g_q
                    g = paddle.stack([g_k, g_v]).astype("float32")  # [2, bsz, n_kv, 1, k1 - k0, d]
                    if k1 - k0 < c:  # a piece of a diagonal tile: keys [k0, k1) of the chunk, zeros around
                        pad = [paddle.zeros([*g.shape[:-2], n, g.shape[-1]], g.dtype) for n in (k0, c - k1)]
                        g = paddle.concat([p for p in (pad[0], g, pad[1]) if p.shape[-2]], -2)
                    parts[half].append(g)  # [2, bsz, n_kv, 1, c, d]
            if parts[0] or parts[1]:
                zero = paddle.zeros([*dkv.shape[:-2], c, dkv.shape[-1]], "float32")  # [2, bsz, n_kv, 1, c, d]
                dkv = dkv + paddle.concat([paddle.add_n(p) if p else zero for p in parts], axis=-2)
            dkv = ring.exchange.start(dkv).wait()  # after C passes: this rank's own block's dK/dV
            if pending is not None:
                kv = pending.wait()
        bsz, _, n_heads, d = q_shape

        def back(x, heads):  # [bsz, n_kv, heads / n_kv, 2c, d] → [bsz, 2c, heads, d]
            return x.reshape([bsz, heads, 2 * c, d]).transpose([0, 2, 1, 3])

        dq = back(paddle.concat([dqs[key] for key in sorted(dqs)], axis=3), n_heads)
        return dq, back(dkv[0].astype(k.dtype), n_kv), back(dkv[1].astype(v.dtype), n_kv)


def context_attention(exchange, cp: int, cp_rank: int, block, tile: int = ROW_TILE):
    """(causal, document-masked) attention functions over the cp ring (`exchange`: `cp_group`'s), for
    `kernels.attention` / `kernels.attention_document`; `tile`: query rows per block (tests pass a small one)."""

    def causal(q, k, v):
        return RingAttention.apply(q, k, v, _Ring(exchange, cp, cp_rank, block, tile=tile))

    def document(q, k, v, doc_start):
        return RingAttention.apply(q, k, v, _Ring(exchange, cp, cp_rank, block, doc_start, tile))

    return causal, document


def context_kernels(kernels, parallel, backend):
    """The `cp` layout step's build side (`distributed.steps.order`): the kernel table with the ring attention over this
    rank's cp group for both the causal and the document-masked call, a RoPE table spanning the whole sequence
    (`rope_span`: a rank's tokens sit anywhere in it), the sums over the cp group's tokens (`sequence_sums`) and
    multi-token prediction's next tokens across the chunks (`next_tokens`). Chosen before the model exists: no live
    layer changes."""
    from pretrain_cli.distributed.layout.topology import Topology
    from pretrain_cli.distributed.steps.context_shift import NextTokens
    from pretrain_cli.distributed.steps.context_sums import SequenceSums

    cp, cp_rank = parallel.cp_degree, Topology.of(parallel).coord("cp")
    exchange = cp_group(parallel, backend)
    causal, document = context_attention(exchange, cp, cp_rank, kernels.attention_block)
    name = f"context({kernels.attention_block_name} blocks)"
    return replace(kernels, attention=causal, attention_document=document, attention_name=name,
                   attention_document_name=name, rope_span=cp, sequence_sums=SequenceSums(cp, exchange.group),
                   next_tokens=NextTokens(cp, cp_rank, exchange, local_positions))


class ContextModel(nn.Layer):
    """The model on this rank's chunks (`side`: its `ContextSide`): global RoPE positions in; with labels, (sum of
    token losses × C, the cp group's token count) out, so the step's mean is the whole sequence's, scaled for
    DataParallel."""

    def __init__(self, model, side):
        super().__init__()
        self.model, self._side = model, [side]  # (a list: the side is not a sublayer)

    def forward(self, input_ids, cache=None, position_ids=None, doc_start=None, labels=None):
        side = self._side[0]
        if position_ids is None:
            position_ids = side.positions(*input_ids.shape)
        out = self.model(input_ids, position_ids=position_ids, doc_start=doc_start, labels=labels)
        return out if labels is None else side.whole_sequence(*out)


class ContextSide:
    """What context parallelism adds to any strategy besides its kernels (`context_kernels`): each batch cut into
    this rank's chunks (`shard`), the model called with global positions and returning the whole sequence's
    loss (`wrap`), and the step's loss read back over the cp group (`to_host`). Weights are whole across the cp
    ranks, so the strategy averages gradients over them as over data ranks."""

    def __init__(self, parallel, backend):
        from pretrain_cli.distributed.layout.topology import Topology

        self.cp, self.cp_rank = parallel.cp_degree, Topology.of(parallel).coord("cp")
        self.group = cp_group(parallel, backend).group
        self.name = (f"context parallel (load-balanced chunks, ring attention): {parallel.axes()}"
                     f"{parallel.fleet_sharding()}{parallel.expert_axis()}")  # check's words

        self._positions: dict = {}

    def wrap(self, model):
        return ContextModel(model, self)

    def positions(self, bsz: int, length: int):
        """int64 `[bsz, length]`: the global positions of this rank's tokens (a batch without `position_ids`)."""
        import paddle

        if (bsz, length) not in self._positions:
            pos = local_positions(length * self.cp, self.cp, self.cp_rank)  # [length]
            self._positions[(bsz, length)] = paddle.to_tensor(np.tile(pos, (bsz, 1)))  # [bsz, length] int64
        return self._positions[(bsz, length)]

    def whole_sequence(self, total, count):
        """(this rank's loss sum × C, the cp group's token count): their ratio averaged over the cp ranks (as
        gradients are) is the whole sequence's mean loss."""
        import paddle.distributed as dist

        count = count.detach().clone()
        dist.all_reduce(count, group=self.group)
        return total * self.cp, count

    def shard(self, tensor):
        return shard_sequence(tensor, self.cp, self.cp_rank)

    def to_host(self, tensor):
        """Each rank's loss is its share × C (see `ContextModel`): the sum over the cp group / C is the global."""
        import paddle.distributed as dist

        t = tensor.detach().clone()
        dist.all_reduce(t, group=self.group)
        return t / self.cp
