"""Rank-0 rounds over the TCP store: the waiting ranks acknowledge the end of a round, and rank 0 stays
until they have (its process hosts the store), without a real process group."""
import threading

from pretrain_cli.distributed.comms import comm as comm_module
from pretrain_cli.distributed.comms.comm import Comm, NoComm, rank0_round
from fake_store import FakeStore


class FakeClock:
    """`time` for the comm module: `sleep` advances `monotonic` instead of waiting, and is counted."""

    def __init__(self):
        self.now, self.sleeps = 0.0, 0

    def monotonic(self):
        return self.now

    def sleep(self, seconds):
        self.now += seconds
        self.sleeps += 1


def _comms(world, store):
    comms = [Comm(rank, world) for rank in range(world)]
    for c in comms:
        c._store = lambda: store
    return comms


def test_rank0_stays_until_every_rank_has_seen_the_last_round(monkeypatch):
    store = FakeStore()
    rank0, *others = _comms(3, store)
    with rank0_round(rank0):
        pass
    clock = FakeClock()
    monkeypatch.setattr(comm_module, "time", clock)
    rank0.wait_until_seen(timeout=0.3)  # nobody has looked yet: polls until the (bounded) wait is over, gives up
    assert clock.now >= 0.3 and clock.sleeps >= 2 and store.values["pretrain_cli/save/1/seen"] == 0
    monkeypatch.undo()  # the waiting ranks poll on the real clock
    waiters = [threading.Thread(target=c.wait_for_rank0, args=("saving",)) for c in others]
    for w in waiters:
        w.start()
    for w in waiters:
        w.join()
    clock = FakeClock()
    monkeypatch.setattr(comm_module, "time", clock)
    rank0.wait_until_seen(timeout=10)  # both have seen it: returns without waiting
    assert clock.sleeps == 0 and store.values["pretrain_cli/save/1/seen"] == 2


def test_nothing_to_wait_for_without_rounds_or_on_other_ranks(monkeypatch):
    store = FakeStore()
    rank0, rank1 = _comms(2, store)
    clock = FakeClock()
    monkeypatch.setattr(comm_module, "time", clock)
    rank0.wait_until_seen(timeout=5)  # no round yet
    rank1.wait_until_seen(timeout=5)  # not rank 0
    NoComm().wait_until_seen()
    assert clock.sleeps == 0 and not store.values


def test_a_rank_told_of_rank_0s_failure_ends_after_rank_0_so_rank_0_is_named(monkeypatch):
    """Rank 0's save fails (disk full): a waiting rank that ended at once, before rank 0 had printed its error and
    left, was named the cause by its host's watchers. It waits for rank 0's store to go (rank 0 gone), then says
    rank 0 failed; or gives up after FAILED_WAIT s."""
    import pytest

    from pretrain_cli import waiting
    from pretrain_cli.errors import PeerFailed

    class GoneAfter(FakeStore):
        """Rank 0's store, answering `polls` more times before its process is gone."""

        polls = 3

        def add(self, key, n):
            if key.endswith("/save/1") and n == 0:
                self.polls -= 1
                if self.polls < 0:
                    raise RuntimeError("Connection reset by peer")
            return super().add(key, n)

    clock = FakeClock()
    monkeypatch.setattr(comm_module, "time", clock)
    monkeypatch.setattr(waiting, "time", clock)
    store = GoneAfter()
    rank0, rank1 = _comms(2, store)
    rank0.rank0_done(ok=False)
    with pytest.raises(PeerFailed, match="rank 1: rank 0 failed while publishing checkpoint-5; see workerlog.0"):
        rank1.wait_for_rank0("publishing checkpoint-5")
    assert store.polls < 0  # it asked until rank 0's store was gone
    store = GoneAfter()
    store.polls = 10**9  # rank 0 never leaves
    rank0, rank1 = _comms(2, store)
    rank0.rank0_done(ok=False)
    with pytest.raises(PeerFailed, match="rank 0 failed while publishing"):
        rank1.wait_for_rank0("publishing checkpoint-5")
    assert clock.now >= comm_module.FAILED_WAIT
