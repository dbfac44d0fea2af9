"""Keys of windows of consecutive sequences, by which `data/repeats.py` finds where two inputs may hold the same
sequences without reading most of their tokens. A window's key is a function of its own sequences only, never of
the input around it, so the same window has one key in every input: matching keys are where to compare tokens.
"""
from __future__ import annotations

import numpy as np

RUN = 8  # sequences: the shortest run two inputs share that is looked for (its window of keys is the anchor)
ANCHORS = 1 << 22  # windows kept over all inputs; past it 1 in ceil(windows / ANCHORS) is kept
CHUNK = 1 << 18  # windows hashed at a time: an input's own windows are never all in memory
_WEIGHTS = np.random.default_rng(1234).integers(1, 2**63, RUN + 2, dtype=np.uint64) | np.uint64(1)
_SALT = np.uint64(0x9E3779B97F4A7C15)  # keeps a window keyed with tokens apart from one keyed by lengths alone


def anchors(ds, stride) -> tuple[np.ndarray, np.ndarray]:
    """(keys, starts) of `ds`'s windows of `RUN` sequences whose key is a multiple of `stride`, each key once, at
    its first window (a source an input holds twice is still found where it first is). Every window is keyed by
    its sequences' lengths and first and middle tokens (`_by_tokens`), never by its lengths alone: lengths recur
    (10, 20, 30, ... all through an input; long documents cut into pieces of one size), and a window keyed by
    lengths in one input and kept at its first such window would point at other tokens of those lengths there
    while the other input's copy points at the source. None is kept whose sequences repeat with a period of 4 or
    less (empty or padding documents in a row, EOS-only and empty ones alternating): any two inputs may hold such
    a window without sharing a source. Whether a window is kept is decided by its key alone, so each input keeps
    the same ones. Memory: `CHUNK` windows are keyed at a time (each sequence read once: two tokens), and only the
    kept ones are held; each key once, so a window repeated all through an input costs one entry."""
    sizes = np.asarray(ds.sizes)
    n = len(sizes) - RUN + 1
    parts = []  # (keys, starts) kept in each chunk
    for c0 in range(0, max(n, 0), CHUNK):
        lengths = sizes[c0 : min(n, c0 + CHUNK) + RUN - 1].astype(np.uint64)
        keys, alike = _by_tokens(ds, c0, lengths, RUN, np.ones(len(lengths) - RUN + 1, bool))
        take = np.flatnonzero(~alike & (keys % stride == 0))
        parts.append((keys[take], take + c0))
        del keys, alike, take
    keys, at = _joined(parts)
    del parts
    first = _first_of_each(keys)  # (windows in order: a key's first is its first window)
    return keys[first], at[first]


def first_keys(datasets) -> np.ndarray:
    """Each input's key of its first window of min(its length, `RUN`) sequences (an empty input's: 0): an input
    holding another holds this key where the other begins (`holders`), and identical inputs have one."""
    keys = np.zeros(len(datasets), np.uint64)
    for i, ds in enumerate(datasets):
        width = min(len(ds), RUN)
        if width:
            keys[i] = _keyed(ds, 0, np.asarray(ds.sizes[:width]).astype(np.uint64), width)[0]
    return keys


def holders(datasets, firsts: np.ndarray) -> list[dict[int, np.ndarray | None]]:
    """For each input, the larger inputs holding its first window's key (`first_keys`) at some window of its
    width, each with those windows' starts (None past `CHUNK` of them: every start is a candidate then): only
    those inputs can hold all of its sequences in a row, and only from those starts (copies, of one length, are
    found apart: `repeats._identical`). Each input's windows are keyed once for each width there is (min(length,
    `RUN`): one, unless some inputs are shorter than `RUN`), `CHUNK` at a time, and looked up among the keys
    wanted, so n inputs cost their windows' keying, not n * n comparisons."""
    widths = np.array([min(len(ds), RUN) for ds in datasets])
    found: list[dict] = [{} for _ in datasets]
    for width in sorted(set(widths.tolist()) - {0}):
        mine = np.flatnonzero(widths == width)
        order = np.argsort(firsts[mine], kind="stable")
        mine, wanted = mine[order], firsts[mine][order]
        shortest = min(len(datasets[g]) for g in mine.tolist())
        for h, ds in enumerate(datasets):
            if len(ds) <= shortest:  # (holds none of them)
                continue
            sizes = np.asarray(ds.sizes)
            n = len(sizes) - width + 1
            for c0 in range(0, max(n, 0), CHUNK):
                keys = _keyed(ds, c0, sizes[c0 : min(n, c0 + CHUNK) + width - 1].astype(np.uint64), width)
                at = np.flatnonzero(np.isin(keys, wanted))
                at = at[np.argsort(keys[at], kind="stable")]  # (grouped by key, each key's in order)
                hit, begin = np.unique(keys[at], return_index=True)
                for key, lo, hi in zip(hit.tolist(), begin.tolist(), [*begin[1:].tolist(), len(at)]):
                    for g in mine[np.searchsorted(wanted, key, "left") : np.searchsorted(wanted, key, "right")]:
                        if len(datasets[g]) < len(ds):
                            _add(found[int(g)], h, at[lo:hi] + c0)
    return [{h: None if starts is None else np.concatenate(starts) for h, starts in f.items()} for f in found]


