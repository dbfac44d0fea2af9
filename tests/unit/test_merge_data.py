"""merge-data: its output prefix checked before any work, as preprocess checks it, and inputs with and without EOS
refused."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

from data_helpers import make_texts, make_tokenizer, run_preprocess, write_jsonl, write_mmidx_reference
from pretrain_cli import cli
from pretrain_cli.data import merge as merge_module
from pretrain_cli.data import repeats, token_file_tokenizers, window_keys
from pretrain_cli.data.indexed import open_token_file, read_sidecar
from pretrain_cli.data.merge import merge
from pretrain_cli.errors import UserError


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    return make_tokenizer(tmp_path_factory.mktemp("tok") / "tok")


def test_the_output_prefix_is_checked_before_any_work(tmp_path, monkeypatch, capsys):
    (tmp_path / "tasks").mkdir()
    write_mmidx_reference(str(tmp_path / "tasks" / "a"), [[1, 2], [3]])
    (tmp_path / "corpus.txt").write_text("x")
    (tmp_path / "jd" / "x.bin").mkdir(parents=True)
    monkeypatch.setattr(merge_module, "open_token_file", lambda p: pytest.fail("an input opened before the check"))
    cases = ((f"{tmp_path / 'joined2'}/", f"output '{tmp_path / 'joined2'}/': names a directory, not the files' name; "
                                          f"add one, e.g. {tmp_path / 'joined2' / 'corpus'}"),
             (f"{tmp_path / 'corpus.txt'}/x", f"output {tmp_path / 'corpus.txt'}/x: {tmp_path / 'corpus.txt'} is a "
                                              "file, not a directory; choose a prefix in a directory"),
             (str(tmp_path / "jd" / "x"), f"output {tmp_path / 'jd' / 'x'}: {tmp_path / 'jd' / 'x.bin'} is a "
                                          "directory, where an output file goes; move it or choose another prefix"))
    for out, want in cases:
        with pytest.raises(UserError) as e:
            merge(out, [tmp_path / "tasks"])
        assert str(e.value) == want
        assert cli.main(["merge-data", out, str(tmp_path / "tasks")]) == 2
        assert capsys.readouterr().err == f"error: {want}\n"
    assert not (tmp_path / "joined2").exists() and os.listdir(tmp_path / "jd") == ["x.bin"]


def test_inputs_with_and_without_eos_are_refused(tmp_path, tok_dir, capsys):
    write_jsonl(tmp_path / "t.jsonl", make_texts(20, seed=3))
    argv = ["--input_path", tmp_path / "t.jsonl", "--tokenizer", tok_dir]
    run_preprocess(*argv, "--output_prefix", tmp_path / "d" / "a", "--append_eos")
    run_preprocess(*argv, "--output_prefix", tmp_path / "d" / "b")
    run_preprocess(*argv, "--output_prefix", tmp_path / "d" / "c", "--append_eos")
    capsys.readouterr()
    assert cli.main(["merge-data", str(tmp_path / "m"), str(tmp_path / "d")]) == 2
    want = (f"error: {tmp_path / 'd' / 'b'}.json: made without --append_eos, unlike {tmp_path / 'd' / 'a'}.json "
            "(eos_appended); re-run preprocess for one of them so that all inputs agree\n")
    assert capsys.readouterr().err == want
    assert not list(tmp_path.glob("m*"))
    meta = merge(str(tmp_path / "m"), [tmp_path / "d" / "a", tmp_path / "d" / "c"])  # the same setting: joined
    assert meta["eos_appended"] is True
    assert json.loads((tmp_path / "m.json").read_text())["eos_appended"] is True


def test_an_input_repeated_inside_another_is_said(tmp_path, capsys):
    """`all` (preprocessed from man + code) merged with `man` and `code` held both twice without a word: each input
    whose sequences appear in a row in another, or that is the same as another, is named before the write."""
    docs = [[i % 7 + 1] * (i % 5 + 1) + [i] for i in range(12)]
    for d in "def":
        (tmp_path / d).mkdir()
    d = tmp_path / "d"
    write_mmidx_reference(str(d / "all"), docs)
    write_mmidx_reference(str(d / "code"), docs[8:])
    write_mmidx_reference(str(d / "man"), docs[:8])
    write_mmidx_reference(str(tmp_path / "e" / "man"), docs[:8])  # a copy
    write_mmidx_reference(str(tmp_path / "e" / "code"), docs[8:])
    write_mmidx_reference(str(tmp_path / "f" / "other"), [x[:-1] + [99] for x in docs[:8]])  # the lengths only
    tail = "; joined, they are trained on twice: drop one input unless you mean to repeat them"
    assert cli.main(["merge-data", str(tmp_path / "j"), str(d), str(tmp_path / "e" / "man"),
                     str(tmp_path / "f" / "other")]) == 0
    assert capsys.readouterr().err.splitlines() == [
        f"merge-data: warning: {d / 'code'}: its 4 sequences are sequences 8 to 11 of 12 of {d / 'all'}{tail}",
        f"merge-data: warning: {tmp_path / 'e' / 'man'}: its 8 sequences are sequences 0 to 7 of 12 of {d / 'all'}"
        f" and those of {d / 'man'}; joined, they are trained on 3 times: drop the repeats unless you mean to repeat "
        "them"]  # man and its copy e/man: one line, every input they are in (d/man's own said "twice", missing e/man)
    assert cli.main(["merge-data", str(tmp_path / "k"), str(tmp_path / "e" / "code"), str(d / "code")]) == 0
    assert capsys.readouterr().err == f"merge-data: warning: {d / 'code'}: its 4 sequences are those of " \
                                      f"{tmp_path / 'e' / 'code'}{tail}\n"  # the later input named
    assert cli.main(["merge-data", str(tmp_path / "m"), str(d / "code"), str(d / "man"), str(tmp_path / "f")]) == 0
    assert capsys.readouterr().err == ""


def test_a_repeat_is_named_in_every_input_it_is_in_three_then_how_many_more(tmp_path):
    """A repeat was named in the first input it was found in alone; now in each (at most 3 named, then a count)."""
    docs = [[i, i + 1, i % 3] for i in range(1, 6)]
    write_mmidx_reference(str(tmp_path / "b"), docs)
    holders = []
    for k in range(5):  # k leading sequences of its own, then b's
        write_mmidx_reference(str(tmp_path / f"x{k}"), [[90 + k, j] for j in range(k + 1)] + docs)
        holders.append(open_token_file(tmp_path / f"x{k}"))
    lines = repeats.repeated_inputs([open_token_file(tmp_path / "b"), *holders])
    x = [tmp_path / f"x{k}" for k in range(5)]
    assert lines == [f"{tmp_path / 'b'}: its 5 sequences are sequences 1 to 5 of 6 of {x[0]}, sequences 2 to 6 of 7 "
                     f"of {x[1]}, sequences 3 to 7 of 8 of {x[2]} and those of 2 more inputs; joined, they are "
                     "trained on 6 times: drop the repeats unless you mean to repeat them"], lines


def test_identical_inputs_are_one_line_with_their_true_count_each_compared_once(tmp_path, monkeypatch):
    """x, y, z identical: x got no line, y "those of x ... twice", z "x and y ... 3 times"; now one line, 3 times, and
    with a larger input holding them all, 4. A copy is compared with the first of its kind only: 4 copies and one
    larger input are 4 comparisons (3 to group them, 1 with the larger), where each copy with every other was 10."""
    docs = [[i, i % 4, 7] for i in range(1, 9)]
    for name in "xyzw":
        write_mmidx_reference(str(tmp_path / name), docs)
    write_mmidx_reference(str(tmp_path / "big"), [[5, 5], *docs, [6, 6]])
    x, y, z, w, big = (open_token_file(tmp_path / n) for n in ("x", "y", "z", "w", "big"))
    assert repeats.repeated_inputs([x, y, z]) == [
        f"{tmp_path / 'z'}: its 8 sequences are those of {tmp_path / 'x'} and those of {tmp_path / 'y'}; joined, they "
        "are trained on 3 times: drop the repeats unless you mean to repeat them"]
    assert repeats.repeated_inputs([big, x, y, z]) == [
        f"{tmp_path / 'z'}: its 8 sequences are sequences 1 to 8 of 10 of {tmp_path / 'big'}, those of "
        f"{tmp_path / 'x'} and those of {tmp_path / 'y'}; joined, they are trained on 4 times: drop the repeats unless "
        "you mean to repeat them"]
    calls = []
    repeat_at = repeats._repeat_at
    monkeypatch.setattr(repeats, "_repeat_at",
                        lambda a, b, **kw: calls.append((a.prefix, b.prefix)) or repeat_at(a, b, **kw))
    assert len(repeats.repeated_inputs([x, y, z, w, big])) == 1
    assert len(calls) == 4, calls


def test_a_source_preprocessed_with_others_in_one_directory_is_found(tmp_path, tok_dir, capsys):
    """The case thought missed: `ab` preprocessed from a directory holding a.jsonl and b.jsonl, merged with `a` and
    `b` preprocessed alone. Our writer does not interleave the files: a's documents, then b's, in file order (with a
    pool of workers too), so each is in a row inside `ab`, and found there."""
    (tmp_path / "src").mkdir()
    write_jsonl(tmp_path / "src" / "a.jsonl", make_texts(30, seed=1))
    write_jsonl(tmp_path / "src" / "b.jsonl", make_texts(20, seed=2))
    for name, src, workers in (("ab", tmp_path / "src", "2"), ("a", tmp_path / "src" / "a.jsonl", "1"),
                               ("b", tmp_path / "src" / "b.jsonl", "1")):
        run_preprocess("--input_path", src, "--tokenizer", tok_dir, "--output_prefix", tmp_path / "t" / name,
                       "--append_eos", "--workers", workers)
    ab, a, b = (open_token_file(tmp_path / "t" / n) for n in ("ab", "a", "b"))
    assert np.array_equal(np.asarray(ab.sizes), np.concatenate([a.sizes, b.sizes]))  # in a row, a then b
    capsys.readouterr()
    assert cli.main(["merge-data", str(tmp_path / "m"), str(tmp_path / "t")]) == 0
    t, tail = tmp_path / "t", "; joined, they are trained on twice: drop one input unless you mean to repeat them"
    assert capsys.readouterr().err.splitlines() == [
        f"merge-data: warning: {t / 'a'}: its 30 sequences are sequences 0 to 29 of 50 of {t / 'ab'}{tail}",
        f"merge-data: warning: {t / 'b'}: its 20 sequences are sequences 30 to 49 of 50 of {t / 'ab'}{tail}"]


def _pair(tmp_path, a_docs, b_docs):
    write_mmidx_reference(str(tmp_path / "a"), a_docs)
    write_mmidx_reference(str(tmp_path / "b"), b_docs)
    return [open_token_file(tmp_path / "a"), open_token_file(tmp_path / "b")]


def test_a_copy_far_into_a_file_of_equal_lengths_is_found(tmp_path):
    """With every sequence 4 tokens long every start is a candidate by length; only the first 1000 were tried, so
    a copy of sequences 5000-5999 went unsaid. Every start is tried now, the first sequence's tokens first."""
    docs = np.random.default_rng(0).integers(0, 60000, (7000, 4)).tolist()
    lines = repeats.repeated_inputs(_pair(tmp_path, docs, docs[5000:6000]))
    assert lines == [f"{tmp_path / 'b'}: its 1,000 sequences are sequences 5,000 to 5,999 of 7,000 of {tmp_path / 'a'}"
                     "; joined, they are trained on twice: drop one input unless you mean to repeat them"]


