"""A long document is encoded in pieces (memory bounded by a piece: a 20 M-character one had taken 2.10 GiB), with
exactly the ids of the whole: proved at every cut point of mixed text for each admitted pre-tokenizer, and end to
end through preprocess."""
from __future__ import annotations

import os
import random

import pytest
from tokenizers import Regex, Tokenizer as HFTokenizer, models, normalizers, pre_tokenizers, trainers

from data_helpers import make_texts, make_tokenizer, write_jsonl
from pretrain_cli.data import long_documents
from pretrain_cli.data.indexed import open_token_file
from pretrain_cli.data.long_documents import GPT2_SPLIT, LLAMA3_SPLIT, cut, cuttable
from pretrain_cli.data.preprocess import Job, preprocess
from pretrain_cli.data.tokenizer import Tokenizer, load_tokenizer
from pretrain_cli.data.tokenizer_ids import QWEN2_SPLIT

# letters, digits, punctuation, every kind of whitespace run, NFC-composable accents, CJK, a non-breaking and an
# ideographic space, a record separator (Python's whitespace, not Unicode's) and a special token's text
_ALPHABET = list("ab cd\n\n  \t\r.,!?'s'll12345e\u0301\u00e9\u00a0\u3000\u4e2d\u6587<>/|-_\x1c\u2028") + [" "] * 4


def _text(rng, n):
    return "".join(rng.choice(_ALPHABET) for _ in range(n))


