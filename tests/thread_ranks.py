"""Ranks of one process as threads that meet at a `Hub`: a layout step's collectives checked against one process
without launching processes (each thread-rank puts its tensor in, all wait, each reads every rank's part)."""
from __future__ import annotations

import threading


class Hub:
    """Where `ranks` thread-ranks meet; `me.rank` is the calling thread's rank (`run` sets it)."""

    def __init__(self, ranks: int, timeout: float = 60.0):
        self.ranks, self.slots, self.me, self.timeout = ranks, {}, threading.local(), timeout
        self.barrier = threading.Barrier(ranks, timeout=timeout)

    def exchange(self, x) -> list:
        """Every rank's `x` (a Paddle tensor), as numpy arrays in rank order."""
        self.slots[self.me.rank] = x.numpy()
        self.barrier.wait()
        parts = [self.slots[r] for r in range(self.ranks)]
        self.barrier.wait()  # every rank has read before the next exchange writes
        return parts

    def run(self, rank_fn) -> None:
        """`rank_fn(r)` on one thread per rank; the first error of any rank re-raised once all have ended (a
        failing rank aborts the barrier, so the others stop waiting for it)."""
        errors = []

        def body(r: int) -> None:
            self.me.rank = r
            try:
                rank_fn(r)
            except BaseException as e:  # noqa: BLE001 - handed to the test's thread
                errors.append(e)
                self.barrier.abort()

        threads = [threading.Thread(target=body, args=(r,), daemon=True) for r in range(self.ranks)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=self.timeout * 4)
        if any(t.is_alive() for t in threads):
            raise AssertionError("a thread-rank did not end")
        if errors:
            raise errors[0]