@pytest.mark.parametrize("whole", [True, False])
def test_an_input_that_differs_inside_is_not_called_a_repeat(tmp_path, monkeypatch, whole):
    """[1,2] [3,4] [5,6] against [1,2] [9,9] [5,6]: the lengths and the first and last sequences agree, and only those
    were compared. The window is compared whole (under _WHOLE tokens) or at 8 interior sequences besides. The runs
    on either side of the one that differs are shared runs, each said (one unlike sequence hid both)."""
    if not whole:
        monkeypatch.setattr(repeats, "_WHOLE", 0)
    assert repeats.repeated_inputs(_pair(tmp_path, [[1, 2], [3, 4], [5, 6]], [[1, 2], [9, 9], [5, 6]])) == []
    docs = [[i, i + 1] for i in range(1, 40)]
    changed = [*docs[:21], [0, 0], *docs[22:]]  # sequence 21 of 0..38: one of the 10 compared
    tail = ("; joined, they are trained on twice: preprocess one of them again without that source unless you mean "
            "to repeat them")
    assert repeats.repeated_inputs(_pair(tmp_path, [[7, 7], *docs], changed)) == [
        f"{tmp_path / 'a'}: its sequences 1 to 21 of 40 (21 sequences) are sequences 0 to 20 of 39 of {tmp_path / 'b'}"
        f"{tail}", f"{tmp_path / 'a'}: its sequences 23 to 39 of 40 (17 sequences) are sequences 22 to 38 of 39 of "
                   f"{tmp_path / 'b'}{tail}"]
    assert len(repeats.repeated_inputs(_pair(tmp_path, [[7, 7], *docs], docs))) == 1  # the true repeat: said


