"""An input of `merge-data` whose sequences all appear, in a row, inside other inputs (an identical file, a file
preprocessed alone and again inside a larger one): said before anything is written, since joined they are trained on
more than once. The sidecars cannot tell that one corpus holds another, so the tokens are compared, at a bounded
cost (`repeated_inputs`).
"""
from __future__ import annotations

import numpy as np

from pretrain_cli.counts import count


_WHOLE = 1_000_000  # tokens: a smaller repeated window is compared whole


_NAMED = 3  # inputs a repeat is named in; past them "and N more"


def repeated_inputs(datasets) -> list[str]:
    """One line per input, or group of identical inputs, whose sequences all appear, in a row, inside other inputs
    (an identical file, or a file preprocessed from a superset of its corpus, e.g. `all` made from man + code merged
    with `man`), naming every input they are in, the group's own copies too (the first `_NAMED`, then how many
    more): joined, those documents would be trained on once more for each. Sidecars record only one sha256 of all of
    a file's inputs and settings, which cannot tell that one corpus holds another, so the tokens are compared
    (`_repeat_at`). Identical inputs are grouped first (`_identical`) and each group is compared through its first
    input alone, so k copies cost k - 1 comparisons, not k(k-1)/2. What it costs: each pair of distinct inputs has
    its lengths compared (the .idx, in memory); where some start's first and last lengths agree, it reads the
    smaller's first sequence, the larger's first token at each such start, and its sequence at each start where that
    token agrees too; the window's tokens where a start's first sequence and the lengths agree;
    a pair found repeated reads its window in both files (whole under `_WHOLE` tokens, else 10 sequences), so a
    merge with repeats reads more than one without: a repeated input's window twice for each distinct input
    holding it."""
    groups = _identical(datasets)
    lines = []
    for group in groups:
        b = datasets[group[0]]
        nb = len(b)
        found = [(i, f"those of {datasets[i].prefix}") for i in group[:-1]]  # its own copies
        for holders in groups:
            na = len(datasets[holders[0]])
            if na <= nb:  # (equal lengths: the same only, and those are grouped)
                continue
            hit = _repeat_at(datasets[holders[0]], b)
            if hit is not None:  # in each of that group's copies alike
                found += [(i, f"sequences {hit:,} to {hit + nb - 1:,} of {na:,} of {datasets[i].prefix}")
                          for i in holders]
        if found:
            said = [text for _, text in sorted(found)]
            named = said[:_NAMED] + ([f"those of {count(len(said) - _NAMED, 'more input')}"]
                                     if len(said) > _NAMED else [])
            where = named[0] if len(named) == 1 else f"{', '.join(named[:-1])} and {named[-1]}"
            times = "twice" if len(said) == 1 else f"{len(said) + 1} times"
            lines.append((group[-1], f"{datasets[group[-1]].prefix}: its {count(nb, 'sequence', grouped=True)} are "
                                     f"{where}; joined, they are trained on {times}: drop "
                                     f"{'one input' if len(said) == 1 else 'the repeats'} unless you mean to repeat "
                                     f"them"))
    return [line for _, line in sorted(lines)]


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
    is checked on the tokens: the whole window under `_WHOLE` tokens, else the first, last and 8 evenly spaced
    interior sequences (a chance match of every length and ten documents' tokens is no risk worth a full scan)."""
    na, nb = len(a), len(b)
    sa, sb = np.asarray(a.sizes), np.asarray(b.sizes)
    starts = np.flatnonzero((sa[: na - nb + 1] == sb[0]) & (sa[nb - 1 :] == sb[-1]))
    if not len(starts):
        return None
    first = np.asarray(b.get(0))
    if len(first):
        offsets = np.asarray(a.pointers)[starts] // a.dtype.itemsize
        starts = starts[np.asarray(a.data[offsets]) == first[0]]
    b0 = b.element_offset(0)
    width = b.element_offset(nb - 1) + int(sb[-1]) - b0  # b's tokens, stored back to back
    picks = np.unique(np.linspace(0, nb - 1, 10).round().astype(np.int64))  # first, last, 8 between
    for k in map(int, starts):
        if not (np.array_equal(a.get(k), first) and np.array_equal(sa[k : k + nb], sb)):
            continue
        if width < _WHOLE:
            a0 = a.element_offset(k)
            same = np.array_equal(a.tokens(a0, a0 + width), b.tokens(b0, b0 + width))
        else:
            same = all(np.array_equal(a.get(k + int(p)), b.get(int(p))) for p in picks)
        if same:
            return k
    return None
