"""Two CPU-only workarounds for Paddle 3.3.1's gloo process groups, which fleet's hybrid groups and its pipeline need.

Neither runs on GPU (NCCL has neither problem); both are the reason more than two pipeline stages, and disjoint
data-parallel groups, join and run on CPU.

1. **Rendezvous keys shared by every group** (`separate_stores`). `ProcessGroupGloo.create` connects two gloo
   contexts per group: the communication context under the group id's key prefix, then the process group's own
   context with *no* prefix, under the keys "0", "1", ... (the rank inside the group) in the one global TCP store.
   Every group writes those same keys, and gloo's `connectFullMesh` waits only for a key to exist: a rank that
   reads its peer's key before the peer has rewritten it reads an address of an earlier group (another process,
   another group size) and fails with "Connection refused", a hang, or "address.cc … 136 vs 45". Whether a join
   succeeds is a race, lost more often the more groups there are (4 ranks, 3+ stages or disjoint dp groups) and
   the more loaded the machine. Here each group gets a TCP store of its own (served by its lowest rank, its port
   published in the global store under a key of this module once it listens), so no key is ever read stale. The
   n-th group's port is `ports.group_store_port(n)`: inside the block of ports the job holds (launch.sh and the
   tests), apart from the launcher's own; under a bare launcher, which holds none, a free port the kernel hands out.

2. **Send/recv tags counted per group** (`neighbour_sends`). A gloo process group numbers every operation it
   runs (`next_tag`), and a send matches only the receive with the same number. fleet's pipeline sends between
   neighbouring stages over the whole pipeline group; with more than two stages a middle stage talks to both
   neighbours, so its count runs ahead of each neighbour's and the first mismatched send waits forever
   ("TIMEOUT … unbound_buffer.cc"). With two stages every operation involves both ranks, so the counts agree.
   Here the pipeline group's sends and receives go through one two-rank group per pair of neighbouring stages
   (the ring, as fleet's next/previous ranks are); its collectives (the loss broadcast) stay on the whole group.
"""
from __future__ import annotations

import contextlib
import socket

from pretrain_cli.distributed.comms import store
from pretrain_cli.distributed.launcher import ports

PORT_KEY = "pretrain_cli/gloo_group_store/{}"  # in the global store: the port of the n-th group's own store
_made = [0]  # groups with a store made so far in this process, over every `separate_stores` (every rank counts alike)


@contextlib.contextmanager
def separate_stores(gloo: bool = True):
    """Every `paddle.distributed.new_group` made inside gets a TCP store of its own (gloo only; see 1. above).
    Every rank must create the same groups in the same order (fleet's topology and PipelineLayer do): the n-th
    group of more than one rank made in the process finds its store by n."""
    if not gloo:
        yield
        return
    import paddle.distributed as dist
    from paddle.base import core
    from paddle.distributed import collective

    plain, me = dist.new_group, dist.get_rank()
    endpoints = dist.ParallelEnv().trainer_endpoints

    def new_group(ranks=None, *args, **kwargs):
        members = sorted(ranks) if ranks is not None else list(range(dist.get_world_size()))
        _made[0] += len(members) > 1  # a one-rank group connects to no one: no store, no port
        default = collective._default_store
        if me in members and len(members) > 1:
            collective._default_store = _group_store(core, _made[0], members, me, endpoints)
        try:
            return plain(ranks, *args, **kwargs)
        finally:
            collective._default_store = default

    dist.new_group = new_group
    try:
        yield
    finally:
        dist.new_group = plain


def _group_store(core, n: int, members: list, me: int, endpoints: list):
    """The n-th group's own TCP store: its lowest rank serves it on the n-th group port of its host's block and
    publishes the port once it listens (a rank on another node holds another block), so no member's connect is
    refused (Paddle's client then sleeps 3 s: `distributed.comms.store`). Made for no number of members: no store
    waits for the others to connect (gloo's rendezvous waits for each member's key); each client sends at once."""
    shared, key = core.create_or_get_global_tcp_store(), PORT_KEY.format(n)
    host = endpoints[members[0]].split(":")[0]
    if me == members[0]:
        port = ports.group_store_port(n)
        if port is None:  # no block held: any free port, as the bare launcher picks its own
            with socket.socket() as s:
                s.bind((host, 0))
                port = s.getsockname()[1]
        own = core.TCPStore(host, port, True, 0, 900)  # listening once made
        shared.set(key, str(port).encode())
    else:
        shared.wait(key)
        port = int(bytes(shared.get(key)).decode())
        own = core.TCPStore(host, port, False, 0, 900)
    store.no_delay(host, port)
    return own


def neighbour_sends(hcg) -> None:
    """The pipeline group's send/recv over one two-rank group per pair of neighbouring stages (see 2. above); a
    no-op with two stages, whose pipeline group is that pair. Every rank creates every pair group, in order."""
    import paddle.distributed as dist

    stages = hcg.get_pipe_parallel_world_size()
    if stages <= 2:
        return
    me, pairs = dist.get_rank(), {}
    for ranks in hcg.topology().get_comm_list("pipe"):  # fleet's pipeline groups (the run's Topology's)
        for i, a in enumerate(ranks):
            b = ranks[(i + 1) % stages]
            group = dist.new_group([a, b])
            if me in (a, b):
                pairs[b if me == a else a] = group
    whole = hcg.get_pipe_parallel_group()
    whole._pg = _NeighbourSends(whole, pairs)


class _NeighbourSends:
    """A pipeline group's process group whose send/recv use the pair group of the peer; everything else (the
    collectives) is the whole group's."""

    def __init__(self, whole, pairs: dict):
        self._whole, self._ranks, self._pairs = whole.process_group, list(whole.ranks), pairs

    def _pair(self, peer_in_group: int):
        peer = self._ranks[peer_in_group]
        group = self._pairs[peer]
        return group.process_group, group.get_group_rank(peer)

    def send(self, tensor, dst: int, sync_op: bool = True):
        pg, rank = self._pair(dst)
        return pg.send(tensor, rank, sync_op)

    def recv(self, tensor, src: int, sync_op: bool = True):
        pg, rank = self._pair(src)
        return pg.recv(tensor, rank, sync_op)

    def __getattr__(self, name):
        return getattr(self._whole, name)
