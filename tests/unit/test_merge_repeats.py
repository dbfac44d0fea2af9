"""merge-data's warning of a source two inputs share among others of their own (`data/repeats.py`,
`data/window_keys.py`): runs next to neighbours of the same length, sources an input holds twice, fixed-length
documents that all begin with one token, memory bounded by the windows kept, not by the inputs' size (lengths that
recur all through too), no source said of documents that are one sequence repeated, every input holding a run
counted, and many inputs compared only where one may hold another."""
from __future__ import annotations

import tracemalloc

import numpy as np

from data_helpers import write_mmidx_reference
from pretrain_cli.data import repeats, window_keys
from pretrain_cli.data.indexed import open_token_file

_TAIL = "; joined, they are trained on twice: preprocess one of them again without that source unless you mean to " \
        "repeat them"


def _docs(n, seed, lengths=(1, 30)):
    rng = np.random.default_rng(seed)
    return [rng.integers(1, 1000, rng.integers(*lengths)).tolist() for _ in range(n)]


def _other_tokens(docs, seed):
    """Documents of the same lengths as `docs`, none of whose tokens are theirs."""
    rng = np.random.default_rng(seed)
    return [rng.integers(1001, 2000, len(d)).tolist() for d in docs]


def _open(tmp_path, **inputs):
    for name, docs in inputs.items():
        write_mmidx_reference(str(tmp_path / name), docs)
    return [open_token_file(tmp_path / name) for name in inputs]


def test_a_shared_run_next_to_neighbours_of_the_same_length_is_said(tmp_path):
    """`abc` with `bd` where c's and d's first documents have one length: the windows reaching one sequence past b
    matched, the run grown over that neighbour differed on the tokens, and so did the anchors' own span: nothing was
    said. The run is now grown from a window alike on the tokens to the last sequence alike, at either end."""
    a, b, c, d = _docs(20, 1), _docs(30, 2), _docs(25, 3), _docs(10, 4)
    d[:2] = _other_tokens(c[:2], 5)  # c's first two lengths, other tokens
    x = _docs(12, 6)
    x[-3:] = _other_tokens(a[-3:], 7)  # a's last three lengths, other tokens
    abc, bd, xb, xbd = _open(tmp_path, abc=a + b + c, bd=b + d, xb=x + b, xbd=x + b + d)
    b_in = {"bd": "sequences 0 to 29 of 40", "xb": "sequences 12 to 41 of 42", "xbd": "sequences 12 to 41 of 52"}
    for other, name in ((bd, "bd"), (xb, "xb"), (xbd, "xbd")):  # the neighbour after b, before it, both
        assert repeats.repeated_inputs([abc, other]) == [
            f"{tmp_path / 'abc'}: its sequences 20 to 49 of 75 (30 sequences) are {b_in[name]} of "
            f"{tmp_path / name}{_TAIL}"], name


def test_a_source_next_to_one_of_its_lengths_but_other_tokens_is_said_alone(tmp_path):
    """`ab` with `ab_other` (a, then b's lengths with other tokens): the lengths agree all through, so the run grown
    from them held b' and differed, and a, truly in both, went unsaid. Said now, a alone; b's lengths alone are
    nothing (no line for `b` with `b_other`)."""
    a, b = _docs(20, 1), _docs(60, 2)
    ab, ab_other, b_alone = _open(tmp_path, ab=a + b, ab_other=a + _other_tokens(b, 3), b_other=_other_tokens(b, 4))
    assert repeats.repeated_inputs([ab, ab_other]) == [
        f"{tmp_path / 'ab'}: its sequences 0 to 19 of 80 (20 sequences) are sequences 0 to 19 of 80 of "
        f"{tmp_path / 'ab_other'}{_TAIL}"]
    assert repeats.repeated_inputs([ab, b_alone]) == []


