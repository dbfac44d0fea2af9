"""The only module that knows about processes: init, wrapping a finished model, collectives.

Model code is single-device; parallelism is applied here from outside, like torchtitan's
`parallelize_fn` or nanoGPT's `DDP(model)`:

- pure data parallel: `dist.init_parallel_env()` + `paddle.DataParallel(model)`;
- `sharding: stage1` (ZeRO-1): `fleet.init(is_collective=True, strategy)` with hybrid_configs,
  `fleet.distributed_model` + `fleet.distributed_optimizer` (a `DygraphShardingOptimizer` inside);
- `sharding: stage2/3`: `paddle.distributed.sharding.group_sharded_parallel` (GPU only; on CPU
  `config.derive_parallel` refuses it before any heavy work).

Rank-0-only work (saving) never keeps the other ranks inside a gloo collective (gloo has a hard
30 s timeout): they wait on the launcher's TCP store instead (`wait_for_rank0`), see
docs/DISTRIBUTED.md.
"""
from __future__ import annotations

import contextlib
import os
import time

from pathlib import Path

from pretrain_cli.config import ParallelConfig
from pretrain_cli.errors import UserError

_KEY = "pretrain_cli"
_WATCHER = None  # pid of this rank's watcher process (start_watchdog)


def init_distributed(parallel: ParallelConfig, seed: int = 0) -> None:
    """Join the process group when launched with more than one process (gloo on CPU, NCCL on GPU)."""
    if parallel.world_size <= 1:
        return
    import paddle.distributed as dist

    try:
        if parallel.sharding_stage == 1 and parallel.sharding_degree > 1:
            from paddle.distributed import fleet

            strategy = fleet.DistributedStrategy()
            strategy.hybrid_configs = {"dp_degree": parallel.dp_degree, "mp_degree": parallel.tp_degree,
                                       "pp_degree": parallel.pp_degree, "sharding_degree": parallel.sharding_degree,
                                       "order": ["dp", "pp", "sharding", "sep", "mp"]}
            strategy.tensor_parallel_configs = {"tensor_init_seed": seed}
            fleet.init(is_collective=True, strategy=strategy)
        else:
            dist.init_parallel_env()
    except (RuntimeError, OSError) as e:
        master = os.environ.get("PADDLE_MASTER", "?")
        raise UserError(f"rank {parallel.rank}: could not join the process group of {parallel.world_size} "
                        f"processes (master {master}): {str(e).strip().splitlines()[-1] if str(e).strip() else e}; "
                        f"check that every node runs the same command, that --master is reachable and its port "
                        f"is free") from None
    if dist.get_world_size() != parallel.world_size:
        raise UserError(f"rank {parallel.rank}: the process group has {dist.get_world_size()} processes, the "
                        f"launcher said {parallel.world_size}; launch with python -m paddle.distributed.launch")


def start_watchdog(parallel: ParallelConfig, grace: float = 15.0) -> None:
    """Name a dead peer in this rank's log, and stop this rank if the launcher does not.

    When a rank dies, gloo aborts the others from C++ (`terminate called ... Connection reset by peer`)
    with no word on who died. Each rank publishes `host:pid` in the launcher's TCP store; a forked
    watcher process (no Paddle, inherited descriptors closed so it keeps no socket alive) polls the
    peers on this host every 0.1 s and writes `rank R: rank K (pid P) died` to this rank's
    stderr (workerlog.N) as soon as one is gone; if this rank is still alive `grace` seconds later
    (stuck in a collective), the watcher kills it, so the job always ends.
    """
    if parallel.world_size <= 1:
        return
    import socket
    import sys

    from paddle.base import core

    store = core.create_or_get_global_tcp_store()
    host = socket.gethostname()
    store.set(f"{_KEY}/peer/{parallel.rank}", f"{host}:{os.getpid()}".encode())
    peers = {}
    for r in range(parallel.world_size):
        if r != parallel.rank:
            h, pid = bytes(store.get(f"{_KEY}/peer/{r}")).decode().rsplit(":", 1)
            if h == host:
                peers[r] = int(pid)
    if not peers:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    parent = os.getpid()
    child = os.fork()
    if child != 0:
        global _WATCHER
        _WATCHER = child
        return
    try:  # the watcher: plain os calls only
        os.setsid()  # its own session: a launcher tearing down the job's process group must not kill it first
        os.closerange(3, 4096)
        _watch(parallel.rank, parent, peers, grace)
    finally:
        os._exit(0)


def stop_watchdog() -> None:
    """Stop this rank's watcher; every rank calls it after its last collective, before any rank may exit."""
    global _WATCHER
    if _WATCHER is None:
        return
    import signal

    with contextlib.suppress(OSError):
        os.kill(_WATCHER, signal.SIGKILL)
        os.waitpid(_WATCHER, 0)
    _WATCHER = None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"  # a zombie is dead, just not reaped yet
    except (OSError, IndexError):
        return True


