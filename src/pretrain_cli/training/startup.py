"""What start-up cost each rank: its memory peak and wall time from launch until its layout is in place.

Measured on every rank right after `training.run.lay_out` (the model built lazily, this rank's parameters
created, a resume's weights and optimizer state read), before the first step; gathered to rank 0, which
writes one `startup` record per rank into metrics.jsonl and one log line. The peak is the kernel's own
high-water mark of the process's resident memory (`VmHWM` in /proc/self/status): everything the process ever
held, including what was freed again, so an outside sampler of its RSS can never see more
(docs/DISTRIBUTED.md, "What a rank holds while it starts").
"""
from __future__ import annotations

import os
import time

from pretrain_cli.training.metrics import log


def vm_hwm_gib() -> float | None:
    """The process's peak resident set (VmHWM) in GiB; None where /proc has none (not Linux)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 2**20  # kB
    except OSError:
        pass
    return None


def seconds_since_launch() -> float | None:
    """Wall seconds since this process started (its start time in /proc/self/stat, boot time in /proc/stat)."""
    try:
        with open("/proc/self/stat", "rb") as f:
            ticks = int(f.read().rsplit(b")", 1)[1].split()[19])
        with open("/proc/stat", encoding="ascii") as f:
            boot = next(int(line.split()[1]) for line in f if line.startswith("btime"))
    except (OSError, StopIteration, ValueError, IndexError):
        return None
    return time.time() - (boot + ticks / os.sysconf("SC_CLK_TCK"))


def measure(rank: int, device: str) -> dict:
    """This rank's start-up record, taken now."""
    row = {"rank": rank, "rss_peak_gib": _round(vm_hwm_gib()),
           "seconds_since_launch": _round(seconds_since_launch(), 2), "measured_at": round(time.time(), 3)}
    if not device.startswith("cpu"):
        import paddle

        row["device_max_allocated_gib"] = _round(paddle.device.max_memory_allocated() / 2**30)
    return row


def report(comm, writer, mine: dict, step: int) -> list[dict]:
    """Every rank's record (`comm.gather_object`, a collective every rank reaches here); rank 0 logs them on one
    line and writes them as `startup` records (`writer` is None on the other ranks)."""
    rows = comm.gather_object(mine)
    if writer is not None:
        for row in rows:
            writer.write("startup", step, row)  # (metrics.UNTRACKED: metrics.jsonl only)
        log.info("startup: " + "; ".join(describe(r) for r in rows))
    return rows


def describe(row: dict) -> str:
    gpu = row.get("device_max_allocated_gib")
    return (f"rank {row['rank']} peak RSS {row['rss_peak_gib']} GiB"
            + (f", device max allocated {gpu} GiB" if gpu is not None else "")
            + f" at {row['seconds_since_launch']} s since launch")


def _round(value, digits: int = 4):
    return None if value is None else round(value, digits)
