"""The ranks leave a stop together (`training.rank_exit`): no rank returns before every rank has stopped its watcher,
which takes any exit of a rank of its host for a death and SIGKILLs its own rank (rank 0 was killed so before its
`finally` released the run lock). Rank-0 rounds over a fake TCP store, ranks as threads, no process group."""
import threading
import time

from pretrain_cli.distributed.comms.comm import Comm, NoComm
from pretrain_cli.training import rank_exit
from fake_store import FakeStore


class FakeWatchdog:
    """`watchdog` for `rank_exit`: each rank's `stop` noted in `events`; the slow rank's only after a while."""

    def __init__(self, events: list, slow: int):
        self.events, self.slow, self.rank = events, slow, threading.local()

    def stop(self):
        if getattr(self.rank, "value", 0) == self.slow:
            time.sleep(0.3)  # (descheduled, or just slower to get here: the other ranks are past their stop by now)
        self.events.append(("stopped", getattr(self.rank, "value", 0)))


def test_no_rank_leaves_before_every_rank_has_stopped_its_watcher(monkeypatch):
    store, events, errors = FakeStore(), [], []
    fake = FakeWatchdog(events, slow=2)
    monkeypatch.setattr(rank_exit, "watchdog", fake)
    comms = [Comm(rank, 3) for rank in range(3)]
    for c in comms:
        c._store = lambda: store

    def rank(c):
        fake.rank.value = c.rank
        try:
            rank_exit.leave_together(c)
            events.append(("left", c.rank))
        except Exception as e:  # (raised in the thread: reported by the assertion below)
            errors.append(e)

    threads = [threading.Thread(target=rank, args=(c,)) for c in comms]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    kinds = [kind for kind, _ in events]
    assert sorted(events) == [("left", 0), ("left", 1), ("left", 2), ("stopped", 0), ("stopped", 1), ("stopped", 2)]
    assert kinds == ["stopped"] * 3 + ["left"] * 3, events  # the slow rank's stop before any rank left
    # rank 0 stayed until both other ranks had seen each round (its process hosts the store)
    assert store.values["pretrain_cli/save/1/seen"] == 2 and store.values["pretrain_cli/save/2/seen"] == 2


def test_one_process_stops_its_watcher_and_leaves(monkeypatch):
    events = []
    monkeypatch.setattr(rank_exit, "watchdog", FakeWatchdog(events, slow=-1))
    rank_exit.leave_together(NoComm())
    assert events == [("stopped", 0)]
