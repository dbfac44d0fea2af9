"""Which documents of a token file each of train/valid/test holds, and the `split` value that fixes one too small.

`split` ("949,50,1") divides a source's documents into contiguous ranges with PaddleNLP's rounding
(`split_bounds`); each range becomes the samples of `data.samples` (`split_datasets`). Kept apart from how a
sample is cut from its range because a run's other readers need only the ranges (`config.resolve` parses `split`,
`orchestration.continued` compares two runs' ranges), and a split too small for the run is answered here with the
`split` that fixes every evaluation split of every source at once (`_split_for`).
"""
from __future__ import annotations

import re

import numpy as np

from pretrain_cli.counts import count
from pretrain_cli.data.blend import short_sources
from pretrain_cli.data.indexed import IndexedDataset
from pretrain_cli.data.samples import PackedDataset, PaddedDataset
from pretrain_cli.errors import UserError

SPLIT_NAMES = ("train", "valid", "test")
PHASE_OF = {"train": "do_train", "valid": "do_eval", "test": "do_predict"}


def parse_split(split: str) -> list[float]:
    """'949,50,1' or '949/50/1' -> three fractions summing to 1 (missing parts are 0)."""
    parts = [p for p in re.split(r"[,/]", str(split).strip()) if p.strip()]
    try:
        vals = [float(p) for p in parts]
    except ValueError:
        raise UserError(f"split: {split!r} is not numbers separated by ',' or '/'; use e.g. \"949,50,1\"") from None
    if not vals or len(vals) > 3 or any(v < 0 for v in vals) or sum(vals) <= 0:
        raise UserError(f"split: {split!r} needs 1-3 non-negative shares with a positive sum; use e.g. \"949,50,1\"")
    vals += [0.0] * (3 - len(vals))
    return [v / sum(vals) for v in vals]


def split_bounds(fractions, size: int) -> list[int]:
    """PaddleNLP's boundaries: b[i+1] = b[i] + round(f_i*size), excess taken off every later boundary."""
    b = [0]
    for f in fractions:
        b.append(b[-1] + int(round(f * float(size))))
    diff = b[-1] - size
    return [b[0]] + [min(max(x - diff, 0), size) for x in b[1:]]


def split_datasets(source: IndexedDataset, fractions, seq_len: int, seed: int, mode: str = "packed",
                   need=SPLIT_NAMES, special: dict | None = None, cache_dir: str | None = None,
                   document_mask: bool = False, reset_position_ids: bool = True, split_text: str = "",
                   blend: list | None = None) -> dict:
    """name -> dataset (None when the split is empty and not needed); `document_mask` applies to packed
    samples only (a padded sample holds one document). `fractions`: `parse_split`'s (`RunConfig.data.split`),
    `split_text` as the user wrote it (for messages). `need`: the splits the run uses, or {name: samples the run
    reads from it}, what a `split` named to fix a split too small aims at (`_split_for`). `blend`: every source of
    the run (input_dir's, `source` among them) with its weight, which that one `split` must fix at once."""
    if mode not in ("packed", "padded"):
        raise UserError(f"sample_mode: unknown {mode!r}; use 'packed' or 'padded'")
    b = split_bounds(fractions, len(source))
    split = split_text or ",".join(f"{f:g}" for f in fractions)
    out = {}
    for k, name in enumerate(SPLIT_NAMES):
        lo, hi = b[k], b[k + 1]
        if hi <= lo:
            if name in need:
                better = _split_for(blend or [(1.0, source)], fractions, seq_len, mode, need) if k else None
                fix = (f"set split: {better}" if better else f"give {name} a non-zero share (e.g. \"949,50,1\")"
                       if fractions[k] == 0 else
                       f"its share rounds to 0 {source.unit}s: raise it or use more documents")
                raise UserError(f"split: {split!r} leaves the {name} split empty (0 of {len(source)} {source.unit}s in "
                                f"{source.prefix}) but {PHASE_OF[name]} needs it; {fix}, or turn off {PHASE_OF[name]}")
            out[name] = None
            continue
        args = (source, lo, hi, seq_len, seed, name)
        try:
            if mode == "packed":
                out[name] = PackedDataset(*args, cache_dir=cache_dir, document_mask=document_mask,
                                          reset_position_ids=reset_position_ids)
            else:
                out[name] = PaddedDataset(*args, cache_dir=cache_dir, **special)
        except UserError as e:
            if name not in need:
                out[name] = None  # too small to use, but nobody asked for it
                continue
            better = _split_for(blend or [(1.0, source)], fractions, seq_len, mode, need) if k else None
            if better is None:
                raise
            raise UserError(f"{e}, or set split: {better}") from None
    return out


