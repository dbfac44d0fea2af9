"""fleet's pipeline schedules as the memory model walks them: the order each stage runs its model chunks' forwards
and backwards in (fleet 3.3.1's `PipelineParallel`, 1F1B, and `PipelineParallelWithInterleave`, without its
`best_unbalanced_scheduler` or overlap variants, which `config.pipeline` does not turn on), and which chunks'
activations a stage holds at once. Walked, not summed by a formula, because the chunks of a stage differ: DeepSeek's
first `first_k_dense_replace` layers are dense, so under virtual stages the first stage's chunk 0 is not its chunk 1,
and the chunks fleet runs first are the ones in flight at the peak. Arithmetic only, no Paddle.
"""
from __future__ import annotations

import functools


def forward_chunk(pp: int, vpp: int, micro_batches: int, i: int) -> int:
    """The model chunk of a stage's i-th forward (fleet's `_get_virtual_pp_rank(i, forward=True)`): its first pass
    runs pp + m mod pp micro-batches through each chunk in turn, then pp micro-batches a chunk; the i-th backward is
    of chunk vpp - 1 - this."""
    first = pp + micro_batches % pp
    return i // first if i < first * vpp else (i - first * vpp) % (pp * vpp) // pp


@functools.lru_cache(maxsize=4096)
def order(pp: int, vpp: int, micro_batches: int, stage: int) -> tuple[tuple[bool, int], ...]:
    """(forward?, chunk) of each step `stage` runs, in fleet's order: w warm-up forwards (1F1B: min(pp - s - 1, m);
    interleaved: fleet's `startup_steps`, 2(pp - s - 1) + (V - 1)(pp + m mod pp), at most m·V), then a forward before
    each backward, then the remaining backwards. Cached: `plan --fit` asks it of every candidate's stages."""
    m = max(micro_batches, 1)
    steps = m * vpp
    if vpp <= 1:
        warm = min(pp - stage - 1, m)
    else:
        warm = min(2 * (pp - stage - 1) + (vpp - 1) * (pp + m % pp), steps)

    def fwd(i: int) -> tuple[bool, int]:
        return True, forward_chunk(pp, vpp, m, i) if vpp > 1 else 0

    def bwd(i: int) -> tuple[bool, int]:
        return False, vpp - 1 - forward_chunk(pp, vpp, m, i) if vpp > 1 else 0

    out = [fwd(i) for i in range(warm)]
    for i in range(steps - warm):
        out += [fwd(warm + i), bwd(i)]
    return tuple(out + [bwd(i) for i in range(steps - warm, steps)])


def live_chunks(pp: int, vpp: int, micro_batches: int, stage: int, sizes=None) -> tuple[int, ...]:
    """Per model chunk of `stage`, the micro-batches whose activations it holds at its peak: the moment of fleet's
    order (`order`) at which Σ live[c] · sizes[c] is largest (`sizes`: each chunk's bytes; equal when None, then the
    moment the most chunks are live, the first of them). With equal chunks that is w + 1 chunks after the warm-up,
    whatever their kinds; with unequal ones the same count, but of the chunks fleet runs first (the first stage at pp
    4 x 2 virtual, m 8: 7 forwards of chunk 0 and 4 of chunk 1 live, not 5.5 of each)."""
    if vpp <= 1:  # 1F1B: one chunk, its peak after the warm-up and one more forward (`plan --fit` asks it often)
        return (min(pp - stage, max(micro_batches, 1)),)
    sizes = sizes or (1.0,) * vpp
    live, best, at = [0] * vpp, -1.0, (0,) * vpp
    for forward, chunk in order(pp, vpp, micro_batches, stage):
        live[chunk] += 1 if forward else -1
        held = sum(n * size for n, size in zip(live, sizes))
        if forward and held > best:
            best, at = held, tuple(live)
    return at


def in_flight(pp: int, vpp: int, micro_batches: int, stage: int) -> tuple[int, int]:
    """(model chunks x micro-batches whose activations `stage` holds at its peak, of them the most that are of the
    model's last chunk at once: on the last stage the ones holding the final norm, the MTP modules and a loss).

    1F1B (`vpp` 1, fleet's `PipelineParallel`): stage s runs min(pp - s, m) forwards before its first backward,
    a whole stage each; the last stage one. Interleaved 1F1B (`vpp` V > 1, fleet's `PipelineParallelWithInterleave`):
    stage s runs w = 2(pp - s - 1) + (V - 1)(pp + m mod pp) chunk forwards before its first backward (fleet 3.3.1's
    `startup_steps`), then one forward before each backward: w + 1 chunks, at most m · V. With m a multiple of pp
    the first stage holds (pp·V + pp - 1) / V stages' worth of micro-batches, pp · (1 + (pp - 1)/(pp·V)) (Megatron's
    interleaved schedule, Narayanan et al. 2021, 2.2), and the last stage (pp + 1) / V, not 1, but only one of them
    in its last chunk; with m not a multiple, fleet's first pp + m mod pp micro-batches per chunk let the last stage
    hold more in its last chunk (walked in fleet's order, `order`), added to the peak as if at once (an upper
    bound)."""
    chunks = sum(live_chunks(pp, vpp, micro_batches, stage))
    if vpp <= 1 or stage != pp - 1:  # (1F1B: one micro-batch of the last stage's only chunk at a time)
        return chunks, 1 if vpp <= 1 else 0
    live = most = 0
    for forward, chunk in order(pp, vpp, micro_batches, stage):
        if chunk == vpp - 1:
            live += 1 if forward else -1
            most = max(most, live)
    return chunks, max(most, 1)
