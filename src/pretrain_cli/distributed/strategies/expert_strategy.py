"""The data side of expert parallelism: `ExpertParallel`, a `DataParallel` whose experts are left out of
`paddle.DataParallel`'s all-reduce and reduced over the ranks holding them (`distributed.steps.expert_parallel`'s
docstring: which ranks hold which experts, the dispatch, the gradients). Apart from the `ep` step so that
`distributed.steps.order` declares that step without importing a strategy.
"""
from __future__ import annotations

from pretrain_cli.distributed.steps.expert_parallel import ExpertSide, expert_of, held_range, keep_held, sparse_blocks
from pretrain_cli.distributed.strategies.strategy import DataParallel


class ExpertParallel(DataParallel):
    """Data parallelism with the experts split over expert groups (module docstring)."""

    name = "expert parallel (experts over the data ranks, the rest paddle.DataParallel)"

    side: ExpertSide | None = None  # set by `place`

    def place(self, model, source=None):
        """Only this rank's experts are created: the others are removed first (`keep_held`), then the rest is
        created and the layout steps run (the `ep` step swaps the dispatch and makes the groups)."""
        from pretrain_cli.distributed.layout.materialize import fill

        blocks = sparse_blocks(model)
        if blocks:
            keep_held(model, held_range(blocks[0].num_experts, self.topology.ep, self.topology.expert_rank()))
        if source is not None:
            fill(model, source)
        model = self.apply_steps(model, source)
        self.side = self.placement.experts
        return model

    def sync_grads(self) -> None:
        """The experts' gradients summed over their holders and averaged over the data ranks (DataParallel's
        mean over the rest happened in backward)."""
        import paddle
        import paddle.distributed as dist

        scale = 1.0 / self.parallel.data_world_size
        with paddle.no_grad():
            for p in self.side.params:
                if p.grad is None:  # (every held expert is in the graph: `Experts.idle`; never skip a collective)
                    p.grad = paddle.zeros_like(p)
                if self.side.replicas is not None:
                    dist.all_reduce(p.grad, group=self.side.replicas)
                p.grad.scale_(scale)

    def grad_norm(self, model):
        """The global norm: the replicated parameters' squares once, the experts' summed over the expert group."""
        import paddle
        import paddle.distributed as dist

        ids = {id(p) for p in self.side.params}
        dense = [p.grad for p in self.grad_params(model) if p.grad is not None and id(p) not in ids]
        experts = [p.grad for p in self.side.params if p.grad is not None]
        sq = self.step_kernels.global_sq_norm(dense)
        esq = self.step_kernels.global_sq_norm(experts) if experts else paddle.zeros([], dtype="float32")
        esq = esq.astype("float32")
        if self.side.group is not None:
            dist.all_reduce(esq, group=self.side.group)
        return paddle.sqrt(sq.astype("float32") + esq)

    def local_box(self, tensor, name: str | None = None):
        """An expert's weights and optimizer state are whole on the ranks holding that expert (`expert_replicas`),
        every other tensor on every rank."""
        box, holders = super().local_box(tensor, name)
        if name is not None and expert_of(name) is not None:
            return box, self.topology.expert_replicas()
        return box, holders