def _split_for(blend: list, fractions, seq_len: int, mode: str, need) -> str | None:
    """`"split"` and what it gives each evaluation split the run needs, or None if no split does: shares taken from
    train's, in thousandths, until every needed split at once (valid and test) holds, in every source of the run
    (`blend`: its (weight, source) pairs), the samples the run reads from it (`need`'s counts, each source's share
    by its weight: `blend.short_sources`, the judge the run's note asks too), the evaluation splits together keeping
    within a tenth of the data (or the share the user gave them), else one sample each, train keeping one in every
    source. A user who sees a split too small for one sample is shown the `split` value that fixes it, not only more
    data or shorter samples, and not one that fixes that split (or that source) only for the next check to stop at
    the other."""
    parts = [int(round(f * 1000)) for f in fractions]
    total = sum(parts)
    weights, sources = [w for w, _ in blend], [src for _, src in blend]
    cums = [np.concatenate(([0], np.cumsum(np.asarray(src.sizes, dtype=np.int64)))) for src in sources]  # [n+1] each
    wanted = [k for k in (1, 2) if SPLIT_NAMES[k] in need]
    reads = {k: max(1, int(need[SPLIT_NAMES[k]] or 1)) for k in wanted} if isinstance(need, dict) else {}

    def samples(trial, k: int) -> list[int]:
        """The samples split k holds in each source under shares `trial`."""
        held = []
        for src, cum in zip(sources, cums):
            b = split_bounds([t / total for t in trial], len(src))
            # packed: n samples of seq_len take n * seq_len + 1 tokens; padded: one document a sample
            held.append(max(0, int(cum[b[k + 1]] - cum[b[k]] - 1) // seq_len) if mode == "packed" else b[k + 1] - b[k])
        return held

    def short_of(held: list[int], k: int, target) -> bool:
        return min(held) < 1 or (target is not None and bool(short_sources(held, weights, target[k])))

    tiers = [(reads, max(total // 10, total - parts[0]))] if any(v > 1 for v in reads.values()) else []
    for target, cap in (*tiers, (None, total)):
        trial = list(parts)
        while True:
            short = [k for k in wanted if short_of(samples(trial, k), k, target)]
            if not short:
                break
            if trial[0] <= len(short) or total - trial[0] + len(short) > cap:
                trial = None
                break
            for k in short:
                trial[0], trial[k] = trial[0] - 1, trial[k] + 1
        if trial is None or trial == parts or ("train" in need and min(samples(trial, 0)) < 1):
            continue
        got = {k: samples(trial, k) for k in wanted}
        whose, least = ("this source's", "") if len(sources) == 1 else ("every source's", "at least ")
        held = [f"{SPLIT_NAMES[k]} split {least}{count(min(got[k]), 'sample', True)}" for k in wanted]
        said = f"{whose} {' and its '.join(held)}".replace(" split ", " split would then hold ", 1)
        short = [f"{reads[k]:,} {SPLIT_NAMES[k]}" for k in wanted if k in reads and short_of(got[k], k, reads)]
        if short:
            said += f"; the run reads {' and '.join(short)} samples, so evaluation repeats them"
        elif reads:
            said += (f", the samples the run reads from {'each' if len(wanted) > 1 else 'it'}" if len(sources) == 1
                     else ", each source's share by its weight of the samples the run reads")
        return f"\"{','.join(map(str, trial))}\" ({said})"
    return None