def _pipeline(split):
    """A byte-level BPE trained on mixed text with `split`'s pattern (None: GPT-2's ByteLevel with its own)."""
    rng = random.Random(1)
    tok = HFTokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    if split is None:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    else:
        tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(split), behavior="isolated"),
                                                     pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    trainer = trainers.BpeTrainer(vocab_size=500, min_frequency=1, special_tokens=["</s>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([_text(rng, 200) for _ in range(200)], trainer)
    return Tokenizer(tok, "t", {"eos": "</s>"}, "").for_documents("text")


@pytest.mark.parametrize("split", [QWEN2_SPLIT, LLAMA3_SPLIT, GPT2_SPLIT, None], ids=["qwen2", "llama3", "gpt2-split",
                                                                                    "gpt2-bytelevel"])
def test_every_cut_point_gives_the_ids_of_the_whole(split):
    """Llama 3's and Qwen2's patterns are cut after any newline run too (a blank line between paragraphs);
    GPT-2's only after a lone newline: its ids differ at the wider points, which its answer leaves out."""
    tok = _pipeline(split)
    points = cuttable(tok.pipeline())
    gpt2 = split in (GPT2_SPLIT, None)
    assert points is (long_documents._CUT if gpt2 else long_documents._CUT_AFTER_NEWLINES)
    rng, checked, differ, wider, wider_differ = random.Random(2), 0, 0, 0, 0
    for _ in range(120):
        text = _text(rng, rng.randint(3, 80)) + "</s>" * rng.randint(0, 1) + _text(rng, rng.randint(0, 20))
        whole = tok.encode(text)
        for m in points.finditer(text):
            assert tok.encode(text[: m.start()]) + tok.encode(text[m.start():]) == whole, (text, m.start())
            checked += 1
        for p in {m.start() for m in long_documents._CUT_AFTER_NEWLINES.finditer(text)} - {
                m.start() for m in long_documents._CUT.finditer(text)}:  # after a blank line, before a character
            wider += 1
            wider_differ += tok.encode(text[:p]) + tok.encode(text[p:]) != whole
        differ += sum(tok.encode(text[:p]) + tok.encode(text[p:]) != whole for p in range(1, len(text)))
    assert checked > 500 and differ > 100  # (an arbitrary cut is not exact: the cut points are what make it so)
    assert wider > 40 and (wider_differ > wider // 3 if gpt2 else wider_differ == 0), (wider, wider_differ)


def test_cut_keeps_the_text_and_bounds_the_pieces():
    rng = random.Random(3)
    text = " ".join(make_texts(400, seed=4)) + "\n" + "x" * 300 + "\n" + _text(rng, 3000)
    pieces = list(cut(text, 100))
    assert "".join(pieces) == text and len(pieces) > 40
    assert max(map(len, pieces)) >= 300 and sorted(map(len, pieces))[-2] <= 100  # the one run without a cut point
    assert list(cut("y" * 500, 100)) == ["y" * 500] and list(cut("short", 100)) == ["short"]


def test_only_pipelines_where_the_cut_is_exact_are_cut(tmp_path):
    ours = load_tokenizer(make_tokenizer(tmp_path / "tok"))  # train-tokenizer's Qwen2 pipeline
    spec = ours.pipeline()
    assert cuttable(spec)
    pre = spec["pre_tokenizer"]["pretokenizers"]
    assert not cuttable({**spec, "pre_tokenizer": {**pre[1], "add_prefix_space": True}})  # a space before each piece
    assert not cuttable({**spec, "pre_tokenizer": {"type": "Metaspace", "replacement": "\u2581",
                                                   "prepend_scheme": "first", "split": True}})
    assert not cuttable({**spec, "normalizer": {"type": "Prepend", "prepend": "\u2581"}})  # Llama 2's
    other = {**pre[0], "pattern": {"Regex": r"\S+|\s+"}}
    assert not cuttable({**spec, "pre_tokenizer": {**spec["pre_tokenizer"], "pretokenizers": [other, pre[1]]}})
    added = {"content": "a b", "special": False, "lstrip": False, "rstrip": False}
    assert not cuttable({**spec, "added_tokens": spec["added_tokens"] + [added]})
    assert not cuttable({**spec, "added_tokens": spec["added_tokens"] + [{**added, "content": "ab", "rstrip": True}]})
    assert cuttable({**spec, "added_tokens": spec["added_tokens"] + [{**added, "content": "a b", "special": True}]})


@pytest.mark.parametrize("workers", [1, 2])
def test_preprocess_encodes_a_long_document_in_pieces_with_the_ids_of_the_whole(tmp_path, monkeypatch, workers):
    tok_dir = make_tokenizer(tmp_path / "tok")
    tok = load_tokenizer(tok_dir)
    rng = random.Random(5)
    long_doc = "\n".join(" ".join(make_texts(30, seed=s)) for s in range(12)) + " </s> " + _text(rng, 2000)
    texts = ["short one.", long_doc, "short two.", long_doc[:700]]
    write_jsonl(tmp_path / "a.jsonl", texts)
    log = tmp_path / "pieces"  # (appended to by whichever process encodes: the pool's forked workers too)
    batch = Tokenizer.encode_batch

    def recorded(self, t):
        with open(log, "a") as f:
            f.write("".join(f"{os.getpid()} {len(x)}\n" for x in t))
        return batch(self, t)

    monkeypatch.setattr(Tokenizer, "encode_batch", recorded)
    monkeypatch.setattr(long_documents, "PIECE_CHARS", 500)
    monkeypatch.setattr(long_documents, "GROUP_CHARS", 1200)
    assert preprocess(Job((str(tmp_path / "a.jsonl"),), str(tmp_path / "o"), str(tok_dir), append_eos=True,
                          workers=workers)) == 0
    ds = open_token_file(tmp_path / "o")
    plain = load_tokenizer(tok_dir).for_documents("text")
    assert [ds.get(i).tolist() for i in range(4)] == [plain.encode(t) + [tok.eos_token_id] for t in texts]
    pids, seen = zip(*(map(int, line.split()) for line in log.read_text().splitlines()))
    assert max(seen) <= 500 < len(long_doc) // 10 and len(seen) > len(long_doc) // 500, max(seen)  # cut
    assert (os.getpid() in pids) == (workers == 1)  # with 2, the pool's processes encoded every piece


def test_paragraphs_between_blank_lines_are_cut_for_qwen2(tmp_path):
    """CJK paragraphs between blank lines have no space and no newline between two characters: they stayed one
    piece (~230 B/char). Qwen2's pattern (train-tokenizer's) is cut after the blank line, with the ids of the whole."""
    rng = random.Random(7)
    text = "\n\n".join("".join(chr(rng.randint(0x4E00, 0x4FFF)) for _ in range(60)) + "\u3002" for _ in range(40))
    tok = load_tokenizer(make_tokenizer(tmp_path / "tok")).for_documents("text")
    points = cuttable(tok.pipeline())
    assert list(cut(text, 200, long_documents._CUT)) == [text]  # the narrower points: none
    pieces = list(cut(text, 200, points))
    assert "".join(pieces) == text and len(pieces) > 10 and max(map(len, pieces)) <= 200
    assert [i for p in pieces for i in tok.encode(p)] == tok.encode(text)
