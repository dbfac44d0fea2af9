"""merge-data's repeated-source lines (`data/repeats.py`) against a brute-force reference, on a seeded fuzz of small
inputs built from shared sources, their lengths with other tokens, runs that repeat with a short period, inputs held
inside others and sources held by a third input inside a longer run: every run of at least 8 identical consecutive
sequences two inputs share (but for those whose every window repeats with a period of 4 or less, which DATA.md says
are not found) is in a line that counts every place holding it, and every line counts what is there (no run
said whose every window repeats so: any two inputs may hold one)."""
from __future__ import annotations

import re

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from data_helpers import write_mmidx_reference
from pretrain_cli.data import repeats
from pretrain_cli.data.indexed import open_token_file

RUN = 8


def _docs(rng, n, kind):
    if kind == "var":
        return [rng.integers(1, 60000, rng.integers(1, 30)).tolist() for _ in range(n)]
    if kind == "pieces":  # long documents cut into 64-token pieces: mostly 64, a shorter tail now and then
        return [rng.integers(1, 60000, 64 if rng.random() < 0.8 else rng.integers(1, 64)).tolist() for _ in range(n)]
    docs = rng.integers(2, 60000, (n, 6))
    docs[:, 0] = 1  # (fixed-length documents that all begin with one BOS)
    return docs.tolist()


def _like(rng, docs):
    """The lengths of `docs`, other tokens (a decoy)."""
    return [rng.integers(60001, 65000, len(d)).tolist() for d in docs]


def _case(rng):
    """2-4 inputs of fillers around sources drawn from a pool, with the shapes earlier reviews found missed."""
    kind = str(rng.choice(["var", "pieces", "bos"]))
    pool = [_docs(rng, int(rng.integers(8, 40)), kind) for _ in range(3)]
    inputs = []
    for _ in range(int(rng.integers(2, 5))):
        seq = _docs(rng, int(rng.integers(0, 4)), kind)
        for s in rng.choice(3, int(rng.integers(1, 3)), replace=False).tolist():
            if rng.random() < 0.3:  # its lengths with other tokens before it
                seq += _like(rng, pool[s])
            if rng.random() < 0.2:  # a run that repeats with a short period
                seq += [[0], []] * int(rng.integers(4, 8))
            seq += pool[s] + _docs(rng, int(rng.integers(0, 3)), kind)
            if rng.random() < 0.15:  # the next source right after it (a longer run where both are)
                seq += pool[(s + 1) % 3]
        inputs.append(seq)
    if rng.random() < 0.3:  # a slice of a source on its own (held inside others)
        s = pool[int(rng.integers(3))]
        lo = int(rng.integers(0, len(s) - 1))
        inputs.append(s[lo : lo + int(rng.integers(2, 12))])
    return inputs


def _ids(inputs):
    """Each input as an array of ids, one per distinct sequence."""
    seen: dict = {}
    return [np.array([seen.setdefault(tuple(d), len(seen)) for d in docs], np.int64) for docs in inputs]


def _places(ids, content):
    """Where `content` is in each input, each past the last found (as merge-data counts them)."""
    found = []
    for k, row in enumerate(ids):
        if len(row) < len(content):
            continue
        at = np.flatnonzero((sliding_window_view(row, len(content)) == content).all(axis=1))
        last = None
        for p in at.tolist():
            if last is None or p >= last + len(content):
                found.append((k, p))
                last = p
    return found


def _findable(content):
    """Whether some window of `RUN` in `content` does not repeat with a period of 4 or less."""
    windows = sliding_window_view(content, RUN)
    return any(not any((w[p:] == w[:-p]).all() for p in (1, 2, 3, 4)) for w in windows)


def _shared(ids):
    """(input, start, length) at both places of every maximal run of >= `RUN` identical sequences two inputs share."""
    runs = []
    for i in range(len(ids)):
        for j in range(i + 1, len(ids)):
            same = ids[i][:, None] == ids[j][None, :]  # [len(i), len(j)]
            for d in range(-len(ids[i]) + 1, len(ids[j])):
                diag = np.r_[False, np.diagonal(same, d), False]
                edges = np.flatnonzero(diag[1:] != diag[:-1]).reshape(-1, 2)  # [runs, (start, stop)]
                for lo, hi in edges.tolist():
                    p, q = lo + max(-d, 0), lo + max(d, 0)
                    if hi - lo >= RUN and _findable(ids[i][p : p + hi - lo]):
                        runs.append(((i, p, hi - lo), (j, q, hi - lo)))
    return runs


def _said(line, names):
    """(input, start, length, times, inputs named, whether a shared run's) of a line."""
    prefix, rest = line.split(": ", 1)
    times = re.search(r"trained on (twice|\d+ times)", rest).group(1)
    times = 2 if times == "twice" else int(times.split()[0])
    named = {names[m] for m in re.findall(r"of (\S+?)(?=,| and |$)", rest.split("; joined")[0]) if m in names}
    run = re.match(r"its sequences ([\d,]+) to ([\d,]+) of", rest)
    k = names[prefix]
    if run:
        start, stop = (int(x.replace(",", "")) for x in run.groups())
        return k, start, stop - start + 1, times, named | {k}, True
    return k, 0, int(re.match(r"its ([\d,]+) sequence", rest).group(1).replace(",", "")), times, named | {k}, False


def test_every_shared_run_is_said_with_every_place_holding_it(tmp_path):
    misses = []
    for seed in range(60):
        inputs = _case(np.random.default_rng(seed))
        names = {}
        for k, docs in enumerate(inputs):
            write_mmidx_reference(str(tmp_path / f"s{seed}_{k}"), docs)
            names[str(tmp_path / f"s{seed}_{k}")] = k
        lines = repeats.repeated_inputs([open_token_file(p) for p in names])
        ids = _ids(inputs)
        said = []
        for line in lines:
            k, start, n, times, named, run = _said(line, names)
            places = _places(ids, ids[k][start : start + n])
            if len(places) != times or ("more input" not in line and named != {i for i, _ in places}):
                misses.append((seed, "counts wrong", line, places))
            if run and not _findable(ids[k][start : start + n]):
                misses.append((seed, "no source", line))
            said.append((times, places, n))
        for run in _shared(ids):
            times = len(_places(ids, ids[run[0][0]][run[0][1] : run[0][1] + run[0][2]]))
            if not any(t == times and any(k == i and p <= at and at + length <= p + n for k, p in places
                                          for i, at, length in run) for t, places, n in said):
                misses.append((seed, "unsaid", run, times, lines))
    assert misses == []
