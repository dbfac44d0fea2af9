"""Scalar collectives and rank-0 rounds: what the loop needs to agree across processes.

`Comm` for several processes, `NoComm` for one, with the same methods, so the trainer has one code
path. Scalars are all-reduced as float64 with SUM then divided (gloo has no AVG). Rank-0-only work
(a save) never keeps the other ranks inside a gloo collective, whose hard 30 s timeout a slow save
would trip: they wait on the launcher's TCP store instead (`wait_for_rank0`, docs/DISTRIBUTED.md).
"""
from __future__ import annotations

import contextlib
import time
from pathlib import Path

from pretrain_cli import waiting
from pretrain_cli.errors import PeerFailed, UserError
from pretrain_cli.run_layout import ParallelConfig

_KEY = "pretrain_cli"
FAILED_WAIT = 30.0  # how long a rank waits for rank 0 to leave after rank 0 reported a failure


class NoComm:
    """One process: every agreement is with itself."""

    rank, world = 0, 1

    def sum(self, value: float) -> float:
        return value

    def mean(self, value: float) -> float:
        return value

    def any(self, flag: bool) -> bool:
        return flag

    def gather_object(self, obj) -> list:
        """[every rank's `obj`] in rank order (small, picklable-free values: numbers, strings, dicts)."""
        return [obj]

    def agree_on_resume(self, mine: Path | None) -> Path | None:
        return mine

    def publish(self, name: str, text: str) -> None:
        pass

    def read(self, name: str) -> str:
        return ""

    def tally(self, name: str, n: int = 0) -> int:
        return n

    def rank0_done(self, ok: bool = True) -> None:
        pass

    def wait_for_rank0(self, what: str, timeout: float | None = None) -> None:
        pass

    def wait_until_seen(self, timeout: float = 30.0) -> None:
        pass


