"""An input of `merge-data` whose sequences all appear, in a row, inside other inputs (an identical file, a file
preprocessed alone and again inside a larger one), or a run of sequences two inputs both hold among others of their
own (`ab` from a + b, `bc` from b + c: b is in both): said before anything is written, since joined they are trained
on more than once. The sidecars cannot tell that one corpus holds another, so the tokens are compared, at a bounded
cost (`repeated_inputs`, `_shared_runs`).
"""
from __future__ import annotations

import numpy as np

from pretrain_cli.counts import count


_WHOLE = 1_000_000  # tokens: a smaller repeated window is compared whole


_NAMED = 3  # inputs a repeat is named in; past them "and N more"


_RUN = 8  # sequences: the shortest run two inputs share that is looked for (its window of keys is the anchor)
_ANCHORS = 1 << 22  # windows kept over all inputs (16 bytes each); past it 1 in ceil(windows / _ANCHORS) is kept
_CHECKED = 4  # runs compared on tokens for each pair of inputs, those with the most anchors first
_WEIGHTS = np.random.default_rng(1234).integers(1, 2**63, _RUN, dtype=np.uint64) | np.uint64(1)  # a window's hash
_SALT = np.uint64(0x9E3779B97F4A7C15)  # keeps a window keyed with first tokens apart from one keyed by lengths


def repeated_inputs(datasets) -> list[str]:
    """One line per input, or group of identical inputs, whose sequences all appear, in a row, inside other inputs
    (an identical file, or a file preprocessed from a superset of its corpus, e.g. `all` made from man + code merged
    with `man`), naming every input they are in, the group's own copies too (the first `_NAMED`, then how many
    more): joined, those documents would be trained on once more for each. Then one line per run of sequences that
    inputs share among others of their own (`_shared_runs`). Sidecars record only one sha256 of all of
    a file's inputs and settings, which cannot tell that one corpus holds another, so the tokens are compared
    (`_repeat_at`). Identical inputs are grouped first (`_identical`) and each group is compared through its first
    input alone, so k copies cost k - 1 comparisons, not k(k-1)/2. What it costs: each pair of distinct inputs has
    its lengths compared (the .idx, in memory); where some start's first and last lengths agree, it reads the
    smaller's first sequence, the larger's first token at each such start, and its sequence at each start where that
    token agrees too; the window's tokens where a start's first sequence and the lengths agree;
    a pair found repeated reads its window in both files (whole under `_WHOLE` tokens, else 10 sequences), so a
    merge with repeats reads more than one without: a repeated input's window twice for each distinct input
    holding it; `_shared_runs` says what it costs besides."""
    groups = _identical(datasets)
    lines, inside = [], {}  # inside: (group of the held input, group holding it) -> where it starts there
    for g, group in enumerate(groups):
        b = datasets[group[0]]
        nb = len(b)
        found = [(i, f"those of {datasets[i].prefix}") for i in group[:-1]]  # its own copies
        for h, holders in enumerate(groups):
            na = len(datasets[holders[0]])
            if na <= nb:  # (equal lengths: the same only, and those are grouped)
                continue
            hit = _repeat_at(datasets[holders[0]], b)
            if hit is not None:  # in each of that group's copies alike
                inside[g, h] = hit
                found += [(i, f"sequences {hit:,} to {hit + nb - 1:,} of {na:,} of {datasets[i].prefix}")
                          for i in holders]
        if found:
            said = [text for _, text in sorted(found)]
            lines.append((group[-1], f"{datasets[group[-1]].prefix}: its {count(nb, 'sequence', grouped=True)} are "
                                     f"{_listed(said)}; joined, they are trained on {_times(len(said))}: drop "
                                     f"{'one input' if len(said) == 1 else 'the repeats'} unless you mean to repeat "
                                     f"them"))
    return [line for _, line in sorted(lines)] + _shared_runs(datasets, groups, inside)


def _identical(datasets) -> list[list[int]]:
    """The non-empty inputs' indices in groups of identical ones (each in input order, a group's line said for its
    last), groups in the order their first comes: each input is compared with the first of each group of its
    length only, never again with the copies already found."""
    groups: list[list[int]] = []
    for j, b in enumerate(datasets):
        if len(b) == 0:
            continue
        same = next((g for g in groups if len(datasets[g[0]]) == len(b) and _repeat_at(datasets[g[0]], b) == 0),
                    None)
        if same is None:
            groups.append([j])
        else:
            same.append(j)
    return groups