def test_special_tokens_in_text_is_recorded_only_where_every_input_agrees(tmp_path, tok_dir, capsys):
    """The output's sidecar records the inputs' --special_tokens_in_text only when every input with a sidecar records
    the same one: a `special` input merged with one whose sidecar is from before the option was called `special`."""
    d = tmp_path / "d"
    for k, (name, mode) in enumerate((("s1", "special"), ("s2", "special"), ("t", "text"), ("old", "text"))):
        write_jsonl(tmp_path / f"{name}.jsonl", make_texts(10, seed=40 + k))
        assert run_preprocess("--input_path", tmp_path / f"{name}.jsonl", "--tokenizer", tok_dir, "--append_eos",
                              "--output_prefix", d / name, "--special_tokens_in_text", mode) == 0
    old = json.loads((d / "old.json").read_text())
    del old["special_tokens_in_text"]  # a sidecar written before the option
    (d / "old.json").write_text(json.dumps(old))
    capsys.readouterr()
    assert cli.main(["merge-data", str(tmp_path / "agree"), str(d / "s1"), str(d / "s2")]) == 0
    assert capsys.readouterr().err == ""
    assert read_sidecar(str(tmp_path / "agree"))["special_tokens_in_text"] == "special"
    for out, names, differ in (("mixed", ("s1", "t"), f"special: {d / 's1'}; text: {d / 't'}"),
                               ("missing", ("s1", "s2", "old"),
                                f"special: {d / 's1'} and 1 more; not recorded: {d / 'old'}")):
        assert cli.main(["merge-data", str(tmp_path / out), *(str(d / n) for n in names)]) == 0
        assert capsys.readouterr().err == (
            f"merge-data: note: the inputs' --special_tokens_in_text differ ({differ}): their special-token text is "
            f"not alike, so {tmp_path / out}.json records none\n")
        assert "special_tokens_in_text" not in read_sidecar(str(tmp_path / out))
    meta = merge(str(tmp_path / "olds"), [d / "old", tmp_path / "agree"])  # the merged `special` file: still known
    assert "special_tokens_in_text" not in meta
    assert merge(str(tmp_path / "both"), [d / "s1", tmp_path / "agree"])["special_tokens_in_text"] == "special"