def _watch(rank: int, parent: int, peers: dict, grace: float) -> None:
    import signal

    def report() -> bool:
        dead = [r for r, pid in sorted(peers.items()) if not _alive(pid)]
        if dead:
            names = ", ".join(f"rank {r} (pid {peers[r]})" for r in dead)
            os.write(2, f"\n[pretrain-cli] rank {rank}: {names} died (killed or crashed); this rank stops too. "
                        f"See that rank's workerlog for its cause; resume from the last checkpoint-N.\n".encode())
        return bool(dead)

    dead_since = None
    while os.getppid() == parent:
        if dead_since is None:
            if report():
                dead_since = time.monotonic()
        elif time.monotonic() - dead_since > grace:
            os.write(2, f"[pretrain-cli] rank {rank}: still running {grace:.0f} s after a peer died; killing it\n"
                     .encode())
            os.kill(parent, signal.SIGKILL)
            return
        time.sleep(0.1)
    if dead_since is None:  # this rank went first (gloo aborts it the moment a peer's socket closes)
        deadline = time.monotonic() + 2.0  # the peer may still be exiting: report as soon as it is gone
        while not report() and time.monotonic() < deadline:
            time.sleep(0.05)


def is_rank0(parallel: ParallelConfig) -> bool:
    return parallel.rank == 0


def _sharded(parallel: ParallelConfig) -> bool:
    return parallel.world_size > 1 and parallel.sharding_stage >= 1 and parallel.sharding_degree > 1


def wrap_model(model, parallel: ParallelConfig):
    """`paddle.DataParallel` for more than one data rank; fleet's wrapper for stage1; the model itself for one process.

    Stage2/3 wrap model and optimizer together in `wrap_optimizer`.
    """
    if parallel.world_size <= 1:
        return model
    import paddle

    if parallel.sharding_stage == 1 and parallel.sharding_degree > 1:
        from paddle.distributed import fleet

        return fleet.distributed_model(model)
    if parallel.sharding_stage in (2, 3) and parallel.sharding_degree > 1:
        return model
    return paddle.DataParallel(model, find_unused_parameters=False)


def wrap_optimizer(model, optimizer, parallel: ParallelConfig, offload: bool = False):
    """(model, optimizer) after sharding the optimizer state; unchanged for pure data parallel."""
    if not _sharded(parallel):
        return model, optimizer
    if parallel.sharding_stage == 1:
        from paddle.distributed import fleet

        return model, fleet.distributed_optimizer(optimizer)
    from paddle.distributed.sharding import group_sharded_parallel  # GPU only (config.derive_parallel)

    level = "os_g" if parallel.sharding_stage == 2 else "p_g_os"
    model, optimizer, _ = group_sharded_parallel(model, optimizer, level, offload=offload)
    return model, optimizer


