"""Context parallelism's sums over a sequence's tokens (the kernel table's `sequence_sums`; `context.context_kernels`
builds it): under cp a rank holds 2 of the 2C chunks of every sequence (`context.chunks_of`), so a sum over a
sequence's or a micro-batch's tokens is the cp group's. Mixture-of-Experts models' router losses and the multi-token
prediction modules' mean losses take theirs here, so every cp rank forms one process's loss and its part of the
gradient.
"""
from __future__ import annotations

import paddle  # imported after the environment: `context`, which imports this, is itself imported lazily


class SequenceSums:
    """The sums a Mixture-of-Experts model's router losses take over a sequence's (or a micro-batch's) tokens, taken
    over the cp group, whose ranks hold the other chunks of the same sequences (the kernel table's `sequence_sums`;
    `models.moe_loss.router_loss`, `models.deepseek_moe.sequence_balance_loss`). The router and the experts are per
    token, so each rank routes its own chunks; only these sums see the whole sequence. `sum` keeps the gradient
    (`_SumOverGroup`), so every cp rank forms the one-process loss and its rank's part of the gradient; `counts`
    (the expert choices' counts) has none. Every rank of a chunk holds S / C tokens of each sequence (`ranks`)."""

    def __init__(self, ranks: int, group):
        self.ranks, self.group = ranks, group

    def sum(self, tensor):
        return _SumOverGroup.apply(tensor, self.group)

    def counts(self, tensor):
        import paddle.distributed as dist

        out = tensor.detach().clone()
        dist.all_reduce(out, op=dist.ReduceOp.SUM, group=self.group)
        return out


class _SumOverGroup(paddle.autograd.PyLayer):
    """Forward: the sum over the cp group. Backward: the sum over the group of the incoming gradients (the adjoint
    of a sum every rank uses): each rank's loss is its tokens' share × C (`context.ContextModel`), and the strategy
    averages gradients over the cp ranks, so the rank's part of the gradient comes out × 1, whatever share of the
    tokens (and so of the router loss's weight) each rank holds."""

    @staticmethod
    def forward(ctx, x, group):
        import paddle.distributed as dist

        ctx.group = group
        out = x.clone()
        dist.all_reduce(out, op=dist.ReduceOp.SUM, group=group)
        return out

    @staticmethod
    def backward(ctx, dout):
        import paddle.distributed as dist

        grad = dout.clone()
        dist.all_reduce(grad, op=dist.ReduceOp.SUM, group=ctx.group)
        return grad
