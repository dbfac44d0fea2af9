"""The context-parallel keys (`context_parallel_degree`): which layouts `distributed.context` runs.

Context parallelism keeps whole weights on every rank and splits each sequence, so it composes with data
parallelism and with fleet's ZeRO-1 (which then shards over the cp ranks too); the engines of tensor and
pipeline parallelism and of ZeRO-2/3 place the weights themselves and are not combined with it here.
"""
from __future__ import annotations

from pretrain_cli.errors import Problems


def context_degree(args, world: int, tp: int, pp: int, stage: int, problems: Problems) -> int:
    """`context_parallel_degree` as `distributed.context` runs it: whole weights on every rank, so with data
    parallelism and ZeRO-1 (over cp × sharding) only; each sequence cut into 2·cp chunks (the load-balanced
    causal split). 1 if refused."""
    cp = max(args.training.context_parallel_degree, 1)  # -1, 0 and 1 all mean off
    if cp == 1:
        return 1
    seq = args.data.max_seq_length
    for bad, why in ((tp > 1 or pp > 1, "with tensor or pipeline parallelism is not supported; set "
                      "tensor_parallel_degree and pipeline_parallel_degree to 1"),
                     (stage > 1, "with ZeRO-2/3 is not supported; use sharding: stage1 (the optimizer state "
                      "split over cp x sharding ranks) or ''"),
                     (world % cp, f"does not divide the world size {world}; use a divisor of it"),
                     (seq % (2 * cp), f"needs max_seq_length ({seq}) divisible by 2 x {cp} (each rank holds two of "
                      f"{2 * cp} chunks); use a multiple of {2 * cp}")):
        if bad:
            problems.add(f"context_parallel_degree: {cp} {why}")
            return 1
    return cp
