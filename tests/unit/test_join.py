"""Joining the process group (`distributed.setup.init_process_group`) with a host whose name does not resolve: gloo
binds its sockets to that name's address, and Paddle raised a ValueError, a 25-line traceback on every rank, which
launch.sh took for a transient failed join and retried three times. One line now, exit 2, naming the fix."""
import sys
import types

import pytest

from pretrain_cli.distributed import setup
from pretrain_cli.errors import UserError
from run_helpers import resolve_run


def test_a_host_name_that_does_not_resolve_is_one_line_naming_the_fix(monkeypatch):
    def init_parallel_env():
        raise ValueError("(InvalidArgument)  network node0: cannot be obtained. Details: Name or service not known.\n"
                         "  [Hint: Expected n == 0, but received n:-2 != 0:0.] (at tcp_utils.cc:63)")

    dist = types.SimpleNamespace(init_parallel_env=init_parallel_env)
    monkeypatch.setitem(sys.modules, "paddle", types.SimpleNamespace(distributed=dist))
    monkeypatch.setitem(sys.modules, "paddle.distributed", dist)
    monkeypatch.setattr("socket.gethostname", lambda: "node0")
    parallel = resolve_run(world=2, rank=1).parallel
    with pytest.raises(UserError) as e:
        setup.init_process_group(parallel)
    assert str(e.value) == ("rank 1: gloo cannot resolve this host's name (node0) to an address; add it to "
                            "/etc/hosts, or set GLOO_SOCKET_IFNAME to the network interface the nodes reach each "
                            "other on (`ip -br addr` lists them; lo on one machine)")
    assert e.value.exit_code == 2  # not a transient failure to retry with new ports
