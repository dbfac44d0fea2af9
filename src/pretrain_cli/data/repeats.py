"""An input of `merge-data` whose sequences all appear, in a row, inside other inputs (an identical file, a file
preprocessed alone and again inside a larger one), or a run of sequences two inputs both hold among others of their
own (`ab` from a + b, `bc` from b + c: b is in both): said before anything is written, since joined they are trained
on more than once. The sidecars cannot tell that one corpus holds another, so the tokens are compared, at a bounded
cost (`repeated_inputs`, `_shared_runs`).
"""
from __future__ import annotations

import numpy as np

from pretrain_cli.counts import count
from pretrain_cli.data import window_keys
from pretrain_cli.data.window_keys import RUN


_WHOLE = 1_000_000  # tokens: a smaller repeated window is compared whole


_NAMED = 3  # inputs (or places in one) a repeat is named in; past them "and N more"
_DIRECT = 4  # inputs (groups of identical ones) up to which each is compared with every larger one directly


_CHECKED = 4  # runs compared on tokens for each pair of inputs, those with the most anchors first
_PROBES = 32  # anchors of a run whose windows are compared on tokens to find one inside it, the middle one first


def repeated_inputs(datasets) -> list[str]:
    """One line per input, or group of identical inputs, whose sequences all appear, in a row, inside other inputs
    (an identical file, or a file preprocessed from a superset of its corpus, e.g. `all` made from man + code merged
    with `man`), naming every input they are in and every place there (the first `_NAMED`, then how many more), the
    group's own copies too: joined, those documents would be trained on once more for each place. Then one line per
    run of sequences that inputs share among others of their own (`_shared_runs`). Sidecars record only one sha256
    of all of a file's inputs and settings, which cannot tell that one corpus holds another, so the tokens are
    compared (`_repeat_at`). Identical inputs are grouped first (`_identical`) and each group is compared through
    its first input alone, so k copies cost k - 1 comparisons, not k(k-1)/2. What it costs: past `_DIRECT` groups,
    each input's windows are keyed once and only the pairs where the larger holds the smaller's first window's key
    are compared (`window_keys.holders`: n inputs cost n scans, not n * n comparisons); a pair compared has its
    lengths compared (the .idx, in memory); where some start's first and last lengths agree, it reads the
    smaller's first sequence, the larger's first and middle tokens at each such start, and its sequence at each
    start where those agree too; the window's tokens where a start's first sequence and the lengths agree; a pair
    found repeated reads its window in both files at each place (whole under `_WHOLE` tokens, else 10 sequences),
    so a merge with repeats reads more than one without; `_shared_runs` says what it costs besides."""
    firsts = window_keys.first_keys(datasets)
    groups = _identical(datasets, firsts)
    reps = [g[0] for g in groups]
    can_hold = window_keys.holders([datasets[i] for i in reps], firsts[reps]) if len(reps) > _DIRECT else \
        [dict.fromkeys(set(range(len(reps))) - {g}) for g in range(len(reps))]  # group -> {holder: starts or None}
    lines, inside = [], {}  # inside: (group of the held input, group holding it) -> each place it starts there
    for g, group in enumerate(groups):
        b = datasets[group[0]]
        nb = len(b)
        one = nb == 1
        found = [(i, f"{'that' if one else 'those'} of {datasets[i].prefix}", 1) for i in group[:-1]]  # its copies
        for h, starts in sorted(can_hold[g].items()):
            holders = groups[h]
            na = len(datasets[holders[0]])
            if na <= nb:  # (equal lengths: the same only, and those are grouped)
                continue
            hits = _repeat_at(datasets[holders[0]], b, starts=starts)
            if hits:  # in each of that group's copies alike
                inside[g, h] = hits
                found += [(i, f"{_spans(hits, nb)} of {na:,} of {datasets[i].prefix}", len(hits)) for i in holders]
        if found:
            times = sum(k for _, _, k in found)
            lines.append((group[-1], f"{datasets[group[-1]].prefix}: its {count(nb, 'sequence', grouped=True)} "
                                     f"{'is' if one else 'are'} {_listed([text for _, text, _ in sorted(found)])}; "
                                     f"joined, {'it is' if one else 'they are'} trained on {_times(times)}: drop "
                                     f"{'one input' if times == 1 else 'the repeats'} unless you mean to repeat "
                                     f"{'it' if one else 'them'}"))
    return [line for _, line in sorted(lines)] + _shared_runs(datasets, groups, inside)


