"""The layouts `plan --fit` and the fewest-devices search propose, as argument-file key changes against the file's
values: each tensor-parallel × pipeline (× context-parallel) split of the devices with its sharding stages, sequence
parallelism and expert-parallel degrees (`_splits`), then for `--fit` every micro-batch, recompute granularity and
flash attention that keeps the global batch (`candidates`), and for the count search each split at its least memory
(`lean_layouts`). Kept apart from the ranking (`planning.fit`) because proposing decides nothing: whether a layout
runs is `config.resolve`'s verdict when the caller re-resolves it, and what it needs is the memory model's. No
Paddle, no config import.
"""
from __future__ import annotations

import itertools

from pretrain_cli.models.recompute import GRANULARITIES as RECOMPUTE

from pretrain_cli.planning.layout import tp_inside_node

SEARCHED_RECOMPUTE = (None, *reversed(RECOMPUTE))  # off, then least to most recomputed
# shorter sequences' activations fit a device next to any layout's weights; below it CP only adds traffic
CONTEXT_MIN_SEQ = 8192


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _splits(current: dict, gpus: int, seq_len: int = 0, experts: int = 0, per_node: int = 0):
    """Each (data ranks, layout keys) of `gpus` devices: tensor-parallel × pipeline degrees whose product divides
    `gpus`, context-parallel degrees from `seq_len` >= CONTEXT_MIN_SEQ on (for a dense model with each tensor-parallel
    × pipeline product the rest divides; for a Mixture-of-Experts one, `experts` > 0, with each pipeline degree only:
    MoE under cp runs with dp, ZeRO-1/2, a pipeline and EP, not tp, `config.refusals`; docs/DISTRIBUTED.md), each
    sharding stage where there are data (or cp) ranks to shard over (with
    cp ""/stage1/stage2: ZeRO-3 is refused with it, and stage2 was left out as if it were too), with
    and without sequence parallelism under tp, every expert-parallel degree dividing both the `experts` and the data
    ranks. A sharding stage also comes with `sharding_parallel_degree` -1 (every data rank) when the file fixes a
    degree, which other layouts' data ranks need not divide (and which the layouts the semi-auto engine runs do not
    take: it shards over every data rank). `per_node` (nodes of that many devices; 0: no nodes): only the
    tensor-parallel degrees whose groups stay inside a node (`layout.tp_inside_node`)."""
    splits = [(tp, pp, 1) for tp in _divisors(gpus) for pp in _divisors(gpus // tp)]
    if seq_len >= CONTEXT_MIN_SEQ:
        splits += [(tp, pp, cp) for cp in _divisors(gpus) if cp > 1
                   for tp in ([1] if experts else _divisors(gpus // cp)) for pp in _divisors(gpus // cp // tp)]
    splits = [x for x in splits if not per_node or tp_inside_node(x[0], gpus, per_node)]
    fixed = current.get("sharding_parallel_degree", -1) not in (-1, 0)
    for tp, pp, cp in splits:
        data_ranks = gpus // (tp * pp * cp)
        stages = ["", "stage1", "stage2", "stage3"] if data_ranks > 1 else [current["sharding"]]
        stages = ["", "stage1", "stage2"] if cp > 1 else stages  # over cp x sharding (`config.refusals`: not 3)
        sps = [False, True] if tp > 1 and gpus > 1 else [current.get("sequence_parallel", False)]
        eps = [e for e in _divisors(data_ranks) if experts % e == 0] if experts and gpus > 1 else \
            [current.get("expert_parallel_degree", 1)]
        for stage, sp, ep in itertools.product(stages, sps, eps):
            keys = {"sharding": stage, "tensor_parallel_degree": tp if gpus > 1 else current["tensor_parallel_degree"],
                    "pipeline_parallel_degree": pp if gpus > 1 else current.get("pipeline_parallel_degree", 1),
                    "context_parallel_degree": cp if gpus > 1 else current.get("context_parallel_degree", 1),
                    "sequence_parallel": sp, "expert_parallel_degree": ep}
            yield data_ranks, keys
            if fixed and stage:
                yield data_ranks, {**keys, "sharding_parallel_degree": -1}


def candidates(current: dict, global_batch: int, gpus: int, seq_len: int = 0, experts: int = 0,
               per_node: int = 0) -> list[dict]:
    """Every layout to try, as key changes against `current` (the file's values of the searched keys).

    The layouts are `_splits`'; for each, micro-batch × accumulation = global batch / data ranks, so a split that
    leaves a fraction is skipped, with every recompute granularity and flash attention. Nothing here decides which
    layouts can run: what `config.resolve` refuses (a degree that does not divide the heads, a product in
    `config.refusals`' table, ...) is refused when the caller re-resolves the candidate, by the same rule `train`
    applies.
    """
    out = []
    flash = [current["use_flash_attention"]] + ([True] if not current["use_flash_attention"] else [])
    for data_ranks, keys in _splits(current, gpus, seq_len, experts, per_node):
        if global_batch % data_ranks:
            continue
        per_rank = global_batch // data_ranks
        for micro, gran, fa in itertools.product(_divisors(per_rank), SEARCHED_RECOMPUTE, flash):
            want = {"per_device_train_batch_size": micro, "gradient_accumulation_steps": per_rank // micro,
                    "recompute": gran is not None, "use_flash_attention": fa, **keys}
            if gran is not None:
                want["recompute_granularity"] = gran
            out.append({k: v for k, v in want.items() if current.get(k) != v})
    return out


def lean_layouts(current: dict, gpus: int, seq_len: int = 0, experts: int = 0, per_node: int = 0) -> list[dict]:
    """Each layout of `_splits` on `gpus` devices at its least memory: micro-batch 1, full recompute, flash
    attention, every data rank keeping the file's samples a step (micro-batch × accumulation: the global batch grows
    with the data ranks). What the fewest-devices search (`suggestions.more_devices`) tries at a device count: whether
    any layout fits there, which `suggestions.minimal` then strips of the keys it does not need."""
    per_rank = current["per_device_train_batch_size"] * current["gradient_accumulation_steps"]
    out = []
    for _, keys in _splits(current, gpus, seq_len, experts, per_node):
        want = {**keys, "per_device_train_batch_size": 1, "gradient_accumulation_steps": per_rank, "recompute": True,
                "recompute_granularity": "full", "use_flash_attention": True}
        out.append({k: v for k, v in want.items() if current.get(k) != v})
    return out
