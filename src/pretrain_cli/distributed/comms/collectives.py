"""The one collectives backend of a run: NCCL on GPU, gloo on CPU, chosen once (`for_device`) from the run's device.

Engine code asks this object for what differs between the two and never tests the device itself. Everything gloo
lacks or gets wrong in Paddle 3.3.1 (ARCHITECTURE.md facts: gloo; docs/DISTRIBUTED.md, "What CPU verifies") is
answered here, so when Paddle's gloo is fixed the workarounds go in one place:

| what | NCCL | gloo |
|---|---|---|
| `reduce_scatter` | `dist.reduce_scatter` | `all_reduce`, then this rank's slice (tp times the bytes) |
| a new group | `dist.new_group` | the same, each group with a TCP store of its own (`stores`: `gloo.separate_stores`) |
| ring neighbour exchange | `batch_isend_irecv` on the group | blocking send/recv over a two-rank group per directed edge (`ring_edges`) |
| fleet's pipeline sends | batched, partial | unbatched, whole, over two-rank groups per stage pair (`pipeline_flags`, `neighbour_sends`) |
| sharded (semi-auto) gradients | Partial → Shard by reduce-scatter | all-reduced whole (`gradient_hook`: `to_replicated`) |
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
        """fleet's pipeline settings for this backend: on gloo whole activations (no partial send kernel) and
        unbatched sends (`hybrid`: the strategy's `hybrid_configs`, whose `pp_configs` it sets)."""
        hybrid["pp_configs"].use_batch_p2p_comm = not self.gloo
        return dict(configs, **({"enable_partial_send_recv": False} if self.gloo else {}))

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
