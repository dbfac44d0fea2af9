"""Whether added tokens' `normalized` flags can change a split (`tokenizer_ids._passes_matter`): the verdicts of the
pairwise rule it replaced (kept here as the reference), on every small set of short texts over a two-letter alphabet
and on random larger ones, overlapping and not; and the work grows with the number of tokens, not its square (4,000
added tokens without a normalizer took seconds on every fingerprint)."""
import itertools
import random

from pretrain_cli.data.tokenizer_ids import _passes_matter, ids_form


def _pairwise(added: list) -> bool:
    """The verdict as it was computed: every pair of texts compared."""
    if any(t.get("single_word") or t.get("lstrip") or t.get("rstrip") for t in added):
        return True
    texts = sorted({t["content"] for t in added})
    return any(a != b and (a in b or _joins(a, b)) for a in texts for b in texts)


def _joins(a: str, b: str) -> bool:
    i = a.find(b[:1], 1)
    while i != -1:
        if b.startswith(a[i:]):
            return True
        i = a.find(b[:1], i + 1)
    return False


def _added(texts, **flags) -> list:
    return [{"id": 1000 + i, "content": t, "special": True, "normalized": bool(i % 2), **flags}
            for i, t in enumerate(texts)]


def test_the_verdicts_are_the_pairwise_rule_s():
    words = ["".join(p) for n in range(1, 4) for p in itertools.product("ab", repeat=n)]  # 14 texts
    cases = [c for n in (1, 2, 3) for c in itertools.combinations(words, n)]
    rng = random.Random(7)
    for _ in range(400):  # larger sets, an alphabet of 3 to 6 letters: some overlap, some not
        letters = "abcdef"[:rng.randint(3, 6)]
        size = rng.randint(2, 12)
        cases.append(["".join(rng.choice(letters) for _ in range(rng.randint(1, 6))) for _ in range(size)])
    cases += [("ab", "bc"), ("ab", "cd"), ("abc", "b"), ("<|im_start|>", "<|im_end|>", "<|endoftext|>"),
              ("<|a|>", "|><|b"), ("aba", "ab"), ("aa", "aaa"), ("xyx", "yxz"), ("a", "a"), ("", "a"), ("",)]
    verdicts = {True: 0, False: 0}
    for texts in cases:
        added = _added(texts)
        assert _passes_matter(added) == _pairwise(added), texts
        verdicts[_pairwise(added)] += 1
    assert min(verdicts.values()) > 50, verdicts  # both verdicts well represented
    for flag in ("single_word", "lstrip", "rstrip"):  # a flag that looks past the match: kept whatever the texts
        assert _passes_matter(_added(["ab", "cd"], **{flag: True})) is True


class _Counted(str):
    """A token's text that counts the operations that look into it."""

    calls = 0

    def _count(name):
        def op(self, *args):
            _Counted.calls += 1
            return getattr(str, name)(self, *args)
        return op

    __contains__, __iter__, __getitem__ = _count("__contains__"), _count("__iter__"), _count("__getitem__")
    find, startswith, endswith = _count("find"), _count("startswith"), _count("endswith")


def test_the_work_grows_with_the_number_of_added_tokens_not_its_square():
    """600 tokens no two of which overlap (the case that reads them all): a few reads of each text, where comparing
    every pair took 600 x 599 looks."""
    for n in (150, 600):
        added = _added([_Counted(f"<|tok_{i:05d}|>") for i in range(n)])
        _Counted.calls = 0
        assert _passes_matter(added) is False
        assert _Counted.calls <= 4 * n, (n, _Counted.calls)
    spec = {"normalizer": None, "added_tokens": _added([f"<|tok_{i:05d}|>" for i in range(4000)])}
    assert not any(t[-1] for t in ids_form(spec)["added_tokens"])  # 4,000: the flags dropped, no two overlap
    spec["added_tokens"].append({"id": 9999, "content": "5|>x", "normalized": True})  # overlaps `<|tok_00005|>`
    assert any(t[-1] for t in ids_form(spec)["added_tokens"])