class Comm(NoComm):
    def __init__(self, rank: int, world: int):
        self.rank, self.world = rank, world
        self._rounds = 0

    def _reduce(self, value: float, op) -> float:
        import numpy as np
        import paddle.distributed as dist

        from pretrain_cli.ops.tensors import from_numpy

        t = from_numpy(np.array([float(value)], dtype=np.float64))  # every step (`any`): to_tensor would leak
        dist.all_reduce(t, op=op)
        return float(t.numpy()[0])

    def sum(self, value: float) -> float:
        import paddle.distributed as dist

        return self._reduce(value, dist.ReduceOp.SUM)

    def mean(self, value: float) -> float:
        return self.sum(value) / self.world

    def any(self, flag: bool) -> bool:
        """All ranks stop at the same step, or none does (a stop on one rank alone would hang the rest)."""
        import paddle.distributed as dist

        return self._reduce(1.0 if flag else 0.0, dist.ReduceOp.MAX) > 0

    def gather_object(self, obj) -> list:
        import paddle.distributed as dist

        out: list = []
        dist.all_gather_object(out, obj)
        return out

    # ------------------------------------------------------------------ through the launcher's TCP store
    def _store(self):
        from paddle.base import core

        return core.create_or_get_global_tcp_store()

    def agree_on_resume(self, mine: Path | None) -> Path | None:
        """Rank 0 picks the checkpoint to resume from; the others take the same one (or fail clearly)."""
        if self.rank == 0:
            self._store().set(f"{_KEY}/resume", (str(mine) if mine is not None else "").encode())
            return mine
        chosen = bytes(self._store().get(f"{_KEY}/resume")).decode()
        if not chosen:
            return None
        path = Path(chosen)
        if not path.is_dir():
            raise UserError(f"rank {self.rank}: rank 0 resumes from {path}, which this node cannot see; put "
                            f"output_dir on a file system shared by all nodes")
        return path

    def publish(self, name: str, text: str) -> None:
        """`text` under `name` in the launcher's TCP store, for any rank to `read` (small values: a few KB)."""
        self._store().set(f"{_KEY}/{name}", text.encode())

    def read(self, name: str) -> str:
        """What a rank published under `name`, waiting until it is there (the store's own timeout bounds the wait)."""
        return bytes(self._store().get(f"{_KEY}/{name}")).decode()

    def tally(self, name: str, n: int = 0) -> int:
        """Add `n` to the counter `name` (every rank's, in the store) and return it: `tally(name)` reads it."""
        return int(self._store().add(f"{_KEY}/{name}", n))

    def rank0_done(self, ok: bool = True) -> None:
        """Rank 0: the rank-0-only work of this round (a save) is over."""
        self._rounds += 1
        self._store().add(f"{_KEY}/save/{self._rounds}", 1 if ok else -(10**6))

    def wait_for_rank0(self, what: str, timeout: float | None = None) -> None:
        """Other ranks: poll the TCP store (not a gloo collective: no 30 s limit) until rank 0 is done. When rank 0
        reports a failure this rank stays until rank 0 has left (its store gone; at most `FAILED_WAIT` s), so that
        rank 0, whose error line is the cause, is the first to end: a rank ending first is named as the cause."""
        self._rounds += 1
        key = f"{_KEY}/save/{self._rounds}"
        store, failed = self._store(), []

        def done():
            try:
                value = store.add(key, 0)
            except Exception as e:  # the store lives in rank 0's process: rank 0 is gone
                if failed:
                    raise PeerFailed(f"rank {self.rank}: rank 0 failed while {what}; see workerlog.0") from None
                why = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
                raise PeerFailed(f"rank {self.rank}: lost rank 0 while it was {what} ({why}); "
                                 f"see workerlog.0") from None
            if value < 0:
                failed.append(time.monotonic())
                if time.monotonic() - failed[0] > FAILED_WAIT:
                    raise PeerFailed(f"rank {self.rank}: rank 0 failed while {what}; see workerlog.0")
                return None
            return True if value > 0 else None

        waiting.poll(done, timeout, lambda s: UserError(f"rank {self.rank}: rank 0 has been {what} for more than "
                                                        f"{s:.0f} s; raise {waiting.TIMEOUT_ENV} if that is expected"),
                     first=0.05)
        try:
            store.add(f"{key}/seen", 1)  # rank 0 stays until every rank has seen its last round
        except Exception:  # rank 0 gave up waiting: it is done either way
            pass

    def wait_until_seen(self, timeout: float = 30.0) -> None:
        """Rank 0, before it exits: wait until every other rank has seen its last round end. The TCP store
        lives in rank 0's process, so leaving sooner cuts off a rank still sleeping between polls, which
        would then report a false 'lost rank 0'. Other ranks, and rank 0 without rounds: nothing to do."""
        if self.rank != 0 or not self._rounds:
            return
        key = f"{_KEY}/save/{self._rounds}/seen"
        store, deadline = self._store(), time.monotonic() + timeout
        while store.add(key, 0) < self.world - 1 and time.monotonic() < deadline:
            time.sleep(0.02)


def build_comm(parallel: ParallelConfig) -> NoComm:
    return Comm(parallel.rank, parallel.world_size) if parallel.distributed else NoComm()


@contextlib.contextmanager
def rank0_round(comm: NoComm):
    """Rank 0's side of `wait_for_rank0`: tell the waiting ranks it finished, or that it failed."""
    ok = False
    try:
        yield
        ok = True
    finally:
        comm.rank0_done(ok)


def sum_over_ranks(tensor):
    """A copy of `tensor` summed over every rank (no gradient): a MoE model's per-expert token counts for the
    global-batch balance loss (`models.moe_loss`, `moe_aux_loss_scope: global`) when every rank is a data rank."""
    import paddle.distributed as dist

    out = tensor.detach().clone()
    dist.all_reduce(out, op=dist.ReduceOp.SUM)
    return out


def sum_over_stage_data_ranks(tensor):
    """A copy of `tensor` summed over the data-parallel ranks of this rank's pipeline stage (fleet's "dp" then
    "sharding" groups, the latter spanning sharding × cp under context parallelism, so a cp rank's tokens count too;
    no gradient): a pipeline's counts, whose layers are this stage's alone. Its tp ranks route the same tokens and
    are not summed; the other stages count other layers."""
    import paddle.distributed as dist
    from paddle.distributed import fleet

    hcg = fleet.get_hybrid_communicate_group()
    out = tensor.detach().clone()
    for group in (hcg.get_data_parallel_group(), hcg.get_sharding_parallel_group()):
        if group.nranks > 1:
            dist.all_reduce(out, op=dist.ReduceOp.SUM, group=group)
    return out