def _repeat_at(a, b) -> int | None:
    """The first sequence of `a` from which all of `b`'s follow, or None. Every start is tried (sequences of
    equal lengths make every start a candidate by length), filtered cheaply first: the first and last lengths,
    the first token (one gather), the first sequence's tokens, then the window of lengths; a start past those
    is checked on the tokens (`_same`)."""
    na, nb = len(a), len(b)
    sa, sb = np.asarray(a.sizes), np.asarray(b.sizes)
    starts = np.flatnonzero((sa[: na - nb + 1] == sb[0]) & (sa[nb - 1 :] == sb[-1]))
    if not len(starts):
        return None
    first = np.asarray(b.get(0))
    if len(first):
        offsets = np.asarray(a.pointers)[starts] // a.dtype.itemsize
        starts = starts[np.asarray(a.data[offsets]) == first[0]]
    for k in map(int, starts):
        if np.array_equal(a.get(k), first) and np.array_equal(sa[k : k + nb], sb) and _same(a, k, b, 0, nb):
            return k
    return None


def _listed(said: list[str]) -> str:
    named = said[:_NAMED] + ([f"those of {count(len(said) - _NAMED, 'more input')}"] if len(said) > _NAMED else [])
    return named[0] if len(named) == 1 else f"{', '.join(named[:-1])} and {named[-1]}"


def _times(others: int) -> str:
    return "twice" if others == 1 else f"{others + 1} times"