def test_a_source_an_input_holds_twice_is_counted_at_each_place(tmp_path):
    """`aba2` (a + b + a copy of a) with `ac`: a's windows recur inside aba2 and were dropped, so nothing was said;
    and `a` itself with `aba2` was said "twice" where a is trained on 3 times. Each place is named and counted now."""
    a, b, c = _docs(20, 1), _docs(30, 2), _docs(25, 3)
    aba2, ac, a_alone = _open(tmp_path, aba2=a + b + a, ac=a + c, a=a)
    assert repeats.repeated_inputs([aba2, ac]) == [
        f"{tmp_path / 'aba2'}: its sequences 0 to 19 of 70 (20 sequences) are its sequences 50 to 69 and sequences 0 "
        f"to 19 of 45 of {tmp_path / 'ac'}; joined, they are trained on 3 times: preprocess all but one again without "
        "that source unless you mean to repeat them"]
    assert repeats.repeated_inputs([a_alone, aba2]) == [
        f"{tmp_path / 'a'}: its 20 sequences are sequences 0 to 19 and 50 to 69 of 70 of {tmp_path / 'aba2'}; "
        "joined, they are trained on 3 times: drop the repeats unless you mean to repeat them"]


def _bos_docs(n, seed, size=6):
    """Fixed-length documents that all begin with token 1 (a BOS)."""
    docs = np.random.default_rng(seed).integers(2, 1000, (n, size))
    docs[:, 0] = 1
    return docs.tolist()


def test_fixed_length_documents_that_all_begin_with_one_token_are_found_whole(tmp_path, monkeypatch):
    """Every window of such documents has one key by lengths and first tokens, so all recurred in their input and
    none was kept: [] for a shared 300. Keyed by the middle token too, they are found; and where only some windows
    are kept (past `window_keys.ANCHORS`) the run is grown from them to its whole extent, where fixed lengths with other
    documents on both sides came out short (the anchors' own span)."""
    a, b, c = _bos_docs(40, 1), _bos_docs(300, 2), _bos_docs(50, 3)
    ab, bc = _open(tmp_path, ab=a + b, bc=b + c)
    want = [f"{tmp_path / 'ab'}: its sequences 40 to 339 of 340 (300 sequences) are sequences 0 to 299 of 350 of "
            f"{tmp_path / 'bc'}{_TAIL}"]
    assert repeats.repeated_inputs([ab, bc]) == want
    monkeypatch.setattr(window_keys, "ANCHORS", 60)  # 1 window in 12 kept
    assert repeats.repeated_inputs([ab, bc]) == want
    rng = np.random.default_rng(0)  # fixed lengths, other first tokens, with others on both sides in both inputs:
    a, b, c, d, e = (rng.integers(2, 1000, (n, 6)).tolist() for n in (40, 300, 50, 30, 60))
    abc, dbe = _open(tmp_path, abc=a + b + c, dbe=d + b + e)  # (the anchors' own span was said: 64 to 328)
    monkeypatch.setattr(window_keys, "ANCHORS", 70)
    assert repeats.repeated_inputs([abc, dbe]) == [
        f"{tmp_path / 'abc'}: its sequences 40 to 339 of 390 (300 sequences) are sequences 30 to 329 of 390 of "
        f"{tmp_path / 'dbe'}{_TAIL}"]


def test_memory_is_bounded_by_the_windows_kept_not_the_inputs(tmp_path, monkeypatch):
    """Every window of each input was hashed at once and its hashes sorted with their inverse: 3M sequences took
    232 MiB, 50M some 4 GB. Hashed a chunk at a time, filtered by key before any sort, memory follows the windows
    kept: here 200,000 sequences with 1,024 kept take well under what one array of their hashes would (1.6 MB)."""
    rng = np.random.default_rng(0)
    sizes = rng.integers(1, 30, 200_000)
    shared = _docs(400, 1)
    ab, bc = _open(tmp_path, ab=[[7] * int(s) for s in sizes[:100_000]] + shared,
                   bc=shared + [[8] * int(s) for s in sizes[100_000:]])
    monkeypatch.setattr(window_keys, "ANCHORS", 1 << 10)
    monkeypatch.setattr(window_keys, "CHUNK", 1 << 12)
    repeats.repeated_inputs([ab, bc])  # (once before: what numpy imports on first use is not the check's)
    tracemalloc.start()
    try:
        lines = repeats.repeated_inputs([ab, bc])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 800_000, peak
    assert lines == [f"{tmp_path / 'ab'}: its sequences 100,000 to 100,399 of 100,400 (400 sequences) are sequences 0 "
                     f"to 399 of 100,400 of {tmp_path / 'bc'}{_TAIL}"]


def _cycling(n, seed):
    """`n` sequences of 10, 20, 30, 10, ... random tokens: every window's lengths recur all through the input."""
    sizes = np.resize([10, 20, 30], n)
    return np.split(np.random.default_rng(seed).integers(1, 60000, int(sizes.sum())), np.cumsum(sizes)[:-1])


