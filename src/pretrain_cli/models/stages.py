"""How the decoder's layers divide into consecutive pipeline stages: the one split `plan` models and
`distributed.strategies.pipeline` runs. Arithmetic only (no ranks): stage s holds layers bounds[s] .. bounds[s+1]-1
(under virtual stages, chunks of them interleaved over the stages: `stage_layers`), with the embedding on the first
stage and the final norm, LM head and loss on the last (and the multi-token prediction modules,
`model.layers.{num_hidden_layers + k}`, after the last decoder layer)."""
from __future__ import annotations

import functools


def stage_bounds(num_layers: int, stages: int) -> list[int]:
    """Decoder-layer index where each stage starts, plus the end: [0, b1, ..., num_layers]. Layers that do not
    divide evenly go to the middle stages first (the first holds the embedding, the last the head and the loss)."""
    return list(_bounds(num_layers, stages))  # a fresh list: the caller may keep or change it


@functools.lru_cache(maxsize=1024)
def _bounds(num_layers: int, stages: int) -> tuple[int, ...]:
    """`stage_bounds`, once per (layers, stages): `plan --fit` asks it ~50,000 times for a few dozen pairs."""
    base, extra = divmod(num_layers, stages)
    order = sorted(range(stages), key=lambda s: (s in (0, stages - 1), s))
    sizes = [base + (1 if order.index(s) < extra else 0) for s in range(stages)]
    bounds = [0]
    for size in sizes:
        bounds.append(bounds[-1] + size)
    return tuple(bounds)


@functools.lru_cache(maxsize=1024)
def stage_layers(num_layers: int, stages: int, virtual: int = 1) -> tuple[tuple[int, ...], ...]:
    """Each pipeline stage's decoder layers, as `build_pipeline_layer` splits them: `stage_bounds` over stages ×
    `virtual` model chunks, chunk c on stage c mod stages (fleet's interleaved PipelineLayer runs chunks s, s + P, ...
    on stage s). Without virtual stages one run of layers each; with them V runs of L/(P·V): 12 layers at pp 3 × 2
    virtual put 0-1 and 6-7 on stage 0, not 0-3, which matters where layers differ (DeepSeek's first
    `first_k_dense_replace` are dense). Cached as `_bounds` is (`plan --fit`)."""
    bounds = _bounds(num_layers, stages * virtual)
    return tuple(tuple(i for c in range(s, stages * virtual, stages) for i in range(bounds[c], bounds[c + 1]))
                 for s in range(stages))


def last_stage_embeds(cfg) -> bool:
    """Whether the last stage also holds the embedding's table (a copy of the first stage's, its gradient summed
    with it): a tied LM head is that table, and DeepSeek-V3's multi-token prediction looks the input tokens up in
    it (`models.mtp`), as Megatron-Core keeps an embedding on its last stage for both."""
    return bool(cfg.tie_word_embeddings) or cfg.num_nextn_predict_layers > 0
