"""Waiting for rank 0's work without a collective: one poll loop, one timeout.

The other ranks wait while rank 0 publishes a save or writes the final model (`distributed.comms.comm`, polling
the launcher's TCP store), and rank 0 waits for every rank's completion record of a checkpoint
(`training.shard_writer`, polling the directory). Neither waits in a gloo collective, whose hard 30 s
timeout a slow save would trip; both give up after `PRETRAIN_CLI_RANK0_TIMEOUT` seconds (default 3600).
"""
from __future__ import annotations

import os
import time

TIMEOUT_ENV = "PRETRAIN_CLI_RANK0_TIMEOUT"


def timeout_seconds(timeout: float | None = None) -> float:
    return timeout or float(os.environ.get(TIMEOUT_ENV, "3600"))


def poll(ready, timeout: float | None, on_timeout, first: float = 0.01, longest: float = 1.0):
    """Call `ready()` until it returns something other than None (returned), sleeping `first` seconds, doubling
    up to `longest`; after `timeout` seconds (`timeout_seconds`) raise what `on_timeout(seconds)` returns."""
    limit = timeout_seconds(timeout)
    start, delay = time.monotonic(), first
    while True:
        value = ready()
        if value is not None:
            return value
        if time.monotonic() - start > limit:
            raise on_timeout(limit)
        time.sleep(delay)
        delay = min(delay * 2, longest)