def _peak(datasets):
    repeats.repeated_inputs(datasets)  # (once before: what numpy imports on first use is not the check's)
    tracemalloc.start()
    try:
        lines = repeats.repeated_inputs(datasets)
        return tracemalloc.get_traced_memory()[1], lines
    finally:
        tracemalloc.stop()


def test_lengths_that_recur_all_through_are_keyed_by_tokens_a_chunk_at_a_time(tmp_path, monkeypatch):
    """Lengths cycling 10, 20, 30 in `ab` and `bc` (b shared): every window recurs, and all were keyed by their
    sequences at once (8 rows of indices each): 4.5M sequences took 1,069 MiB. Now a chunk at a time: with every
    window kept the peak is some 30 bytes a window, not 250; and with 1 in 78 kept b is found (it was not: windows
    were keyed by their sequences only where their lengths' key was kept, and 3 lengths' keys rarely are)."""
    a, b, c = _cycling(20_000, 1), _cycling(20_000, 2), _cycling(20_000, 3)
    ab, bc = _open(tmp_path, ab=a + b, bc=b + c)
    want = [f"{tmp_path / 'ab'}: its sequences 20,000 to 39,999 of 40,000 (20,000 sequences) are sequences 0 to "
            f"19,999 of 40,000 of {tmp_path / 'bc'}{_TAIL}"]
    monkeypatch.setattr(window_keys, "CHUNK", 1 << 12)
    peak, lines = _peak([ab, bc])  # (every window kept)
    assert peak < 80 * 80_000, peak
    assert lines == want
    monkeypatch.setattr(window_keys, "ANCHORS", 1 << 10)
    peak, lines = _peak([ab, bc])
    assert peak < 800_000, peak
    assert lines == want


def test_a_run_of_one_sequence_repeated_is_no_shared_source(tmp_path):
    """9 empty documents, 9 [0], 9 padding documents [0] * 8 in two unrelated inputs were "a shared source" to
    preprocess again without: any two inputs may hold such a run. A window of one sequence repeated is no anchor;
    a shared source next to such a run is still found."""
    x, y, b = _docs(20, 1), _docs(15, 3), _docs(30, 5)
    for name, filler in (("empty", []), ("zero", [0]), ("pad", [0] * 8)):
        xs, ys = _open(tmp_path, **{f"x_{name}": x + [filler] * 9 + _docs(20, 2),
                                    f"y_{name}": y + [filler] * 9 + _docs(25, 4)})
        assert repeats.repeated_inputs([xs, ys]) == [], name
    xs, ys = _open(tmp_path, xb=x + b + [[0] * 8] * 9, yb=y + b + [[0] * 8] * 9)
    assert repeats.repeated_inputs([xs, ys]) == [
        f"{tmp_path / 'xb'}: its sequences 20 to 58 of 59 (39 sequences) are sequences 15 to 53 of 54 of "
        f"{tmp_path / 'yb'}{_TAIL}"]


def test_a_shared_run_counts_the_inputs_it_is_in_that_are_held_inside_another(tmp_path):
    """`ab`, `bc`, `abc`: b is in all three, but the line for b named bc alone, "twice" (the pair with abc was
    skipped, ab being inside abc). Every input holding it is named and counted now. And an input of one sequence
    is said in the singular."""
    a, b, c = _docs(20, 0), _docs(30, 1), _docs(25, 2)
    ab, bc, abc, one = _open(tmp_path, ab=a + b, bc=b + c, abc=a + b + c, one=[c[3]])
    assert repeats.repeated_inputs([ab, bc, abc]) == [
        f"{tmp_path / 'ab'}: its 50 sequences are sequences 0 to 49 of 75 of {tmp_path / 'abc'}; joined, they are "
        "trained on twice: drop one input unless you mean to repeat them",
        f"{tmp_path / 'bc'}: its 55 sequences are sequences 20 to 74 of 75 of {tmp_path / 'abc'}; joined, they are "
        "trained on twice: drop one input unless you mean to repeat them",
        f"{tmp_path / 'ab'}: its sequences 20 to 49 of 50 (30 sequences) are sequences 0 to 29 of 55 of "
        f"{tmp_path / 'bc'} and sequences 20 to 49 of 75 of {tmp_path / 'abc'}; joined, they are trained on 3 times: "
        "preprocess all but one again without that source unless you mean to repeat them"]
    assert repeats.repeated_inputs([one, bc]) == [
        f"{tmp_path / 'one'}: its 1 sequence is sequence 33 of 55 of {tmp_path / 'bc'}; joined, it is trained on "
        "twice: drop one input unless you mean to repeat it"]


