"""merge-data's warning of a source two inputs share among others of their own (`data/repeats.py`): runs next to
neighbours of the same length, sources an input holds twice, fixed-length documents that all begin with one token,
and memory bounded by the windows kept, not by the inputs' size."""
from __future__ import annotations

import tracemalloc

import numpy as np

from data_helpers import write_mmidx_reference
from pretrain_cli.data import repeats
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
    are kept (past `_ANCHORS`) the run is grown from them to its whole extent, where fixed lengths with other
    documents on both sides came out short (the anchors' own span)."""
    a, b, c = _bos_docs(40, 1), _bos_docs(300, 2), _bos_docs(50, 3)
    ab, bc = _open(tmp_path, ab=a + b, bc=b + c)
    want = [f"{tmp_path / 'ab'}: its sequences 40 to 339 of 340 (300 sequences) are sequences 0 to 299 of 350 of "
            f"{tmp_path / 'bc'}{_TAIL}"]
    assert repeats.repeated_inputs([ab, bc]) == want
    monkeypatch.setattr(repeats, "_ANCHORS", 60)  # 1 window in 12 kept
    assert repeats.repeated_inputs([ab, bc]) == want
    rng = np.random.default_rng(0)  # fixed lengths, other first tokens, with others on both sides in both inputs:
    a, b, c, d, e = (rng.integers(2, 1000, (n, 6)).tolist() for n in (40, 300, 50, 30, 60))
    abc, dbe = _open(tmp_path, abc=a + b + c, dbe=d + b + e)  # (the anchors' own span was said: 64 to 328)
    monkeypatch.setattr(repeats, "_ANCHORS", 70)
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
    monkeypatch.setattr(repeats, "_ANCHORS", 1 << 10)
    monkeypatch.setattr(repeats, "_CHUNK", 1 << 12, raising=False)
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
