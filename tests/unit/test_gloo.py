"""The gloo groups' own TCP stores (`distributed.comms.gloo.separate_stores`): the n-th group of more than one rank is
served by its lowest rank on the n-th group port of the job's reserved block (`distributed.launcher.ports`), published in the
global store for the other members once it listens; a group's store is installed only while that group is created."""
from __future__ import annotations

from pretrain_cli import runtime
from pretrain_cli.distributed.comms import gloo
from pretrain_cli.distributed.launcher import ports

paddle = runtime.import_paddle()


class _Shared:
    """The launcher's global TCP store: set / wait / get."""

    def __init__(self):
        self.values: dict = {}

    def set(self, key, value):
        self.values[key] = value

    def wait(self, key):
        assert key in self.values, f"{key} waited for before it was published"

    def get(self, key):
        return self.values[key]


class _Core:
    """`paddle.base.core` as `_group_store` uses it: the global store and TCPStore (recorded, never served)."""

    def __init__(self, shared):
        self.shared, self.stores = shared, []

    def create_or_get_global_tcp_store(self):
        return self.shared

    def TCPStore(self, host, port, is_master, world, timeout):  # noqa: N802 (Paddle's name)
        self.stores.append((host, port, is_master, world))
        # the port is published only once its server listens (a member's connect refused sleeps 3 s)
        assert not is_master or not any(v == str(port).encode() for v in self.shared.values.values())
        return ("store", port)


ENDPOINTS = [f"127.0.0.1:{p}" for p in (20101, 20102, 20103, 20104)]


def test_the_server_takes_the_blocks_group_port_and_the_members_read_it(monkeypatch):
    base = ports.LOW + 3 * ports.BLOCK
    monkeypatch.setenv(ports.BLOCK_ENV, str(base))
    shared = _Shared()
    server, member = _Core(shared), _Core(shared)
    gloo._group_store(server, 2, [1, 3], 1, ENDPOINTS)  # rank 1 is the lowest of [1, 3]: it serves
    gloo._group_store(member, 2, [1, 3], 3, ENDPOINTS)
    port = ports.group_store_port(2)
    assert base + ports.LAUNCHER_PORTS < port < base + ports.BLOCK
    # no store waits for the members to connect (world 0): gloo's rendezvous waits for each member's key
    assert server.stores == [("127.0.0.1", port, True, 0)] and member.stores == [("127.0.0.1", port, False, 0)]
    assert shared.values[gloo.PORT_KEY.format(2)] == str(port).encode()


def test_without_a_block_the_server_takes_a_free_port(monkeypatch):
    monkeypatch.delenv(ports.BLOCK_ENV, raising=False)
    core = _Core(_Shared())
    gloo._group_store(core, 1, [0, 1], 0, ENDPOINTS)
    (host, port, is_master, world), = core.stores
    assert (host, is_master, world) == ("127.0.0.1", True, 0) and port > 0  # a port the kernel handed out


def test_groups_are_numbered_alike_on_every_rank_and_one_rank_groups_take_no_port(monkeypatch):
    import paddle.distributed as dist
    from paddle.distributed import collective

    made, served = [], []

    def plain(ranks=None, *args, **kwargs):
        made.append((ranks, collective._default_store))
        return len(made)

    def group_store(core, n, members, me, endpoints):
        served.append((n, members))
        return ("own store", n)

    class Env:
        trainer_endpoints = ENDPOINTS

    monkeypatch.setattr(gloo, "_made", [0])
    monkeypatch.setattr(gloo, "_group_store", group_store)
    monkeypatch.setattr(dist, "new_group", plain)
    monkeypatch.setattr(dist, "get_rank", lambda: 0)
    monkeypatch.setattr(dist, "get_world_size", lambda: 4)
    monkeypatch.setattr(dist, "ParallelEnv", Env)
    default = collective._default_store
    with gloo.separate_stores():
        for ranks in ([0, 1, 2, 3], [0], [2, 1], [3, 0], [1]):
            dist.new_group(ranks)
    assert dist.new_group is plain and collective._default_store is default
    # rank 0 is in groups 1 ([0..3]) and 3 ([0, 3]); [2, 1] is group 2 on every rank, one-rank groups count nowhere
    assert served == [(1, [0, 1, 2, 3]), (3, [0, 3])] and gloo._made == [3]
    assert [store for _, store in made] == [("own store", 1), default, default, ("own store", 3), default]


LAYOUTS = {  # world, pp, dp, sharding, mp
    "pp4": (4, 4, 1, 1, 1), "pp8": (8, 8, 1, 1, 1), "pp4_dp2": (8, 4, 2, 1, 1), "pp4_stage1": (8, 4, 1, 2, 1),
    "pp4_tp2": (8, 4, 1, 1, 2), "pp2_dp2_stage1": (8, 2, 2, 2, 1), "pp2_dp2_tp2": (8, 2, 2, 1, 2),
    "pp2_stage1_tp2": (8, 2, 1, 2, 2), "dp2_stage1_4": (8, 1, 2, 4, 1),
}


def test_every_layout_of_up_to_8_ranks_has_a_store_port_for_each_group(monkeypatch):
    """fleet's hybrid groups (its real `HybridCommunicateGroup`, over a stand-in `new_group`), a tied embedding's
    first-last stage group per pipeline (PipelineLayer makes one per pipe group) and `neighbour_sends`' pair groups:
    the groups of more than one rank that `separate_stores` numbers fit the block's GROUP_STORES."""
    import paddle.distributed as dist
    from paddle.distributed.fleet.base import topology

    class Group:
        def __init__(self, ranks):
            self.ranks, self.nranks, self.process_group = list(ranks), len(ranks), None

    class Env:
        trainer_endpoints = ENDPOINTS

    monkeypatch.setattr(topology, "_HYBRID_PARALLEL_GROUP", topology._HYBRID_PARALLEL_GROUP)  # restored after
    monkeypatch.setattr(dist, "new_group", lambda ranks=None, *a, **k: Group(ranks))
    monkeypatch.setattr(dist, "all_reduce", lambda *a, **k: None)
    monkeypatch.setattr(dist, "get_rank", lambda: 0)
    monkeypatch.setattr(dist, "ParallelEnv", Env)
    monkeypatch.setattr(gloo, "_group_store", lambda core, n, members, me, endpoints: None)
    counts = {}
    for name, (world, pp, dp, sharding, mp) in LAYOUTS.items():
        monkeypatch.setattr(gloo, "_made", [0])
        monkeypatch.setattr(dist, "get_world_size", lambda: world)
        topo = topology.CommunicateTopology(["pipe", "data", "sharding", "sep", "model"], [pp, dp, sharding, 1, mp])
        with gloo.separate_stores():
            hcg = topology.HybridCommunicateGroup(topo)
            if pp > 1:
                for ranks in topo.get_comm_list("pipe"):  # PipelineLayer's tied-embedding group
                    dist.new_group([ranks[0], ranks[-1]])
                gloo.neighbour_sends(hcg)
        counts[name] = gloo._made[0]
    assert counts["pp4"] == 7 and max(counts.values()) == 20, counts  # docs/DISTRIBUTED.md states these
    assert max(counts.values()) <= ports.GROUP_STORES