def test_many_inputs_are_compared_only_where_one_may_hold_another(tmp_path, monkeypatch):
    """Each input was compared with each larger one, and with each of its length to find copies: 40 shards took
    40 * 39 / 2 comparisons (400 took 1.8 s, 2,000 some 100 s). Now only where the larger holds the smaller's first
    window's key (its lengths, or its first and middle tokens where those are one), and from where it is there:
    here the 2 inputs held inside another (one of them shorter than a window), of 40; from every start where that
    key is in too many places to list."""
    shards = [_docs(50, seed) for seed in range(36)] + [_docs(50 + seed, seed) for seed in range(36, 38)]
    shards += [_docs(3, 40)[:1] + shards[5] + _docs(2, 41), shards[7][10:13]]  # shard 5 inside, and 3 of shard 7
    inputs = _open(tmp_path, **{f"s{i:02d}": docs for i, docs in enumerate(shards)})
    calls = []
    repeat_at = repeats._repeat_at

    def counted(a, b, *rest, **kw):
        calls.append(list(rest) or (None if kw.get("starts") is None else kw["starts"].tolist()))
        return repeat_at(a, b, *rest, **kw)

    monkeypatch.setattr(repeats, "_repeat_at", counted)
    assert repeats.repeated_inputs(inputs) == [
        f"{tmp_path / 's05'}: its 50 sequences are sequences 1 to 50 of 53 of {tmp_path / 's38'}; joined, they are "
        "trained on twice: drop one input unless you mean to repeat them",
        f"{tmp_path / 's39'}: its 3 sequences are sequences 10 to 12 of 50 of {tmp_path / 's07'}; joined, they are "
        "trained on twice: drop one input unless you mean to repeat them"]
    assert calls == [[1], [10]], calls  # (whole inputs, each from where its first window's key is)
    padded = [[5, 5]] * 12 + _docs(10, 42)  # a first window at 13 places in `more` (past a CHUNK of 4)
    inputs += _open(tmp_path, padded=padded, more=[[5, 5]] * 8 + padded)
    monkeypatch.setattr(window_keys, "CHUNK", 4)
    calls.clear()
    assert repeats.repeated_inputs(inputs)[2] == (
        f"{tmp_path / 'padded'}: its 22 sequences are sequences 8 to 29 of 30 of {tmp_path / 'more'}; joined, they "
        "are trained on twice: drop one input unless you mean to repeat them")
    assert calls == [[1], [10], None], calls  # (the padded one from every start)


def test_a_source_whose_lengths_recur_in_some_inputs_is_said_once(tmp_path):
    """s in `xs`, and in `ss1` and `yss2` next to its lengths with other tokens: s was said twice, the second time
    "twice" of ss1 and yss2 alone. One line, 3 times: the run ss1 and yss2 share lies where xs's line named them
    both (a run inside one said is said again only with an input that line did not name there)."""
    s = _docs(30, 1)
    xs, ss1, yss2 = _open(tmp_path, xs=_docs(5, 2) + s, ss1=s + _other_tokens(s, 3),
                          yss2=_docs(4, 4) + s + _other_tokens(s, 5))
    assert repeats.repeated_inputs([xs, ss1, yss2]) == [
        f"{tmp_path / 'xs'}: its sequences 5 to 34 of 35 (30 sequences) are sequences 0 to 29 of 60 of "
        f"{tmp_path / 'ss1'} and sequences 4 to 33 of 64 of {tmp_path / 'yss2'}; joined, they are trained on 3 times: "
        "preprocess all but one again without that source unless you mean to repeat them"]


