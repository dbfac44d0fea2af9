"""The context-parallel key (`context_parallel_degree`): the degree `distributed.steps.context` runs.

Context parallelism splits each sequence over cp ranks and keeps whole weights across them, so it composes with
data parallelism, fleet's ZeRO-1 (which then shards over the cp ranks too) and tensor parallelism (each cp rank
its tp slices; `distributed.steps.order`). The products no engine here runs are `config.refusals`' table; this module
keeps the arithmetic: cp dividing the world and the sequence splitting into 2·cp chunks.
"""
from __future__ import annotations

from pretrain_cli.errors import Problems


def context_degree(args, world: int, problems: Problems) -> int:
    """`context_parallel_degree` as `distributed.steps.context` runs it: each sequence cut into 2·cp chunks (the
    load-balanced causal split). 1 if it does not divide."""
    cp = max(args.training.context_parallel_degree, 1)  # -1, 0 and 1 all mean off
    if cp == 1:
        return 1
    seq = args.data.max_seq_length
    for bad, why in ((world % cp, f"does not divide the world size {world}; use a divisor of it"),
                     (seq % (2 * cp), f"needs max_seq_length ({seq}) divisible by 2 x {cp} (each rank holds two of "
                      f"{2 * cp} chunks); use a multiple of {2 * cp}")):
        if bad:
            problems.add(f"context_parallel_degree: {cp} {why}")
            return 1
    return cp


def context_fits(cp: int, tp: int, pp: int, world: int, problems: Problems) -> int:
    """`cp` once the pipeline and tensor degrees are known: cp · tp · pp must divide the world, or the data
    degree world ÷ (pp·tp·cp) floors (world 4, tp 2, cp 4 → dp 0) and the launch dies building its topology.
    1 if it does not (the problem named)."""
    if cp == 1 or world % (cp * tp * pp) == 0:
        return cp
    rest = "".join(f" x {key} {d}" for key, d in (("tensor_parallel_degree", tp), ("pipeline_parallel_degree", pp))
                   if d > 1)
    problems.add(f"context_parallel_degree: {cp}{rest} = {cp * tp * pp} does not divide the world size {world}; "
                 f"use a divisor of it")
    return 1
