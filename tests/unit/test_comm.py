"""Rank-0 rounds over the TCP store: the waiting ranks acknowledge the end of a round, and rank 0 stays
until they have (its process hosts the store), without a real process group."""
import threading
import time

from pretrain_cli.distributed.comm import Comm, NoComm, rank0_round


class FakeStore:
    def __init__(self):
        self.values, self.lock = {}, threading.Lock()

    def add(self, key, n):
        with self.lock:
            self.values[key] = self.values.get(key, 0) + n
            return self.values[key]


def _comms(world, store):
    comms = [Comm(rank, world) for rank in range(world)]
    for c in comms:
        c._store = lambda: store
    return comms


def test_rank0_stays_until_every_rank_has_seen_the_last_round():
    store = FakeStore()
    rank0, *others = _comms(3, store)
    with rank0_round(rank0):
        pass
    t = time.monotonic()
    rank0.wait_until_seen(timeout=0.3)  # nobody has looked yet: waits (bounded), then gives up
    assert time.monotonic() - t >= 0.3
    waiters = [threading.Thread(target=c.wait_for_rank0, args=("saving",)) for c in others]
    for w in waiters:
        w.start()
    t = time.monotonic()
    rank0.wait_until_seen(timeout=10)
    assert time.monotonic() - t < 5 and store.values["pretrain_cli/save/1/seen"] == 2
    for w in waiters:
        w.join()


def test_nothing_to_wait_for_without_rounds_or_on_other_ranks():
    store = FakeStore()
    rank0, rank1 = _comms(2, store)
    t = time.monotonic()
    rank0.wait_until_seen(timeout=5)  # no round yet
    rank1.wait_until_seen(timeout=5)  # not rank 0
    NoComm().wait_until_seen()
    assert time.monotonic() - t < 1 and not store.values