def test_a_source_inside_a_run_said_is_said_again_with_the_inputs_that_hold_it_alone(tmp_path):
    """s + x in `a` and `m`, x alone in `c` and `d` too: x is trained on 4 times, but only the run s + x was said,
    "twice" (x's run lay inside it and was skipped as said). A run inside one said is skipped only when its line
    named every input holding it there."""
    s, x = _docs(10, 1), _docs(12, 2)
    a, m, c, d = _open(tmp_path, a=_docs(2, 3) + s + x + _docs(2, 4), m=s + x + _docs(3, 5), c=x + _docs(2, 6),
                       d=_docs(4, 7) + x)
    assert repeats.repeated_inputs([a, m, c, d]) == [
        f"{tmp_path / 'a'}: its sequences 2 to 23 of 26 (22 sequences) are sequences 0 to 21 of 25 of "
        f"{tmp_path / 'm'}{_TAIL}",
        f"{tmp_path / 'a'}: its sequences 12 to 23 of 26 (12 sequences) are sequences 10 to 21 of 25 of "
        f"{tmp_path / 'm'}, sequences 0 to 11 of 14 of {tmp_path / 'c'} and sequences 4 to 15 of 16 of "
        f"{tmp_path / 'd'}; joined, they are trained on 4 times: preprocess all but one again without that source "
        "unless you mean to repeat them"]


def test_a_small_input_inside_two_others_does_not_hide_their_shared_run(tmp_path):
    """s in `xs` and `sy`, and 2 of its sequences in `s2`: s2's line was taken to say the whole run of 20 the two
    share (it overlapped the run), so only s2 was said. An input inside both accounts for a run only if it covers
    it."""
    s = _docs(20, 8)
    xs, sy, s2 = _open(tmp_path, xs=_docs(1, 9) + s, sy=s + _docs(1, 10), s2=s[5:7])
    assert repeats.repeated_inputs([xs, sy, s2]) == [
        f"{tmp_path / 's2'}: its 2 sequences are sequences 6 to 7 of 21 of {tmp_path / 'xs'} and sequences 5 to 6 of "
        f"21 of {tmp_path / 'sy'}; joined, they are trained on 3 times: drop the repeats unless you mean to repeat them",
        f"{tmp_path / 'xs'}: its sequences 1 to 20 of 21 (20 sequences) are sequences 0 to 19 of 21 of "
        f"{tmp_path / 'sy'}{_TAIL}"]


def test_a_source_whose_lengths_come_earlier_in_one_input_with_other_tokens_is_said(tmp_path):
    """s after a decoy of its lengths with other tokens in `a`, and in `b` alone: in a, s's windows' lengths recur,
    so their lengths' keys were kept at the decoy; in b they were unique, keyed by lengths alone: the one key both
    shared pointed at the decoy, and nothing was said. Each window is keyed by its tokens now. Long documents cut
    into 64-token pieces are such lengths."""
    s = _docs(8, 11)
    a, b = _open(tmp_path, a=_other_tokens(s, 12) + s, b=s + _docs(1, 13))
    assert repeats.repeated_inputs([a, b]) == [
        f"{tmp_path / 'a'}: its sequences 8 to 15 of 16 (8 sequences) are sequences 0 to 7 of 9 of {tmp_path / 'b'}"
        f"{_TAIL}"]
    # two documents cut into 64-token pieces (4 and a tail, 3 and a tail), two of the same shapes earlier in one
    rng = np.random.default_rng(0)
    s = [rng.integers(1, 1000, k).tolist() for k in (64, 64, 64, 64, 17, 64, 64, 64, 40)]
    a, b = _open(tmp_path, pieces=_docs(20, 18, (64, 65)) + _other_tokens(s, 19) + s, small=[[4] * 9] + s)
    assert repeats.repeated_inputs([a, b]) == [
        f"{tmp_path / 'pieces'}: its sequences 29 to 37 of 38 (9 sequences) are sequences 1 to 9 of 10 of "
        f"{tmp_path / 'small'}{_TAIL}"]


def test_sequences_alternating_with_a_short_period_are_no_shared_source(tmp_path):
    """[0] (an EOS alone) and empty documents alternating, 12 of them, in two unrelated inputs were said to be a
    shared source of 12 sequences. A window whose sequences repeat with a period of 4 or less is no anchor, like
    one sequence repeated."""
    for name, filler in (("two", [[0], []]), ("three", [[0], [], [1, 2]]), ("four", [[0], [], [0], [3]])):
        p, q = _open(tmp_path, **{f"p_{name}": _docs(5, 14) + filler * 6 + _docs(5, 15),
                                  f"q_{name}": _docs(6, 16) + filler * 6 + _docs(4, 17)})
        assert repeats.repeated_inputs([p, q]) == [], name