def test_a_file_given_twice_is_joined_once_and_said_once(tmp_path, capsys, monkeypatch):
    """A directory and one of its files (or a file twice, under any spelling) is joined once, where it first comes,
    with one line naming each mention as typed."""
    docs = [[i % 7 + 1] * (i % 5 + 1) + [i] for i in range(12)]
    d = tmp_path / "d"
    d.mkdir()
    write_mmidx_reference(str(d / "code"), docs[8:])
    write_mmidx_reference(str(d / "man"), docs[:8])
    assert cli.main(["merge-data", str(tmp_path / "j"), str(d), str(d / "man")]) == 0
    assert capsys.readouterr().err == (f"merge-data: note: {d / 'man'} is given twice (in {d} and as {d / 'man'}): "
                                       f"joined once, where it first comes; to join it twice, give a copy under "
                                       f"another name\n")
    assert read_sidecar(str(tmp_path / "j"))["merged_from"] == [str(d / "code"), str(d / "man")]
    assert len(open_token_file(tmp_path / "j")) == 12
    lines = []
    monkeypatch.chdir(tmp_path)  # (a relative spelling of the same file is the same file)
    assert merge_module.expand_prefixes(["d/man", str(d / "man"), d, "d/man.idx"], lines.append) == ["d/man",
                                                                                                  str(d / "code")]
    assert lines == [f"note: d/man is given 4 times (as d/man, as {d / 'man'}, in {d} and as d/man.idx): joined "
                     f"once, where it first comes; to join it 4 times, give a copy under another name"]
    lines.clear()
    assert merge_module.expand_prefixes(["d/man.bin", "d/man.idx"], lines.append) == ["d/man"]
    assert lines == ["note: d/man is given twice (as d/man.bin and as d/man.idx): joined once, where it first comes; "
                     "to join it twice, give a copy under another name"]


