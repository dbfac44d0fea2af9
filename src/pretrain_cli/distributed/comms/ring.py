"""The neighbour exchange of ring attention: every cp rank passes a tensor to the next rank of its cp group and
receives the previous rank's: C − 1 times in an attention forward, 2C − 1 in its backward (`distributed.steps.context`).

On GPU (NCCL) one `paddle.distributed.batch_isend_irecv` posts the send and the receive on the cp group and returns
at once, so the exchange of the next K/V block runs while the current block is computed (`start` … `wait`).

On CPU (gloo) that does not work, for two reasons of Paddle 3.3.1
(docs/DISTRIBUTED.md, "Context parallelism (long sequences)"): gloo's `send` returns only once the peer has
posted the matching `recv` (every rank sending first waits until "TIMEOUT … unbound_buffer.cc", measured), and a
gloo group numbers its operations (`next_tag`), so a send matches only the receive with the same number; with an
odd number of ranks in a ring, the ranks' counts over one group disagree. The CPU workaround (the collectives
backend's `ring_edges`): each directed edge r → r+1 of the ring gets a two-rank group of its own (every operation on it
is that edge's one send and one receive, so the counts agree, as `gloo.neighbour_sends` does for pipeline stages),
and even cp ranks send before they receive while odd ones receive first, so no cycle of senders waits. The
exchange is then blocking: `start` does it, `wait` returns the received tensor, and no compute overlaps it on CPU.
"""
from __future__ import annotations


class _Pending:
    """A started exchange: `wait()` → the tensor received from the previous rank."""

    def __init__(self, buffer, tasks: list):
        self.buffer, self.tasks = buffer, tasks

    def wait(self):
        for task in self.tasks:
            task.wait()
        return self.buffer


class RingExchange:
    """This rank's place in its cp ring (global ranks `ranks`, this rank at `me`) and the groups it sends over."""

    def __init__(self, group, ranks: list, me: int, edges: dict | None = None):
        self.group, self.ranks, self.me, self.edges = group, list(ranks), me, edges
        pos = self.ranks.index(me)
        self.pos, self.next, self.prev = pos, self.ranks[(pos + 1) % len(ranks)], self.ranks[pos - 1]

    def start(self, tensor) -> _Pending:
        """Send `tensor` to the next rank, receive a tensor of the same shape and dtype from the previous one."""
        import paddle
        import paddle.distributed as dist

        tensor = tensor.contiguous()  # gloo and NCCL send whole buffers: no strided views
        buffer = paddle.empty_like(tensor)
        if self.edges is None:  # GPU: posted together, waited after the block's compute
            ops = [dist.P2POp(dist.isend, tensor, self.next, self.group),
                   dist.P2POp(dist.irecv, buffer, self.prev, self.group)]
            return _Pending(buffer, dist.batch_isend_irecv(ops))  # pragma: no cover - GPU only
        out, into = self.edges[(self.me, self.next)], self.edges[(self.prev, self.me)]
        if self.pos % 2 == 0:
            dist.send(tensor, self.next, group=out)
            dist.recv(buffer, self.prev, group=into)
        else:
            dist.recv(buffer, self.prev, group=into)
            dist.send(tensor, self.next, group=out)
        return _Pending(buffer, [])


def ring_groups(rings: list, me: int, backend) -> tuple:
    """(cp group, its ranks, `RingExchange`) of this rank, `rings` being every cp group's ranks in the same order
    on every rank. Every rank creates every group (and, on gloo, every ring's edge groups), in the same order, as
    `new_group` requires, each followed by a barrier (with gloo, groups created at once fail to connect: the
    `dist.barrier()` after each below) and, on gloo, with a TCP store of its own (`backend.stores()`, the run's
    `collectives.Collectives`: else a rank may read a stale address of an earlier group and fail with "Connection
    refused", measured with 3 ranks)."""
    import paddle.distributed as dist

    def made(ranks):
        group = dist.new_group(list(ranks))
        dist.barrier()
        return group

    gloo = backend.ring_edges
    mine, edges = None, ({} if gloo else None)
    with backend.stores():
        for ranks in rings:
            group = made(ranks)
            if me in ranks:
                mine = (group, list(ranks))
        for ranks in rings if gloo else []:
            for i, a in enumerate(ranks):
                b = ranks[(i + 1) % len(ranks)]
                group = made([a, b])  # with two ranks, a → b and b → a are two groups of the same pair
                if me in (a, b):
                    edges[(a, b)] = group
    group, ranks = mine
    return group, ranks, RingExchange(group, ranks, me, edges)
