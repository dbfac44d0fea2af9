"""A stop by signal before the ranks joined, on the node serving MASTER's store: its launcher says `left 143 stop` at
MASTER and keeps the store up LINGER s after it for the other nodes to read. That wait ran inside the signal handler
(`joining.Watch.leave`, from `leaving.note_end`) before Paddle's own handler told the ranks to stop, so they were
stopped up to LINGER (5) s late. Now the ranks are told at once and the store is kept up after (`Watch.keep_up`),
still until LINGER s after `left`. Paddle's signal handler as `rendezvous._note_ends` patches it, on stand-ins, with a
fake clock: what is asserted is the order of things, not a time."""
import json
from types import SimpleNamespace

import pytest

from pretrain_cli.distributed.launcher import joining, leaving

PEERS = [json.dumps({"candidate": "10.0.0.1:1", "replicas": 1, joining.NODE_KEY: "0", joining.HOST_KEY: "a",
                     joining.SERVES_KEY: True}),
         json.dumps({"candidate": "10.0.0.2:1", "replicas": 1, joining.NODE_KEY: "1", joining.HOST_KEY: "b"})]


class Store(dict):
    def put(self, key, value):
        self[key] = value
        return True

    def get_prefix(self, key):
        return {k: v for k, v in self.items() if k.startswith(key)}


class Clock:
    """`joining`'s `time`: monotonic time that moves only when slept (each sleep noted in `said`)."""

    def __init__(self, said):
        self.now, self.said = 1000.0, said

    def monotonic(self):
        return self.now

    def sleep(self, seconds):
        self.said.append(("sleep", round(seconds, 3)))
        self.now += seconds


@pytest.mark.parametrize("signum, left", [(15, "left 143 stop"), (2, "left 130 stop")])
def test_a_signal_before_the_join_stops_the_ranks_at_once_and_keeps_the_store_up_after(tmp_path, monkeypatch, signum,
                                                                                       left):
    from paddle.distributed.launch.controllers.controller import ControllerBase

    from pretrain_cli.distributed.launcher import rendezvous

    monkeypatch.setattr(ControllerBase, "finalize", ControllerBase.finalize)
    monkeypatch.setattr(ControllerBase, "signal_handler", ControllerBase.signal_handler)
    monkeypatch.setattr(leaving, "_ENDED", [])
    monkeypatch.setattr(leaving, "_FORCED", [])
    monkeypatch.setattr(leaving, "_WATCHES", [])
    monkeypatch.delenv("PRETRAIN_CLI_VERDICTS", raising=False)
    said = []
    monkeypatch.setattr(joining, "time", Clock(said))
    rendezvous._note_ends()
    store = Store()
    node0 = joining.Watch(store, "/job", 0, joining.nodes_of(PEERS), tmp_path, "10.0.0.1:8090")
    node0.beat()  # met at MASTER; its ranks are still on their way to the join (`done` stays False)
    leaving.watch_ends(node0)
    fake = SimpleNamespace(ctx=SimpleNamespace(logger=SimpleNamespace(info=print, debug=print),
                                               status=SimpleNamespace(done=lambda: None)),
                           watcher=SimpleNamespace(stop=lambda: None),
                           pod=SimpleNamespace(stop=lambda timeout=None: said.append(
                               ("ranks stop", store.get("/job/pretrain_cli_alive/0")))),
                           master=SimpleNamespace(stop=lambda: said.append(("store stop", None))))
    fake.stop = lambda sigint=None: ControllerBase.stop(fake, sigint)
    with pytest.raises(SystemExit) as stop:
        ControllerBase.signal_handler(fake, signum, None)
    assert stop.value.code == signum
    # `left` said first, the ranks told with no wait before; then the store kept up to LINGER s after `left`, stopped
    assert said == [("ranks stop", left), ("sleep", joining.LINGER), ("store stop", None)], said


def test_a_node_that_leaves_on_its_own_before_the_join_still_keeps_the_store_up_as_it_leaves(tmp_path, monkeypatch):
    """Not on a signal (its ranks failed at start-up, or it gives up on a lost node): the launcher's end is not held
    by a handler, and the store is kept up before it ends, as before."""
    monkeypatch.setattr(leaving, "_ENDED", [])
    monkeypatch.delenv("PRETRAIN_CLI_VERDICTS", raising=False)
    said = []
    monkeypatch.setattr(joining, "time", Clock(said))
    store = Store()
    node0 = joining.Watch(store, "/job", 0, joining.nodes_of(PEERS), tmp_path, "10.0.0.1:8090")
    leaving._ENDED.append((1, False))  # its ranks' code, decided by Paddle's launcher
    node0.leave()
    assert store["/job/pretrain_cli_alive/0"] == "left 1 retry" and said == [("sleep", joining.LINGER)]