def test_a_directory_given_twice_is_one_line_and_a_symlinked_one_the_same_files(tmp_path, capsys):
    """A directory twice is one line for its files, not one per file; through a symlinked directory (e -> d) its
    files are the same files, joined once, and an output there is one of the inputs (its writes would replace them)."""
    d, e = tmp_path / "d", tmp_path / "e"
    d.mkdir()
    for k in range(3):
        write_mmidx_reference(str(d / f"part{k}"), [[k + 1, 2], [3, k + 4]])
    e.symlink_to(d, target_is_directory=True)
    lines = []
    assert merge_module.expand_prefixes([d, d], lines.append) == [str(d / f"part{k}") for k in range(3)]
    assert lines == [f"note: 3 token files in {d} are given twice (in {d} and in {d}): each joined once, where it "
                     f"first comes; to join them twice, give copies under other names"]
    assert cli.main(["merge-data", str(tmp_path / "j"), str(d), str(e)]) == 0
    assert capsys.readouterr().err == (f"merge-data: note: 3 token files in {d} are given twice (in {d} and in {e}): "
                                       f"each joined once, where it first comes; to join them twice, give copies "
                                       f"under other names\n")
    assert read_sidecar(str(tmp_path / "j"))["merged_from"] == [str(d / f"part{k}") for k in range(3)]
    assert len(open_token_file(tmp_path / "j")) == 6
    before = (d / "part0.bin").read_bytes()
    with pytest.raises(UserError, match=rf"^{e / 'part0'}: the output is also an input; choose another output prefix$"):
        merge(str(e / "part0"), [d / "part0", d / "part1"])
    assert (d / "part0.bin").read_bytes() == before
    # a symlinked pair of files is a copy under another name: joined again, and said to be a repeat
    for ext in (".bin", ".idx"):
        (tmp_path / f"alias{ext}").symlink_to(d / f"part1{ext}")
    meta = merge(str(tmp_path / "r"), [d / "part1", tmp_path / "alias"], lines.append)
    assert meta["merged_from"] == [str(d / "part1"), str(tmp_path / "alias")] and meta["documents"] == 4
    assert lines[-1].startswith(f"warning: {tmp_path / 'alias'}: its 2 sequences are those of {d / 'part1'}; ")
    # an output whose files an input's links point at: its renames would replace the input's bytes
    before = (d / "part1.bin").read_bytes()
    with pytest.raises(UserError, match=rf"^{d / 'part1'}: the output's files are those {tmp_path / 'alias'}\.bin/"):
        merge(str(d / "part1"), [tmp_path / "alias", d / "part2"])
    assert (d / "part1.bin").read_bytes() == before


def test_the_summary_counts_the_inputs_without_a_sidecar(tmp_path):
    for k in range(2):
        write_mmidx_reference(str(tmp_path / f"a{k}"), [[1, 2], [3]])
    meta = merge(str(tmp_path / "one"), [tmp_path / "a0"])
    assert merge_module.merge_summary(str(tmp_path / "one"), meta).endswith(
        "; 1 input had no .json sidecar, so its tokenizer is unchecked")
    meta = merge(str(tmp_path / "two"), [tmp_path / "a0", tmp_path / "a1"])
    assert merge_module.merge_summary(str(tmp_path / "two"), meta).endswith(
        "; 2 inputs had no .json sidecar, so their tokenizer is unchecked")


def test_an_output_that_is_itself_a_link_is_replaced_not_written_through(tmp_path):
    """The output's own symlinks are not followed (the merge's renames replace a link, never its target): an output
    `link` whose files point at an input's is merged, and the input's bytes stay."""
    for k in range(2):
        write_mmidx_reference(str(tmp_path / f"p{k}"), [[1, 2], [3]])
    for ext in (".bin", ".idx"):
        (tmp_path / f"link{ext}").symlink_to(tmp_path / f"p0{ext}")
    before = (tmp_path / "p0.bin").read_bytes()
    meta = merge(str(tmp_path / "link"), [tmp_path / "p0", tmp_path / "p1"])
    assert meta["documents"] == 4 and not (tmp_path / "link.bin").is_symlink()
    assert (tmp_path / "p0.bin").read_bytes() == before