def _identical(datasets, firsts) -> list[list[int]]:
    """The non-empty inputs' indices in groups of identical ones (each in input order, a group's line said for its
    last), groups in the order their first comes: each input is compared only with the first of each group of its
    length and first window's key (`window_keys.first_keys`), never again with the copies already found."""
    groups: list[list[int]] = []
    alike: dict = {}  # (length, first window's key) -> the groups of such inputs
    for j, b in enumerate(datasets):
        if len(b) == 0:
            continue
        kind = alike.setdefault((len(b), int(firsts[j])), [])
        same = next((g for g in kind if _repeat_at(datasets[g[0]], b) == [0]), None)
        if same is None:
            groups.append([j])
            kind.append(groups[-1])
        else:
            same.append(j)
    return groups


def _repeat_at(a, b, j: int = 0, n: int | None = None, starts: np.ndarray | None = None) -> list[int]:
    """Every sequence of `a` from which b's sequences j to j + n - 1 (all of b's by default) follow, each past
    the last found, so that a repeat is counted as often as it is there. Every start is tried (sequences of equal
    lengths make every start a candidate by length), or only `starts` (sorted) where they are known, a chunk of
    starts at a time, filtered cheaply first: the first and last lengths, the first and middle tokens (a gather
    each), the first sequence's tokens, then the window of lengths; a start past those is checked on the tokens
    (`_same`)."""
    na, n = len(a), len(b) - j if n is None else n
    sa, sb = np.asarray(a.sizes), np.asarray(b.sizes)[j : j + n]
    first, hits = np.asarray(b.get(j)), []
    for starts in _by_lengths(sa, sb, na - n + 1, starts):
        for at in {0, len(first) // 2} if len(first) else ():  # (the middle too: documents may all begin with BOS)
            offsets = np.asarray(a.pointers)[starts] // a.dtype.itemsize + at
            starts = starts[np.asarray(a.data[offsets]) == first[at]]
        for k in map(int, starts):  # (places apart only: a run of like documents is not counted at each shift)
            if (not hits or k >= hits[-1] + n) and np.array_equal(a.get(k), first) and \
                    np.array_equal(sa[k : k + n], sb) and _same(a, k, b, j, n):
                hits.append(k)
    return hits


def _by_lengths(sa, sb, stop: int, listed):
    """Starts before `stop` whose first and last lengths are sb's: of `listed` where given, else of every start,
    a chunk at a time (memory: a chunk's, not a's size)."""
    n = len(sb)
    if listed is not None:
        listed = listed[listed < stop]
        yield listed[(sa[listed] == sb[0]) & (sa[listed + n - 1] == sb[-1])]
        return
    for c0 in range(0, stop, window_keys.CHUNK):
        c1 = min(stop, c0 + window_keys.CHUNK)
        yield np.flatnonzero((sa[c0:c1] == sb[0]) & (sa[c0 + n - 1 : c1 + n - 1] == sb[-1])) + c0


def _spans(starts: list[int], n: int) -> str:
    said = [f"{s:,}" if n == 1 else f"{s:,} to {s + n - 1:,}" for s in starts[:_NAMED]]
    said += [count(len(starts) - _NAMED, "more place")] if len(starts) > _NAMED else []
    return ("sequence " if n == 1 and len(starts) == 1 else "sequences ") + \
        (said[0] if len(said) == 1 else f"{', '.join(said[:-1])} and {said[-1]}")


def _listed(said: list[str]) -> str:
    named = said[:_NAMED] + ([f"those of {count(len(said) - _NAMED, 'more input')}"] if len(said) > _NAMED else [])
    return named[0] if len(named) == 1 else f"{', '.join(named[:-1])} and {named[-1]}"


def _times(others: int) -> str:
    return "twice" if others == 1 else f"{others + 1} times"


def _shared_runs(datasets, groups, inside) -> list[str]:
    """One line per run of at least `RUN` sequences that an input holds among others of its own and other inputs
    hold too, neither inside the other (`ab` = a + b and `bc` = b + c: b), naming every place holding it (its own
    input's other places, and inputs held inside another too: `_said`), found for each group of identical inputs
    through its first, and said once. A run that an input found inside both holders covers is not said again (that
    input's line names both), nor one inside a run said whose line named every input holding it there.
    How: each input's windows of `RUN` sequences get a key (`window_keys.anchors`); 1 in ceil(windows /
    `window_keys.ANCHORS`) is kept by key (the same windows in every input: a run shorter than a few times that
    stride may go unsaid), each key at its first window in its input; the keys of all inputs are sorted together
    once, and those found in two inputs are anchors; a pair of inputs' anchors at one offset are measured by
    `_grown`, for the `_CHECKED` offsets with most anchors per pair. Memory is bounded by `window_keys.ANCHORS`
    (`window_keys.CHUNK` windows keyed at a time), not by the inputs' size. A run shorter than `RUN` is not
    found."""
    reps = [g[0] for g in groups]
    windows = sum(max(len(datasets[i]) - RUN + 1, 0) for i in reps)
    if not windows:  # (no input of `RUN` sequences)
        return []
    stride = np.uint64(max(-(-windows // window_keys.ANCHORS), 1))
    parts = [window_keys.anchors(datasets[i], stride) for i in reps]
    owner = np.concatenate([np.full(len(k), g, np.int32) for g, (k, _) in enumerate(parts)])
    if not len(owner):  # (no window kept)
        return []
    keys = np.concatenate([k for k, _ in parts])
    parts = [w for _, w in parts]  # (one array at a time: the peak is one copy more, not two)
    where = np.concatenate(parts)
    del parts
    order = np.argsort(keys, kind="stable")  # within one key, inputs in order: the first is the lowest
    keys.sort()  # (in place: that order, without a copy)
    new = np.r_[True, keys[1:] != keys[:-1]]
    del keys
    dup = np.flatnonzero(~new)
    first = dup - 1  # each repeated key's first entry (its lowest input): a key is once in each input at most
    while len(first) and not new[first].all():
        first = np.where(new[first], first, first - 1)
    dup, first = order[dup], order[first]  # (into owner and where)
    del order, new
    other = owner[dup] != owner[first]  # (each key is once in an input: always, but cheap to be sure)
    dup, first = dup[other], first[other]
    pid, at = owner[first].astype(np.int64) * len(reps) + owner[dup], where[first]  # pid: (a's group, b's group)
    shift = where[dup] - at  # where in b the run is, less where in a
    order = np.lexsort((shift, pid))
    pid, at, shift = pid[order], at[order], shift[order]
    pids, begin = np.unique(pid, return_index=True)
    runs: dict = {}  # (a, start, length) -> [b]
    near: dict = {}  # group -> the groups it shares any anchor with (held inside or not): where `_said` looks
    for p, lo, hi in zip(pids.tolist(), begin.tolist(), [*begin[1:].tolist(), len(pid)]):
        ga, gb = divmod(p, len(reps))
        near.setdefault(ga, set()).add(gb)
        near.setdefault(gb, set()).add(ga)
        if (ga, gb) in inside or (gb, ga) in inside:
            continue
        offsets, first_at, n = np.unique(shift[lo:hi], return_index=True, return_counts=True)
        for k in np.argsort(-n, kind="stable")[:_CHECKED].tolist():
            starts = at[lo + first_at[k] : lo + first_at[k] + n[k]]  # (sorted by shift: this offset's together)
            d = int(offsets[k])
            for run in _grown(datasets[reps[ga]], datasets[reps[gb]], np.sort(starts), d):
                if not _accounted(ga, gb, run, inside, datasets, groups):
                    runs.setdefault((ga, *run), []).append(gb)
    lines, spans = [], {}  # spans: group -> (start, stop, the groups its line named) of each run said there
    for (ga, start, n), held in sorted(runs.items()):  # (a run inside one said is said again if it has more holders)
        if not any(lo <= start and start + n <= hi and named.issuperset(held) for lo, hi, named in spans.get(ga, ())):
            lines.append(_said(datasets, groups, reps, ga, start, n, sorted(near[ga]), spans))
    return lines


def _said(datasets, groups, reps, ga, start, n, others, spans) -> str:
    """The line of a shared run, counting every place that holds it (`_repeat_at`) in each of the `others`, those
    held inside another too: a source an input holds twice is trained on once more for each. Each place is noted
    in `spans` with the groups named, so that the run, or one inside it held by no other, is not said again from
    another input."""
    a = datasets[reps[ga]]
    own = [s for s in _repeat_at(a, a, start, n) if abs(s - start) >= n]
    said = [f"its {_spans(own, n)}"] if own else []
    times = len(groups[ga]) * (1 + len(own)) - 1
    named, places = {ga}, {ga: [start, *own]}
    for gb in others:
        b = datasets[reps[gb]]
        places[gb] = _repeat_at(b, a, start, n)
        if places[gb]:
            said.append(f"{_spans(places[gb], n)} of {len(b):,} of {b.prefix}")
            times += len(groups[gb]) * len(places[gb])
            named.add(gb)
    for g, at in places.items():
        spans.setdefault(g, []).extend((s, s + n, named) for s in at)
    return (f"{a.prefix}: its sequences {start:,} to {start + n - 1:,} of {len(a):,} "
            f"({count(n, 'sequence', grouped=True)}) are {_listed(said)}; joined, they are trained on "
            f"{_times(times)}: preprocess {'one of them' if times == 1 else 'all but one'} again without "
            f"that source unless you mean to repeat them")


def _grown(a, b, starts: np.ndarray, d: int) -> list[tuple[int, int]]:
    """(start, length) in `a` of each run of sequences that a and b (from a's plus `d`) hold alike, where the
    windows at `starts` (sorted) matched: two sources can be at one offset in both inputs with unlike sequences
    between, so the anchors outside a run found are tried again, for up to `_CHECKED` runs. An anchor whose window
    holds the same tokens is found first (`_PROBES` tried, the middle first: windows reaching past the run, into
    neighbours that only have the same lengths, do not); the run is grown from it both ways within the lengths
    alike around it (`_lengths_alike`) to the last sequence before one that differs (`_edge`), then checked on the
    tokens whole (`_same`). Memory: a chunk of lengths at a time, never the inputs' overlap."""
    sa, sb = np.asarray(a.sizes), np.asarray(b.sizes)
    x0, x1 = max(0, -d), min(len(sa), len(sb) - d)  # where a and b overlap at this offset, in a's numbering
    runs: list[tuple[int, int]] = []
    while len(starts) and len(runs) < _CHECKED:
        probes = np.unique(np.linspace(0, len(starts) - 1, min(len(starts), _PROBES)).round().astype(np.int64))
        seed = next((s for s in starts[probes[np.argsort(abs(probes - (len(starts) - 1) / 2), kind="stable")]].tolist()
                     if np.array_equal(sa[s : s + RUN], sb[s + d : s + d + RUN]) and _same(a, s, b, s + d, RUN)),
                    None)
        if seed is None:
            break
        lo, hi = _lengths_alike(sa, sb, d, seed, x0, -1), _lengths_alike(sa, sb, d, seed + RUN - 1, x1 - 1, 1)
        start, stop = _edge(a, b, d, seed, lo, -1), _edge(a, b, d, seed + RUN - 1, hi, 1) + 1
        if _same(a, start, b, start + d, stop - start):
            runs.append((start, stop - start))
        starts = starts[(starts + RUN <= start) | (starts >= stop)]  # (the seed's among them: it is not tried again)
    return runs


def _lengths_alike(sa, sb, d: int, known: int, limit: int, way: int) -> int:
    """The farthest sequence from `known` towards `limit` with every length between alike in a and b."""
    at = known
    while at != limit:
        nxt = limit if abs(limit - at) <= window_keys.CHUNK else at + way * window_keys.CHUNK
        lo, hi = (at + 1, nxt + 1) if way > 0 else (nxt, at)
        differ = np.flatnonzero(sa[lo:hi] != sb[lo + d : hi + d])
        if len(differ):
            return int(lo + differ[0] - 1) if way > 0 else int(lo + differ[-1] + 1)
        at = nxt
    return at


def _edge(a, b, d: int, known: int, limit: int, way: int) -> int:
    """The farthest sequence from `known` (alike in a and b) towards `limit` with every one between alike too,
    judged by `_same` over the stretch (whole under `_WHOLE` tokens): true up to the run's end and false past it,
    so galloping, then halving, finds that end in a few comparisons, not one a sequence; a single sequence alike
    past a gap (another run at the same offset) does not mislead it."""
    def alike(step: int) -> bool:
        lo, hi = sorted((known, known + way * step))
        return _same(a, lo, b, lo + d, hi - lo + 1)

    good, bad, far = 0, None, (limit - known) * way
    while bad is None and good < far:
        step = min(max(2 * good, 1), far)
        good, bad = (step, None) if alike(step) else (good, step)
    while bad is not None and bad - good > 1:
        mid = (good + bad) // 2
        good, bad = (mid, bad) if alike(mid) else (good, mid)
    return known + way * good


def _accounted(ga, gb, run, inside, datasets, groups) -> bool:
    """Whether an input found inside both `ga` and `gb` covers `run` in ga: its line says both hold the run already
    (one inside only part of the run does not say the rest)."""
    start, n = run
    return any(h == ga and (c, gb) in inside and at <= start and start + n <= at + len(datasets[groups[c][0]])
               for (c, h), places in inside.items() for at in places)


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
