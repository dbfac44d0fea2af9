"""Expert parallelism's all-to-all dispatcher (`AllToAllDispatch`): each rank sends every (token, choice) assignment
only to the rank holding its expert and gets that expert's output back, by two all-to-alls with per-rank split sizes
exchanged first — the form Megatron-Core's all-to-all token dispatcher, torchtitan and PaddleNLP's `moe_group` run
on NCCL (`dist.alltoall_single`).

Why beside `expert_parallel.GatherDispatch`: the all-gather form sends (ep − 1) × tokens × hidden per collective,
this one (ep − 1)/ep × top_k × tokens × hidden under balanced routing: ep/top_k times less above ep = top_k
(docs/DISTRIBUTED.md, "Expert parallelism"). gloo has no all-to-all, and its emulation
(`Collectives.all_to_all_single`: padded rows all-gathered, then sliced) sends more than the all-gather dispatch, so
the backend chooses: this dispatcher on NCCL, `GatherDispatch` on gloo (`Collectives.all_to_all_dispatch`); the
tests run this one over the emulation against both (tests/unit/test_expert_all_to_all.py).

Per sparse layer, with the same inputs and outputs as `GatherDispatch` and `moe.dispatch_local`:

1. this rank's assignments sorted by expert (stable); a rank holds a contiguous block of experts
   (`expert_parallel.held_range`), so they are sorted by destination rank too;
2. the rows each rank gets, all-gathered into the group's split matrix (`Collectives.split_matrix`: host ints,
   the all-to-all needs its sizes before it runs);
3. the rows (`AllToAll`: its backward is the reverse all-to-all) and their expert indices (no gradient) sent;
4. the received rows sorted by held expert (stable: by sender, then its order), the held experts run once over them
   (under tensor parallelism their slices, `GatherDispatch.compute`), and put back in the received order;
5. the outputs sent back (`AllToAll` with the transposed matrix), weighted by the combine weights and summed into
   their tokens here.

Every rank runs the same collectives in the same order whatever it receives: a rank that gets no row still sends
and receives (zero rows), and its experts take part (`Experts.idle`). Dropless only.
"""
from __future__ import annotations

from paddle.autograd import PyLayer  # imported lazily, after the environment

from pretrain_cli.distributed.steps.expert_parallel import GatherDispatch


class AllToAll(PyLayer):
    """Rows to the ranks of the split `matrix` (`Collectives.all_to_all_single` over the dispatcher `ex`'s group);
    backward, the gradients back to their senders (the transposed matrix)."""

    @staticmethod
    def forward(ctx, x, ex, matrix):
        ctx.ex, ctx.matrix = ex, matrix
        return ex.backend.all_to_all_single(x, matrix, ex.me, ex.group)  # [sum(matrix[j][me]), ...]

    @staticmethod
    def backward(ctx, dy):
        ex, back = ctx.ex, [list(col) for col in zip(*ctx.matrix)]  # rank j now sends what it received
        return ex.backend.all_to_all_single(dy, back, ex.me, ex.group)  # [sum(matrix[me]), ...]


class AllToAllDispatch(GatherDispatch):
    """`SparseMoeBlock.dispatch` over an expert group by all-to-all (module docstring): (x `[tokens, hidden]`,
    routing, the held experts, num_experts, capacity_factor) -> (output `[tokens, hidden]`, this rank's tokens'
    counts fp32 `[experts]`, dropped fp32 `[]`: 0). The group, ranks and tensor-parallel slices as
    `GatherDispatch`'s."""

    def __call__(self, x, routing, experts, num_experts: int, capacity_factor: float = 0.0):
        import paddle

        if capacity_factor > 0:
            raise ValueError("expert parallelism runs dropless (config refuses a capacity factor with it)")
        top_k = routing.indices.shape[1]
        flat = routing.indices.reshape([-1])  # [tokens·top_k]
        counts = paddle.bincount(flat, minlength=num_experts).astype("float32")  # [experts]
        order = paddle.argsort(flat, stable=True)  # [tokens·top_k]: by expert, so by the rank holding it
        per = num_experts // self.ep  # experts a rank holds
        sends = [int(n) for n in paddle.bincount(flat // per, minlength=self.ep).numpy()]
        matrix = self.backend.split_matrix(sends, self.group)  # [ep][ep]
        rows = AllToAll.apply(paddle.gather(x, order // top_k), self, matrix)  # [received, hidden]
        ids = self.backend.all_to_all_single(paddle.gather(flat, order), matrix, self.me, self.group)  # [received]
        local = ids - experts.first  # the held expert of each received row
        host_counts = [int(n) for n in paddle.bincount(local, minlength=experts.count).numpy()]
        if rows.shape[0]:
            by_expert = paddle.argsort(local, stable=True)  # [received]
            done = self.compute(experts)(paddle.gather(rows, by_expert), host_counts)  # [received, hidden]
            done = paddle.gather(done, paddle.argsort(by_expert))  # [received, hidden]: the received order
            idle = None
        else:  # nothing came: the (empty) rows and the experts still take part, so backward runs the same collectives
            done, idle = rows * 1.0, experts.idle([0] * experts.count)
        back = AllToAll.apply(done, self, [list(col) for col in zip(*matrix)])  # [tokens·top_k, hidden]
        w = paddle.gather(routing.weights.reshape([-1]), order).astype(back.dtype).unsqueeze(-1)  # [tokens·top_k, 1]
        out = paddle.index_add(paddle.zeros_like(x), order // top_k, 0, back * w)  # [tokens, hidden]
        if idle is not None:
            out = out + (idle + 0.0 * rows.sum()).astype(out.dtype)
        return out, counts, paddle.zeros([], dtype="float32")