class Comm:
    """Collectives the trainer needs; SUM then divide (gloo has no AVG)."""

    def __init__(self, parallel: ParallelConfig, optimizer=None, model=None):
        self.parallel = parallel
        self.world = parallel.world_size
        self.rank = parallel.rank
        self.sharded = parallel.sharding_stage == 1 and _sharded(parallel) and optimizer is not None
        self._saves = 0
        self._params, self._owned, self._group, self._owner = None, None, None, {}
        if self.sharded:  # ZeRO-1: each rank updates (and holds the optimizer state of) its own parameters
            self._hpo = optimizer
            self._dso = optimizer._inner_opt
            hcg = self._dso._hcg
            self._group = hcg.get_sharding_parallel_group()
            self._params = list(self._dso._origin_parameter_list)
            self._owned = self._dso.filter_parameters(self._params, hcg)
            self._owner = {name: self._group.ranks[r] for name, r in self._dso._param2rank.items()}

    # ------------------------------------------------------------------ scalars
    def _reduce(self, value: float, op) -> float:
        import paddle
        import paddle.distributed as dist

        t = paddle.to_tensor([float(value)], dtype="float64")
        dist.all_reduce(t, op=op)
        return float(t.numpy()[0])

    def sum(self, value: float) -> float:
        import paddle.distributed as dist

        return self._reduce(value, dist.ReduceOp.SUM)

    def mean(self, value: float) -> float:
        return self.sum(value) / self.world

    def any(self, flag: bool) -> bool:
        import paddle.distributed as dist

        return self._reduce(1.0 if flag else 0.0, dist.ReduceOp.MAX) > 0

    def no_sync(self, model):
        return model.no_sync() if hasattr(model, "no_sync") else contextlib.nullcontext()

    def barrier(self) -> None:
        import paddle.distributed as dist

        dist.barrier()

    # ------------------------------------------------------------------ gradients (ZeRO-1 aware)
    def sync_grads(self, optimizer) -> None:
        """Bring gradients to their owners; DataParallel already all-reduced them in backward."""
        if self.sharded:
            self._hpo._hybrid_sync_grad(self._params)  # reduce to the owning sharding rank (+ dp all-reduce)

    def grad_params(self, model) -> list:
        """Parameters whose gradients this rank holds reduced: all for DP, the owned ones for ZeRO-1."""
        return self._owned if self.sharded else list(model.parameters())

    def reduce_norm_sq(self, sq):
        """Global squared gradient norm from this rank's part (sharding ranks own disjoint parameters)."""
        if self.sharded:
            import paddle.distributed as dist

            dist.all_reduce(sq, op=dist.ReduceOp.SUM, group=self._group)
        return sq

    def step(self, optimizer) -> None:
        if self.sharded:
            self._hpo._step(self._params)  # update owned parameters, then broadcast them; grads already synced
        else:
            optimizer.step()

    # ------------------------------------------------------------------ optimizer state (checkpoints)
    def gather_state(self, model, local: dict) -> dict | None:
        """Full optimizer state on global rank 0 from each owner's shard; None on other ranks.

        One `all_gather_object` of {key: (shape, dtype)} (small), then one broadcast per tensor from its
        owner, so no rank ever holds more than its shard plus one tensor (rank 0: the full state).
        """
        import numpy as np
        import paddle
        import paddle.distributed as dist

        from pretrain_cli.convert import hf_param_names

        if not self.sharded:
            return local if self.rank == 0 else None
        metas: list = []
        dist.all_gather_object(metas, {k: (list(v.shape), str(v.dtype)) for k, v in local.items()}, group=self._group)
        names = hf_param_names(model)
        params = dict(model.named_parameters())
        out = {} if self.rank == 0 else None
        my = self._group.ranks.index(self.rank)
        for ours in sorted(names):
            hf = names[ours][0]
            owner = self._owner[params[ours].name]
            src = self._group.ranks.index(owner)
            for key in sorted(k for k in metas[src] if k.startswith(hf + "/")):
                shape, dtype = metas[src][key]
                if my == src:
                    t = paddle.to_tensor(np.ascontiguousarray(local[key]))
                else:
                    t = paddle.zeros(shape, dtype=dtype)
                dist.broadcast(t, src=owner, group=self._group)
                if out is not None:
                    out[key] = t.numpy()
        return out

    # ------------------------------------------------------------------ rank-0 work without a collective
    def _store(self):
        from paddle.base import core

        return core.create_or_get_global_tcp_store()

    def publish(self, key: str, value: str) -> None:
        """Rank 0: make a small string available to every rank (through the launcher's TCP store)."""
        self._store().set(f"{_KEY}/{key}", value.encode())

    def fetch(self, key: str) -> str:
        return bytes(self._store().get(f"{_KEY}/{key}")).decode()

    def rank0_done(self, ok: bool = True) -> None:
        """Rank 0: the rank-0-only work of this round (a save) is over."""
        self._saves += 1
        self._store().add(f"{_KEY}/save/{self._saves}", 1 if ok else -(10**6))

    def wait_for_rank0(self, what: str, timeout: float | None = None) -> None:
        """Other ranks: poll the TCP store (not a gloo collective: no 30 s limit) until rank 0 is done."""
        self._saves += 1
        key = f"{_KEY}/save/{self._saves}"
        timeout = timeout or float(os.environ.get("PRETRAIN_CLI_RANK0_TIMEOUT", "3600"))
        store, start, delay = self._store(), time.monotonic(), 0.05
        while True:
            try:
                value = store.add(key, 0)
            except Exception as e:  # the store lives in rank 0's process: rank 0 is gone
                raise UserError(f"rank {self.rank}: lost rank 0 while it was {what} ({e}); see workerlog.0") from None
            if value > 0:
                return
            if value < 0:
                raise UserError(f"rank {self.rank}: rank 0 failed while {what}; see workerlog.0")
            if time.monotonic() - start > timeout:
                raise UserError(f"rank {self.rank}: rank 0 has been {what} for more than {timeout:.0f} s; "
                                f"raise PRETRAIN_CLI_RANK0_TIMEOUT if that is expected")
            time.sleep(delay)
            delay = min(delay * 2, 1.0)


def build_comm(parallel: ParallelConfig, optimizer=None, model=None) -> Comm | None:
    return Comm(parallel, optimizer, model) if parallel.world_size > 1 else None


@contextlib.contextmanager
def rank0_round(comm):
    """Rank 0's side of `Comm.wait_for_rank0`: tell the waiting ranks it finished, or that it failed."""
    ok = False
    try:
        yield
        ok = True
    finally:
        if comm is not None:
            comm.rank0_done(ok)


def agree_on_resume(p: ParallelConfig, mine: Path | None) -> Path | None:
    """Rank 0 picks the checkpoint to resume from; the others take the same one (or fail clearly)."""
    if p.world_size <= 1:
        return mine
    comm = Comm(p)
    if p.rank == 0:
        comm.publish("resume", str(mine) if mine is not None else "")
        return mine
    chosen = comm.fetch("resume")
    if not chosen:
        return None
    path = Path(chosen)
    if not path.is_dir():
        raise UserError(f"rank {p.rank}: rank 0 resumes from {path}, which this node cannot see; put output_dir "
                        f"on a file system shared by all nodes")
    return path
