"""The NCCL branches of `distributed.comms.collectives.Collectives`, executed on CPU against fakes of Paddle's calls
that take their arguments as Paddle 3.3.1's own signatures bind them and do what `ProcessGroupNCCL` does with them.

`dist.alltoall_single(out, in, in_split_sizes, out_split_sizes, group, sync_op)` (distributed/communication/
all_to_all.py; the stream API under it orders the sizes the other way round, so a positional call would swap them)
reaches `ProcessGroupNCCL::AllToAll` (paddle/fluid/distributed/collective/process_group_nccl.cc): in and out
contiguous, each size list as long as the group and summing to its tensor's dim 0, block i of `in` sent to group
rank i and block j of `out` received from group rank j, in group rank order. Here rank 0 of a group of two, the
other rank's rows made up; `dist.reduce_scatter(out, list, group=...)` likewise (the sum of the pieces at this
rank's index over the group)."""
from __future__ import annotations

import inspect

import numpy as np

from pretrain_cli import runtime

paddle = runtime.import_paddle()

import paddle.distributed as dist  # noqa: E402

from pretrain_cli.distributed.comms.collectives import Collectives  # noqa: E402

GROUP = object()  # the expert group, passed through


def test_the_nccl_all_to_all_sends_and_receives_the_blocks_of_the_split_matrix(monkeypatch):
    real = inspect.signature(dist.alltoall_single)
    other = np.full((3, 4), 7.0, np.float32)  # what rank 1 sends rank 0 (matrix[1][0] = 3 rows)
    calls = []

    def alltoall_single(*args, **kwargs):
        a = real.bind(*args, **kwargs).arguments
        out, x, sends, gets = a["out_tensor"], a["in_tensor"], a["in_split_sizes"], a["out_split_sizes"]
        assert a["group"] is GROUP and a.get("sync_op", True)
        assert x.is_contiguous() and out.is_contiguous() and out.dtype == x.dtype
        assert len(sends) == len(gets) == 2 and sum(sends) == x.shape[0] and sum(gets) == out.shape[0]
        calls.append((list(sends), list(gets)))
        mine = x.numpy()[:sends[0]]  # block 0 of in: to rank 0, this rank
        paddle.assign(np.concatenate([mine, other[:gets[1]]]), output=out)  # from rank 0, then from rank 1

    monkeypatch.setattr(dist, "alltoall_single", alltoall_single)
    x = paddle.to_tensor(np.arange(12, dtype=np.float32).reshape(4, 3)).T  # [3, 4], a strided view
    assert not x.is_contiguous()  # NCCL reads raw buffers: the branch makes it contiguous
    matrix = [[2, 1], [3, 0]]  # row j: the rows rank j sends to ranks 0 and 1
    got = Collectives(gloo=False).all_to_all_single(x, matrix, 0, GROUP)
    assert calls == [([2, 1], [2, 3])]
    np.testing.assert_array_equal(got.numpy(), np.concatenate([x.numpy()[:2], other]))


def test_the_nccl_reduce_scatter_keeps_this_ranks_piece_of_the_sum(monkeypatch):
    real = inspect.signature(dist.reduce_scatter)

    def reduce_scatter(*args, **kwargs):
        a = real.bind(*args, **kwargs).arguments
        out, pieces = a["tensor"], a["tensor_list"]
        assert a["group"] is GROUP and all(p.is_contiguous() and p.shape == out.shape for p in pieces)
        paddle.assign(pieces[1].numpy() * 2, output=out)  # rank 1 of two, the other rank's piece equal to ours

    monkeypatch.setattr(dist, "reduce_scatter", reduce_scatter)
    x = paddle.to_tensor(np.arange(24, dtype=np.float32).reshape(2, 12))
    got = Collectives(gloo=False).reduce_scatter(x, GROUP, 2, 1, axis=1)  # the pieces strided on axis 1
    np.testing.assert_array_equal(got.numpy(), x.numpy()[:, 6:] * 2)
