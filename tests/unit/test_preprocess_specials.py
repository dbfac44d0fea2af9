"""A special token's text inside a document is plain text to preprocess: only --append_eos puts an EOS (or any
special id) into a token file. Literal `</s>`, `<s>` and `<pad>` in Python sources had become EOS/BOS/pad ids
(code.bin: 11,514 EOS for 11,168 documents): false document boundaries in packed samples."""
from __future__ import annotations

import numpy as np
import pytest

from data_helpers import make_texts, write_jsonl
from pretrain_cli.data.indexed import open_token_file
from pretrain_cli.data.preprocess import Job, preprocess
from pretrain_cli.data.tokenizer import Tokenizer, _roles_for, load_tokenizer
from pretrain_cli.data.tokenizer_training import train_bpe

SPECIALS = ["<pad>", "<s>", "</s>", "<unk>", "<|im_start|>"]


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("tok") / "tok"
    tok = train_bpe(make_texts(200) + ['if x == "</s>": pad = "<pad>"'] * 20, 400, SPECIALS, min_frequency=1)
    Tokenizer(tok, str(d), _roles_for(SPECIALS), "").save(d)
    return d


@pytest.mark.parametrize("workers", [1, 2])
def test_special_token_text_in_a_document_is_plain_text(tmp_path, tok_dir, workers):
    texts = ['eos = "</s>"; bos = "<s>"\npad = "<pad>" # <unk>', "a chat marker <|im_start|>user mid-text",
             "</s>", "plain words only."]
    write_jsonl(tmp_path / "a.jsonl", texts)
    assert preprocess(Job((str(tmp_path / "a.jsonl"),), str(tmp_path / "o"), str(tok_dir), append_eos=True,
                          workers=workers)) == 0
    tok = load_tokenizer(tok_dir)
    special_ids = {tok.token_to_id(t) for t in SPECIALS}
    ds = open_token_file(tmp_path / "o")
    assert ds.num_documents == len(texts)
    for i, text in enumerate(texts):
        ids = ds.get(i).tolist()
        assert ids[-1] == tok.eos_token_id  # the one --append_eos added ...
        assert not special_ids & set(ids[:-1]), (text, ids)  # ... and no other special id
        assert tok.decode(ids[:-1]) == text
    assert int(np.sum(ds.data == tok.eos_token_id)) == len(texts)


def test_prompt_encoding_still_parses_special_tokens(tok_dir):
    """generate's and eval's prompts go through `load_tokenizer(...).encode`, which preprocess leaves as it was: a
    special token typed in a prompt is still that token (a separate question)."""
    tok = load_tokenizer(tok_dir)
    assert tok.encode("</s>") == [tok.eos_token_id] and tok.encode("<pad>") == [tok.pad_token_id]
    assert tok.for_documents("text").encode("</s>") != [tok.eos_token_id]
    assert load_tokenizer(tok_dir).encode("</s>") == [tok.eos_token_id]  # a flag of that one loaded copy only


def test_the_fingerprint_does_not_change_with_the_flag(tok_dir):
    """Token files are matched to tokenizers by fingerprint (merge-data, check, train): encoding documents'
    special tokens as text is how preprocess uses the tokenizer, not another tokenizer."""
    a, b = load_tokenizer(tok_dir), load_tokenizer(tok_dir).for_documents("text")
    assert a.fingerprint == b.fingerprint and a.sha256 == b.sha256
