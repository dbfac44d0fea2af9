"""The one collectives backend of a run: NCCL on GPU, gloo on CPU, chosen once (`for_device`) from the run's device.

Engine code asks this object for what differs between the two and never tests the device itself. Everything gloo
lacks or gets wrong in Paddle 3.3.1 (ARCHITECTURE.md facts: gloo; docs/DISTRIBUTED.md, "What CPU verifies") is
answered here, so when Paddle's gloo is fixed the workarounds go in one place:

- `reduce_scatter`: NCCL `dist.reduce_scatter`; gloo `all_reduce`, then this rank's slice (tp times the bytes);
- `all_to_all_single` (uneven splits): NCCL `dist.alltoall_single`; gloo every rank's rows padded to the longest and
  all-gathered, then each block for this rank cut out (ep times the bytes);
- MoE token dispatch (`all_to_all_dispatch`): NCCL all-to-all (`expert_all_to_all.AllToAllDispatch`); gloo all-gather
  (`expert_parallel.GatherDispatch`): exact, and fewer bytes than the emulated all-to-all;
- a new group: NCCL `dist.new_group`; gloo the same, each group with a TCP store of its own (`stores`:
  `gloo.separate_stores`);
- ring neighbour exchange: NCCL `batch_isend_irecv` on the group; gloo blocking send/recv over a two-rank group per
  directed edge (`ring_edges`);
- fleet's pipeline sends: NCCL batched, whole under sequence parallelism, else 1/tp each; gloo unbatched, whole, over
  two-rank groups per stage pair (`pipeline_flags`, `neighbour_sends`);
- sharded (semi-auto) gradients: NCCL Partial → Shard by reduce-scatter; gloo all-reduced whole (`gradient_hook`:
  `to_replicated`).
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass


@dataclass(frozen=True)
class Collectives:
    """`gloo`: the CPU build's process groups (the workarounds on); else NCCL."""

    gloo: bool

    @property
    def name(self) -> str:
        return "gloo" if self.gloo else "nccl"

    # ------------------------------------------------------------------ groups
    def stores(self):
        """Around every `dist.new_group` / `fleet.init`: on gloo each group gets a TCP store of its own."""
        from pretrain_cli.distributed.comms.gloo import separate_stores

        return separate_stores(True) if self.gloo else contextlib.nullcontext()

    @property
    def ring_edges(self) -> bool:
        """Whether a ring exchange needs a two-rank group per directed edge (`distributed.comms.ring`)."""
        return self.gloo

    def pipeline_flags(self, configs: dict, hybrid) -> dict:
        """fleet's pipeline settings for this backend (`hybrid`: the strategy's `hybrid_configs`, whose
        `pp_configs` it sets): on gloo unbatched sends of whole activations, as gloo has no partial send kernel; on
        NCCL what `configs` asks. fleet's partial send has each tp rank send 1/tp of its activation and the
        receiver all-gather the pieces over the tp group (pp_utils/p2p_communication.py 3.3.1, whenever the
        element count divides by tp): 1/tp of the bytes, right only when every tp rank holds the same tensor, so
        `strategies.pipeline.pipeline_configs` turns it off under sequence parallelism (as PaddleNLP does)."""
        hybrid["pp_configs"].use_batch_p2p_comm = not self.gloo
        return dict(configs, enable_partial_send_recv=bool(configs.get("enable_partial_send_recv")) and not self.gloo)

    def neighbour_sends(self, hcg) -> None:
        """The pipeline group's send/recv over two-rank groups per stage pair (gloo counts tags per group)."""
        if self.gloo:
            from pretrain_cli.distributed.comms.gloo import neighbour_sends

            neighbour_sends(hcg)

    @property
    def gradient_hook(self):
        """A hook for every semi-auto parameter's gradient (None on NCCL): gloo cannot reduce-scatter a Partial
        gradient, so it is all-reduced whole."""
        if not self.gloo:
            return None
        return to_replicated

    # ------------------------------------------------------------------ collectives
    def reduce_scatter(self, x, group, parts: int, index: int, axis: int):
        """The sum of `x` over `group`, slice `index` of `parts` equal slices on `axis` kept."""
        import paddle
        import paddle.distributed as dist

        if self.gloo:
            y = x.clone()
            dist.all_reduce(y, group=group)
            return _cut(y, parts, index, axis)
        out = paddle.empty_like(_cut(x, parts, index, axis))  # pragma: no cover - GPU only
        dist.reduce_scatter(out, [t.contiguous() for t in paddle.split(x, parts, axis=axis)], group=group)
        return out  # pragma: no cover - GPU only

    def all_gather(self, x, group, axis: int):
        """`x` of every rank of `group` concatenated on `axis`, in group rank order (the same on both backends)."""
        import paddle
        import paddle.distributed as dist

        parts: list = []
        dist.all_gather(parts, x.contiguous(), group=group)  # a slice may be a strided view
        return paddle.concat(parts, axis=axis)

    @property
    def all_to_all_dispatch(self) -> bool:
        """Whether expert parallelism dispatches tokens by all-to-all (NCCL) rather than by all-gather (gloo, which
        has no all-to-all: the emulation below is for tests of the all-to-all dispatcher, not for runs)."""
        return not self.gloo

    def all_to_all_single(self, x, matrix: list[list[int]], me: int, group):
        """Rank `me`'s rows of `x` (`[sum(matrix[me]), ...]`: blocks of matrix[me][j] rows for rank j, in rank
        order) sent out, and the blocks every rank j sent here (matrix[j][me] rows each) concatenated in rank
        order. NCCL: `dist.alltoall_single` with those split sizes. gloo has none: every rank's rows padded to the
        longest and all-gathered, then each block for this rank cut out of its sender's (ep times the bytes)."""
        import paddle
        import paddle.distributed as dist

        rest = list(x.shape[1:])
        if not self.gloo:  # pragma: no cover - GPU only
            out = paddle.empty([sum(row[me] for row in matrix), *rest], dtype=x.dtype)
            dist.alltoall_single(out, x.contiguous(), in_split_sizes=list(matrix[me]),
                                 out_split_sizes=[row[me] for row in matrix], group=group)
            return out
        most = max(sum(row) for row in matrix)
        if most == 0:
            return x
        if most > x.shape[0]:
            x = paddle.concat([x, paddle.zeros([most - x.shape[0], *rest], dtype=x.dtype)])  # [most, ...]
        every = self.all_gather(x, group, axis=0)  # [ranks * most, ...]: rank j's rows from j * most
        blocks = [every[j * most + sum(row[:me]): j * most + sum(row[:me + 1])] for j, row in enumerate(matrix)
                  if row[me]]
        return paddle.concat(blocks) if blocks else x[:0]  # [sum(matrix[j][me]), ...]


def _cut(x, parts: int, index: int, axis: int):
    """Slice `index` of `parts` equal slices of `x` on `axis`."""
    import paddle

    size = x.shape[axis] // parts
    return paddle.slice(x, axes=[axis], starts=[index * size], ends=[(index + 1) * size])


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


def for_device(device: str) -> Collectives:
    """The backend of a run on `device` ("cpu": gloo; "gpu": NCCL): the one place the device is read."""
    return Collectives(gloo=not str(device).startswith("gpu"))
