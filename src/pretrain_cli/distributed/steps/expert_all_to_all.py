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
2. this rank's assignments per expert counted on the device (`index_add` of ones: a GPU `bincount` copies its
   input's max to the host to size its output, a host sync each call), the counts of every rank all-gathered
   (`[ep, experts]` int64) and read on the host once: the one host sync of the dispatch, as torchtitan's (an
   all-to-all of the counts, one blocking copy) and Megatron-Core's (one sync point). From that matrix come the
   all-to-all's split sizes (row j: what rank j sends each rank, its experts' counts summed by holder) and the rows
   each held expert receives (its column summed over the senders), which the grouped GEMM needs as host ints;
3. the rows (`AllToAll`: its backward is the reverse all-to-all) and their expert indices (no gradient) sent;
   under autocast (a GPU run at O1, where the norm before the experts hands them fp32 rows) the rows go as
   autocast's half dtype, the dtype the experts compute in (`ops.grouped.grouped_mlp_gpu`) and the one `plan`
   charges the dispatch at: half the bytes, and the same values, as the experts cast them anyway;
4. the received rows sorted by held expert (stable: by sender, then its order), the held experts run once over them
   (under tensor parallelism their slices, `GatherDispatch.compute`), and put back in the received order;
5. the outputs sent back (`AllToAll` with the transposed matrix; half under autocast, as they left the experts),
   returned to x's dtype, weighted by the combine weights and summed into their tokens here.

Every rank runs the same collectives in the same order whatever it receives: a rank that gets no row still sends
and receives (zero rows), and its experts take part (`Experts.idle`). Dropless only.
"""
from __future__ import annotations

from paddle.autograd import PyLayer  # imported lazily, after the environment

from pretrain_cli.distributed.steps.expert_parallel import GatherDispatch
from pretrain_cli.ops.grouped import autocast_half


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
        mine = paddle.index_add(paddle.zeros([num_experts], dtype="int64"), flat, 0,
                                paddle.ones_like(flat))  # [experts]: this rank's assignments per expert, on the device
        every = self.backend.all_gather(mine.unsqueeze(0), self.group, axis=0).numpy()  # [ep, experts]: the one sync
        per = num_experts // self.ep  # experts a rank holds
        matrix = every.reshape([self.ep, self.ep, per]).sum(-1).tolist()  # [ep][ep]: row j, what rank j sends each rank
        host_counts = every[:, experts.first:experts.first + experts.count].sum(0).tolist()  # [held]: rows received
        order = paddle.argsort(flat, stable=True)  # [tokens·top_k]: by expert, so by the rank holding it
        sent = paddle.gather(x, order // top_k)  # [tokens·top_k, hidden]
        half = autocast_half()
        if half is not None and sent.dtype != half:  # O1: the experts compute in half (module docstring, 3.)
            sent = sent.astype(half)
        rows = AllToAll.apply(sent, self, matrix)  # [received, hidden]
        ids = self.backend.all_to_all_single(paddle.gather(flat, order), matrix, self.me, self.group)  # [received]
        local = ids - experts.first  # the held expert of each received row
        if rows.shape[0]:
            by_expert = paddle.argsort(local, stable=True)  # [received]
            done = self.compute(experts)(paddle.gather(rows, by_expert), host_counts)  # [received, hidden]
            done = paddle.gather(done, paddle.argsort(by_expert))  # [received, hidden]: the received order
            idle = None
        else:  # nothing came: the (empty) rows and the experts still take part, so backward runs the same collectives
            done, idle = rows * 1.0, experts.idle([0] * experts.count)
        back = AllToAll.apply(done, self, [list(col) for col in zip(*matrix)])  # [tokens·top_k, hidden]
        back = back.astype(x.dtype)  # (O1: the half rows back to fp32 before the fp32 combine, as before)
        w = paddle.gather(routing.weights.reshape([-1]), order).astype(back.dtype).unsqueeze(-1)  # [tokens·top_k, 1]
        out = paddle.index_add(paddle.zeros_like(x), order // top_k, 0, back * w)  # [tokens, hidden]
        if idle is not None:
            out = out + (idle + 0.0 * rows.sum()).astype(out.dtype)
        return out, mine.astype("float32"), paddle.zeros([], dtype="float32")