def test_two_forms_of_one_tokenizer_merge_in_any_order():
    """Sidecars of one tokenizer in two forms (fingerprints f1 and f2, one ids fingerprint X) and one from before the
    ids fingerprint (f1): each is judged against every sidecar accepted before it, so no order of the three is
    refused (B, A, C was: C against B alone), and another tokenizer still is."""
    a = {"tokenizer_fingerprint": "f1", "tokenizer_ids_fingerprint": "X"}
    b = {"tokenizer_fingerprint": "f2", "tokenizer_ids_fingerprint": "X"}
    c = {"tokenizer_fingerprint": "f1"}
    for order in ((a, b, c), (b, a, c), (c, a, b), (c, b, a)):
        assert token_file_tokenizers.tokenizer_problems([(f"p{i}", m) for i, m in enumerate(order)]) == [], order
    other = {"tokenizer_fingerprint": "f3"}
    assert len(token_file_tokenizers.tokenizer_problems([("p0", b), ("p1", a), ("p2", other)])) == 1


def _docs(n, seed, lengths=(1, 30)):
    rng = np.random.default_rng(seed)
    return [rng.integers(1, 1000, rng.integers(*lengths)).tolist() for _ in range(n)]


@pytest.mark.parametrize("lengths", [(1, 30), (4, 5)])  # lengths that vary, and every sequence 4 tokens long
def test_a_source_in_two_inputs_each_holding_others_is_said_naming_both(tmp_path, lengths):
    """`ab` (a + b) and `bc` (b + c): neither is inside the other, so b, held in both, went unsaid. Found now from
    the lengths (where those do not vary, lengths and first tokens), named with where it is in each; with `bd` too
    it is one line, 3 times; b itself merged as well is its own line, which says `ab` and `bc` both."""
    a, b, c, d = (_docs(n, seed, lengths) for seed, n in enumerate((20, 30, 25, 3)))
    for name, docs in (("ab", a + b), ("bc", b + c), ("bd", d + b), ("b", b), ("other", a + c)):
        write_mmidx_reference(str(tmp_path / name), docs)
    ab, bc, bd, b_alone, other = (open_token_file(tmp_path / n) for n in ("ab", "bc", "bd", "b", "other"))
    assert repeats.repeated_inputs([ab, bc]) == [
        f"{tmp_path / 'ab'}: its sequences 20 to 49 of 50 (30 sequences) are sequences 0 to 29 of 55 of "
        f"{tmp_path / 'bc'}; joined, they are trained on twice: preprocess one of them again without that source "
        "unless you mean to repeat them"]
    assert repeats.repeated_inputs([ab, bc, bd]) == [
        f"{tmp_path / 'ab'}: its sequences 20 to 49 of 50 (30 sequences) are sequences 0 to 29 of 55 of "
        f"{tmp_path / 'bc'} and sequences 3 to 32 of 33 of {tmp_path / 'bd'}; joined, they are trained on 3 times: "
        "preprocess all but one again without that source unless you mean to repeat them"]
    assert repeats.repeated_inputs([ab, bc, b_alone]) == [
        f"{tmp_path / 'b'}: its 30 sequences are sequences 20 to 49 of 50 of {tmp_path / 'ab'} and sequences 0 to 29 "
        f"of 55 of {tmp_path / 'bc'}; joined, they are trained on 3 times: drop the repeats unless you mean to repeat "
        "them"]
    assert repeats.repeated_inputs([ab, other]) == [  # `other` is a + c: a is said ...
        f"{tmp_path / 'ab'}: its sequences 0 to 19 of 50 (20 sequences) are sequences 0 to 19 of 45 of "
        f"{tmp_path / 'other'}; joined, they are trained on twice: preprocess one of them again without that source "
        "unless you mean to repeat them"]
    write_mmidx_reference(str(tmp_path / "same_lengths"), [[x + 1 for x in s] for s in b])
    assert repeats.repeated_inputs([ab, open_token_file(tmp_path / "same_lengths")]) == []  # ... not b's lengths alone


def test_a_shared_source_is_found_when_only_some_windows_are_kept(tmp_path, monkeypatch):
    """Past `window_keys.ANCHORS` windows only 1 in ceil(windows / ANCHORS) is kept, the same in each input: a run
    of 300 shared sequences still has anchors, and is grown to its whole extent from the lengths."""
    a, b, c = _docs(40, 1), _docs(300, 2), _docs(50, 3)
    monkeypatch.setattr(window_keys, "ANCHORS", 60)  # 7 times fewer windows than the 2 inputs hold
    lines = repeats.repeated_inputs(_pair(tmp_path, a + b, b + c))
    assert lines == [f"{tmp_path / 'a'}: its sequences 40 to 339 of 340 (300 sequences) are sequences 0 to 299 of 350 "
                     f"of {tmp_path / 'b'}; joined, they are trained on twice: preprocess one of them again without "
                     "that source unless you mean to repeat them"], lines