def _add(found: dict, h: int, starts: np.ndarray) -> None:
    """Note `starts` in input h, or that h has too many (past `CHUNK`) to list."""
    if h in found and found[h] is None:
        return
    listed = found.setdefault(h, [])
    listed.append(starts)
    if sum(map(len, listed)) > CHUNK:
        found[h] = None


def _keyed(ds, c0: int, lengths: np.ndarray, width: int) -> np.ndarray:
    """The key of each window of `width` of `lengths` (ds's from sequence c0), as `anchors` keys it: by its
    lengths, or where all are one length by its sequences (`_by_tokens`)."""
    keys, flat = window_hashes(lengths, width), _one_length(lengths, width)
    if flat.any():
        keys[flat] = _by_tokens(ds, c0, lengths, width, flat)[0][flat]
    return keys


def _one_length(lengths: np.ndarray, width: int) -> np.ndarray:
    """Whether each window of `width` of `lengths` has them all one."""
    changes = np.r_[0, np.cumsum(lengths[1:] != lengths[:-1])]
    return changes[width - 1 :] == changes[: len(lengths) - width + 1]


def _periodic(keys: np.ndarray, width: int, period: int) -> np.ndarray:
    """Whether each window of `width` of `keys` repeats with `period` (each key the one `period` before)."""
    if period >= width:
        return np.zeros(max(len(keys) - width + 1, 0), bool)
    breaks = np.r_[0, np.cumsum(keys[period:] != keys[:-period])]
    return breaks[width - period :] == breaks[: len(keys) - width + 1]


def _by_tokens(ds, c0: int, lengths: np.ndarray, width: int, which: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(key, whether all alike) of each window of `width` of `lengths` (ds's from sequence c0) marked in `which`
    (others: 0, False), by its sequences' lengths and first and middle tokens (`sequence_keys`: two tokens read
    a sequence there; the middle one tells apart documents that all begin with one BOS token), each sequence read
    once however many windows hold it; "all alike" is those keys repeating with a period of 4 or less (one
    sequence repeated, empty ones, or [EOS] and empty ones alternating)."""
    keys, one = np.zeros(len(which), np.uint64), np.zeros(len(which), bool)
    if which.any():
        read = np.convolve(which.astype(np.int8), np.ones(width, np.int8))[: len(lengths)] > 0  # their sequences
        each = np.zeros(len(lengths), np.uint64)
        each[read] = sequence_keys(ds, np.flatnonzero(read) + c0, lengths[read])
        keys[which] = window_hashes(each, width)[which] ^ _SALT
        one[which] = (_periodic(each, width, 3) | _periodic(each, width, 4))[which]  # (4 covers 1 and 2)
    return keys, one


def _joined(parts) -> tuple[np.ndarray, np.ndarray]:
    if not parts:
        return np.zeros(0, np.uint64), np.zeros(0, np.int64)
    return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])


def _first_of_each(keys: np.ndarray) -> np.ndarray:
    """Where each key first is: indices into `keys`."""
    order = np.argsort(keys, kind="stable")
    ordered = keys[order]
    return order[np.r_[True, ordered[1:] != ordered[:-1]][: len(keys)]]


def sequence_keys(ds, idx: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """One uint64 for each sequence `idx` of `lengths`: its length, first and middle tokens (an empty one: 0)."""
    keys = lengths.copy()
    filled = lengths > 0
    offsets = np.asarray(ds.pointers)[idx[filled]] // ds.dtype.itemsize
    for token_at, weight in ((offsets, _WEIGHTS[RUN]), (offsets + (lengths[filled] // 2).astype(np.int64),
                                                        _WEIGHTS[RUN + 1])):
        keys[filled] += (np.asarray(ds.data[token_at]).astype(np.uint64) + np.uint64(1)) * weight
    return keys


def window_hashes(keys: np.ndarray, width: int) -> np.ndarray:
    """One uint64 for each window of `width` consecutive keys (wrapping multiply-adds of fixed random weights)."""
    n = len(keys) - width + 1
    out = np.zeros(max(n, 0), np.uint64)
    for j in range(width):
        out += keys[j : j + n] * _WEIGHTS[j]
    return out