def _shared_runs(datasets, groups, inside) -> list[str]:
    """One line per run of at least `_RUN` sequences that an input holds among others of its own and other inputs
    hold too, neither inside the other (`ab` = a + b and `bc` = b + c: b), naming every input holding it with where,
    found for each group of identical inputs through its first. Runs an input found inside both holders accounts
    for are not said again. How, and what it costs: each input's lengths (the .idx, in memory) are hashed in windows
    of `_RUN` (`_RUN` multiply-adds a sequence); a window whose lengths recur inside its input (lengths that do not
    vary: fixed-size windows) is keyed again with its sequences' first tokens, one token read a sequence there.
    Windows unique in their input are kept (1 in ceil(windows / `_ANCHORS`) by hash past `_ANCHORS`: the same
    windows in every input, so memory stays under 64 MiB and a run shorter than a few times that stride may go
    unsaid), sorted all together once, and those found in two inputs are anchors; a pair of inputs' anchors at one
    offset are one run, grown while the lengths agree. Per pair, the `_CHECKED` runs with most anchors have their
    tokens compared as `_repeat_at` compares a window (whole under `_WHOLE` tokens, else 10 sequences; the run
    between its first and last anchor where the grown one differs). A run shorter than `_RUN`, or of windows
    recurring in their input by lengths and first tokens alike, is not found."""
    reps = [g[0] for g in groups]
    windows = sum(max(len(datasets[i]) - _RUN + 1, 0) for i in reps)
    stride = np.uint64(max(-(-windows // _ANCHORS), 1))
    keys, owner, where = [], [], []
    for g, i in enumerate(reps):
        hashes, at = _anchors(datasets[i])
        kept = hashes % stride == 0
        keys.append(hashes[kept])
        where.append(at[kept])
        owner.append(np.full(int(kept.sum()), g, np.int64))
    keys, owner, where = (np.concatenate(x) if x else np.zeros(0, np.int64) for x in (keys, owner, where))
    if not len(keys):  # (no input of `_RUN` sequences, or no window kept)
        return []
    order = np.argsort(keys, kind="stable")  # within one hash, inputs in order: the first is the lowest
    keys, owner, where = keys[order], owner[order], where[order]
    new = np.r_[True, keys[1:] != keys[:-1]]
    first = np.maximum.accumulate(np.where(new, np.arange(len(keys)), 0))
    pair = ~new & (owner != owner[first])
    pid, at = owner[first][pair] * len(reps) + owner[pair], where[first][pair]  # pid: (a's group, b's group)
    shift = where[pair] - at  # where in b the run is, less where in a
    order = np.lexsort((shift, pid))
    pid, at, shift = pid[order], at[order], shift[order]
    pids, begin = np.unique(pid, return_index=True)
    runs: dict = {}  # (a, start, length) -> [(b, its start)]
    for p, lo, hi in zip(pids.tolist(), begin.tolist(), [*begin[1:].tolist(), len(pid)]):
        ga, gb = divmod(p, len(reps))
        if (ga, gb) in inside or (gb, ga) in inside:
            continue
        offsets, first_at, n = np.unique(shift[lo:hi], return_index=True, return_counts=True)
        for k in np.argsort(-n, kind="stable")[:_CHECKED].tolist():
            starts = at[lo + first_at[k] : lo + first_at[k] + n[k]]  # (sorted by shift: this offset's together)
            d = int(offsets[k])
            run = _grown(datasets[reps[ga]], datasets[reps[gb]], int(starts.min()), int(starts.max()) + _RUN, d)
            if run is not None and not _accounted(ga, gb, run, inside, datasets, groups):
                runs.setdefault((ga, *run), []).append((gb, run[0] + d))
    lines = []
    for (ga, start, n), holders in sorted(runs.items()):
        said = [f"sequences {j:,} to {j + n - 1:,} of {len(datasets[reps[gb]]):,} of {datasets[reps[gb]].prefix}"
                for gb, j in holders]
        times = len(groups[ga]) - 1 + sum(len(groups[gb]) for gb, _ in holders)
        a = datasets[reps[ga]]
        lines.append(f"{a.prefix}: its sequences {start:,} to {start + n - 1:,} of {len(a):,} "
                     f"({count(n, 'sequence', grouped=True)}) are {_listed(said)}; joined, they are trained on "
                     f"{_times(times)}: preprocess {'one of them' if times == 1 else 'all but one'} again without "
                     f"that source unless you mean to repeat them")
    return lines


def _anchors(ds) -> tuple[np.ndarray, np.ndarray]:
    """(hashes, starts) of `ds`'s windows of `_RUN` sequences unique in it: keyed by lengths, and where those recur,
    by lengths and first tokens."""
    sizes = np.asarray(ds.sizes).astype(np.uint64)
    if len(sizes) < _RUN:
        return np.zeros(0, np.uint64), np.zeros(0, np.int64)
    hashes = _window_hashes(sizes)
    once, recur = _unique(hashes)
    if not len(recur):
        return hashes[once], once
    read = np.zeros(len(sizes) + 1, np.int64)  # the sequences of the recurring windows: one token each is read
    np.add.at(read, recur, 1)
    np.add.at(read, recur + _RUN, -1)
    need = np.flatnonzero(np.cumsum(read[:-1]) > 0)
    firsts = np.zeros(len(sizes), np.uint64)
    offsets = np.asarray(ds.pointers)[need] // ds.dtype.itemsize
    filled = sizes[need] > 0
    firsts[need[filled]] = np.asarray(ds.data[offsets[filled]]).astype(np.uint64) + np.uint64(1)
    again = _window_hashes((sizes << np.uint64(32)) ^ firsts)[recur] ^ _SALT
    twice, _ = _unique(again)
    return np.concatenate([hashes[once], again[twice]]), np.concatenate([once, recur[twice]])


def _window_hashes(keys: np.ndarray) -> np.ndarray:
    """One uint64 for each window of `_RUN` consecutive keys (wrapping multiply-adds of fixed random weights)."""
    n = len(keys) - _RUN + 1
    out = np.zeros(n, np.uint64)
    for j in range(_RUN):
        out += keys[j : j + n] * _WEIGHTS[j]
    return out


def _unique(hashes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the positions of the hashes found once, those of the hashes found more than once)."""
    _, inverse, n = np.unique(hashes, return_inverse=True, return_counts=True)
    once = n[inverse] == 1
    return np.flatnonzero(once), np.flatnonzero(~once)


def _grown(a, b, lo: int, hi: int, d: int) -> tuple[int, int] | None:
    """(start, length) in `a` of the run a's sequences lo to hi - 1 begin, which are b's from lo + d: grown both
    ways while the lengths agree; if the grown run's tokens differ, the anchors' own; None if those differ too."""
    sa, sb = np.asarray(a.sizes), np.asarray(b.sizes)
    x0, x1 = max(0, -d), min(len(sa), len(sb) - d)  # where a and b overlap at this offset, in a's numbering
    differ = np.flatnonzero(sa[x0:x1] != sb[x0 + d : x1 + d]) + x0
    start = int(differ[differ < lo].max(initial=x0 - 1)) + 1
    stop = int(differ[differ >= hi].min(initial=x1))
    for s, e in ((start, stop), (lo, hi)):
        if np.array_equal(sa[s:e], sb[s + d : e + d]) and _same(a, s, b, s + d, e - s):
            return s, e - s
    return None


def _accounted(ga, gb, run, inside, datasets, groups) -> bool:
    """Whether an input found inside both `ga` and `gb` lies where `run` is in ga: its line says both already."""
    start, n = run
    return any(h == ga and (c, gb) in inside and at < start + n and start < at + len(datasets[groups[c][0]])
               for (c, h), at in inside.items())


def _same(a, i: int, b, j: int, n: int) -> bool:
    """Whether a's sequences i to i + n - 1 hold b's j to j + n - 1 token for token (the lengths known to agree):
    the whole window under `_WHOLE` tokens, else the first, last and 8 evenly spaced interior sequences (a chance
    match of every length and ten documents' tokens is no risk worth a full scan)."""
    a0, b0 = a.element_offset(i), b.element_offset(j)
    width = b.element_offset(j + n - 1) + int(b.sizes[j + n - 1]) - b0  # b's tokens, stored back to back
    if width < _WHOLE:
        return np.array_equal(a.tokens(a0, a0 + width), b.tokens(b0, b0 + width))
    picks = np.unique(np.linspace(0, n - 1, 10).round().astype(np.int64))  # first, last, 8 between
    return all(np.array_equal(a.get(i + int(p)), b.get(j + int(p))) for p in picks)
