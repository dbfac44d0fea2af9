"""`preprocess --special_tokens_in_text {text,special,extra}`: what a special token's text inside a document
becomes. `text` (the default) keeps a literal `</s>` from being a false EOS; `special` is transformers' default
(every special token's id); `extra` keeps a corpus's chat markers (`<|im_start|>`, special tokens with no role) as
their ids while the role tokens' text stays text. With only `text`, instruction data mixed into pretraining lost its
chat markers as ids, with no way back."""
from __future__ import annotations

import json
import random
import re

import numpy as np
import pytest
from tokenizers import Tokenizer as HFTokenizer

from data_helpers import make_texts, write_jsonl
from pretrain_cli import cli
from pretrain_cli.data import long_documents
from pretrain_cli.data.indexed import open_token_file, read_sidecar
from pretrain_cli.data.preprocess import Job, preprocess
from pretrain_cli.data.tokenizer import Tokenizer, _parts_before_model, _roles_for, load_tokenizer
from pretrain_cli.data.tokenizer_training import train_bpe

ROLES = ["<pad>", "<s>", "</s>", "<unk>"]
EXTRAS = ["<|im_start|>", "<|im_end|>"]
DOC = 'if tok == "</s>": pad = "<pad>"\n<|im_start|>user\nhello there<|im_end|>\n'


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("tok") / "tok"
    tok = train_bpe(make_texts(200) + [DOC] * 20, 400, ROLES + EXTRAS, min_frequency=1)
    Tokenizer(tok, str(d), _roles_for(ROLES), "").save(d)
    return d


def _ids(tok_dir, mode, text):
    return load_tokenizer(tok_dir).for_documents(mode).encode(text)


@pytest.mark.parametrize("mode,as_ids,as_text", [
    ("text", [], ROLES + EXTRAS),
    ("special", ["</s>", "<pad>", "<|im_start|>", "<|im_end|>"], []),
    ("extra", ["<|im_start|>", "<|im_end|>"], ["</s>", "<pad>"]),
])
@pytest.mark.parametrize("workers", [1, 2])
def test_each_mode_on_a_document_with_role_and_extra_special_tokens(tmp_path, tok_dir, mode, as_ids, as_text,
                                                                    workers):
    write_jsonl(tmp_path / "a.jsonl", [DOC, "plain words only."])
    assert preprocess(Job((str(tmp_path / "a.jsonl"),), str(tmp_path / "o"), str(tok_dir), append_eos=True,
                          workers=workers, special_tokens_in_text=mode)) == 0
    tok = load_tokenizer(tok_dir)
    ds = open_token_file(tmp_path / "o")
    ids = ds.get(0).tolist()
    assert ids[-1] == tok.eos_token_id and tok.decode(ids[:-1]) == DOC  # the text whole, whatever the mode
    body = ids[:-1]
    for t in as_ids:
        assert body.count(tok.token_to_id(t)) == 1, (mode, t)
    for t in as_text:
        assert tok.token_to_id(t) not in body, (mode, t)
    assert int(np.sum(ds.data == tok.eos_token_id)) == 2 + (mode == "special")  # --append_eos's, and DOC's `</s>`
    assert read_sidecar(str(tmp_path / "o"))["special_tokens_in_text"] == mode


def _random_texts(pieces, n, seed):
    rng = random.Random(seed)
    return ["".join(rng.choice(pieces) for _ in range(rng.randint(1, 24))) for _ in range(n)]


PIECES = ["<|im_start|>", "<|im_end|>", "</s>", "<pad>", "<s>", "<unk>", " ", "\n", "  ", "a", "bc", "é", "hello",
          "<|im", "_start|>", "|>", "<", ">", "/s", "user"]


def test_special_is_what_tokenizers_matches_by_default(tok_dir):
    """`special` (a copy whose specials lose the flag, under encode_special_tokens) gives tokenizers' own default."""
    plain = HFTokenizer.from_file(str(tok_dir / "tokenizer.json"))
    assert not plain.encode_special_tokens
    special = load_tokenizer(tok_dir).for_documents("special")
    for text in _random_texts(PIECES, 2000, seed=1):
        assert special.encode(text) == plain.encode(text, add_special_tokens=False).ids, text


def test_extra_is_special_where_no_role_token_occurs_and_text_around_its_markers(tok_dir):
    """`extra` equals `special` on text without a role token's text; on any text it equals encoding the parts
    between the extra tokens' text as `text` does and putting the extra ids between them."""
    special, extra, text = (load_tokenizer(tok_dir).for_documents(m) for m in ("special", "extra", "text"))
    extra_ids = {t: special.token_to_id(t) for t in EXTRAS}
    without_roles = [p for p in PIECES if not any(r in p for r in ROLES)]
    compared = 0
    for s in _random_texts(without_roles, 1000, seed=2):
        if not any(r in s for r in ROLES):  # (joined pieces could spell one)
            assert extra.encode(s) == special.encode(s), s
            compared += 1
    assert compared > 900
    marker = "(" + "|".join(map(re.escape, EXTRAS)) + ")"
    for s in _random_texts(PIECES, 2000, seed=3):
        want = []
        for k, part in enumerate(re.split(marker, s)):
            want += [extra_ids[part]] if k % 2 else text.encode(part) if part else []
        assert extra.encode(s) == want, s


def test_a_long_document_in_pieces_gives_the_ids_of_the_whole_in_every_mode(tmp_path, tok_dir, monkeypatch):
    """A long document is cut at spaces and newlines between non-whitespace; a matched special token never holds
    either, so the pieces' ids are the whole's (pieces forced here by a 64-character limit)."""
    doc = " ".join([DOC.replace("\n", " x\ny ")] * 40)
    write_jsonl(tmp_path / "a.jsonl", [doc])
    for mode in ("text", "special", "extra"):
        assert preprocess(Job((str(tmp_path / "a.jsonl"),), str(tmp_path / f"w{mode}"), str(tok_dir),
                              special_tokens_in_text=mode)) == 0
    monkeypatch.setattr(long_documents, "PIECE_CHARS", 64)
    for mode in ("text", "special", "extra"):
        assert long_documents.cuttable(load_tokenizer(tok_dir).for_documents(mode).pipeline())
        assert preprocess(Job((str(tmp_path / "a.jsonl"),), str(tmp_path / f"p{mode}"), str(tok_dir),
                              special_tokens_in_text=mode)) == 0
        whole, pieces = open_token_file(tmp_path / f"w{mode}").get(0), open_token_file(tmp_path / f"p{mode}").get(0)
        assert whole.tolist() == pieces.tolist() == _ids(tok_dir, mode, doc)


def test_the_choice_is_a_setting_a_rerun_with_another_rebuilds(tmp_path, tok_dir):
    write_jsonl(tmp_path / "a.jsonl", [DOC])
    said, noted = [], []

    def run(mode):
        said.clear()
        noted.clear()
        assert preprocess(Job((str(tmp_path / "a.jsonl"),), str(tmp_path / "o"), str(tok_dir),
                              special_tokens_in_text=mode), say=said.append, note=noted.append) == 0

    run("text")
    run("text")
    assert "already complete" in said[0]
    run("extra")
    assert any("replacing" in line and "other inputs or settings" in line for line in noted), noted
    assert open_token_file(tmp_path / "o").get(0).tolist() == _ids(tok_dir, "extra", DOC)
    run("extra")
    assert "already complete" in said[0]


def test_extra_with_a_tokenizer_without_extra_tokens_says_so(tmp_path):
    from data_helpers import make_tokenizer

    tok = make_tokenizer(tmp_path / "tok")
    write_jsonl(tmp_path / "a.jsonl", ["words [EOT] more"])
    noted = []
    assert preprocess(Job((str(tmp_path / "a.jsonl"),), str(tmp_path / "o"), str(tok), special_tokens_in_text="extra"),
                      note=noted.append) == 0
    assert any("no special token without a pad/bos/eos/unk role" in line for line in noted), noted


def test_the_command_line_option_and_inspect_data(tmp_path, tok_dir, capsys):
    write_jsonl(tmp_path / "a.jsonl", [DOC])
    assert cli.main(["preprocess", "--input_path", str(tmp_path / "a.jsonl"), "--output_prefix", str(tmp_path / "o"),
                     "--tokenizer", str(tok_dir), "--special_tokens_in_text", "extra"]) == 0
    assert open_token_file(tmp_path / "o").get(0).tolist() == _ids(tok_dir, "extra", DOC)
    capsys.readouterr()
    assert cli.main(["inspect-data", str(tmp_path / "o")]) == 0
    assert "special tokens' text in documents became: extra (preprocess --special_tokens_in_text)" in \
        capsys.readouterr().out
    assert cli.main(["inspect-data", str(tmp_path / "o"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["special_tokens_in_text"] == "extra"
    assert cli.main(["inspect-data", str(tmp_path)]) == 0
    assert "special tokens' text: extra" in capsys.readouterr().out
    assert cli.main(["preprocess", "--input_path", "x", "--output_prefix", "y", "--tokenizer", "z",
                     "--special_tokens_in_text", "all"]) == 2
    assert "invalid choice: 'all' (choose from 'text', 'special', 'extra')" in capsys.readouterr().err


def test_the_fingerprint_is_the_files_in_every_mode(tok_dir):
    """Token files are matched to tokenizers by fingerprint (merge-data, check, train): how preprocess encodes
    documents is a use of the tokenizer, not another tokenizer."""
    plain = load_tokenizer(tok_dir)
    for mode in ("text", "special", "extra"):
        tok = load_tokenizer(tok_dir).for_documents(mode)
        assert (tok.fingerprint, tok.fingerprints, tok.sha256) == (plain.fingerprint, plain.fingerprints, plain.sha256)
    assert load_tokenizer(tok_dir).extra_special_tokens() == EXTRAS


@pytest.mark.parametrize("mode", ["text", "special", "extra"])
def test_the_copy_is_made_from_the_parts_before_the_model_and_a_worker_keeps_only_it(tok_dir, mode):
    """`for_documents` parses only the serialised parts before the model (a Qwen-size model is ~15 MB of JSON), and a
    worker (`keep_original=False`) drops the tokenizer as its file says: the same ids and pipeline as a whole parse."""
    main = load_tokenizer(tok_dir).for_documents(mode)
    worker = load_tokenizer(tok_dir).for_documents(mode, keep_original=False)
    whole = json.loads(main._enc.to_str())
    assert list(whole)[-1] == "model" and main.pipeline() == {k: v for k, v in whole.items() if k != "model"}
    assert worker.pipeline() == main.pipeline()
    assert worker.encode(DOC) == main.encode(DOC) == _ids(tok_dir, mode, DOC)
    assert (worker._tok is None) == (mode != "text")  # "text" makes no copy: there is one tokenizer
    text = (tok_dir / "tokenizer.json").read_text()  # pretty-printed: whitespace between the parts
    parts, (a, b) = _parts_before_model(text)
    assert json.loads(text[a:b]) == json.loads(text)["added_tokens"] == parts["added_tokens"]
    assert "model" not in parts and parts["pre_tokenizer"] == json.loads(text)["pre_tokenizer"]


def test_extra_names_the_special_tokens_a_role_keeps_as_text(tmp_path):
    """Qwen's instruct tokenizers make the chat marker `<|im_end|>` the EOS: under `extra` it stayed text without a
    word, half a chat format. The note names each special token left text and its role, and what matches them."""
    d = tmp_path / "qtok"
    markers = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tok = train_bpe(make_texts(100) + ["<|im_start|>user\nhi<|im_end|>\n"] * 5, 350, markers, min_frequency=1)
    Tokenizer(tok, str(d), {"pad": "<|endoftext|>", "bos": None, "eos": "<|im_end|>", "unk": None}, "").save(d)
    write_jsonl(tmp_path / "a.jsonl", ["<|im_start|>user\nhi<|im_end|>\n"])
    noted = []
    assert preprocess(Job((str(tmp_path / "a.jsonl"),), str(tmp_path / "o"), str(d), special_tokens_in_text="extra"),
                      note=noted.append) == 0
    assert [line for line in noted if "--special_tokens_in_text" in line] == [
        "preprocess: note: --special_tokens_in_text extra: the text of <|endoftext|> (pad), <|im_end|> (eos) in a "
        f"document stays text, as those tokens have roles in {d}; use --special_tokens_in_text special to match them"]
    ids = open_token_file(tmp_path / "o").get(0).tolist()
    loaded = load_tokenizer(d)
    assert ids[0] == loaded.token_to_id("<|im_start|>") and loaded.eos_token_id not in ids  # the marker as text


def test_text_keeps_the_inputs_hash_of_files_made_before_the_option(tmp_path, monkeypatch):
    """`text` (the default) must keep the inputs hash sidecars written before --special_tokens_in_text hold, so a
    re-run on those files says complete instead of re-creating them. The literal is what the code before the option
    (da928064^) computed for this input and the shipped tokenizer; the file's key without its directory and time."""
    import os
    from pathlib import Path

    from pretrain_cli.data import tasks

    monkeypatch.setattr(tasks, "file_key", lambda p: f"{Path(p).name}\t{os.stat(p).st_size}\n")
    write_jsonl(tmp_path / "a.jsonl", ["one document </s> with <pad> in it", "another"])
    tok = Path(__file__).resolve().parents[2] / "data" / "tiny" / "tokenizer"
    hashes = {}
    for mode in ("text", "special"):
        assert preprocess(Job((str(tmp_path / "a.jsonl"),), str(tmp_path / mode), str(tok), append_eos=True,
                              special_tokens_in_text=mode)) == 0
        hashes[mode] = read_sidecar(str(tmp_path / mode))["inputs_sha256"]
    assert hashes["text"] == "8b4a402ed9078e7d1a0dd7fc73cb80684c337281391d7616d12e0dd070775811"
    assert hashes["special"] != hashes["text"]  # another choice: another file


def test_preprocess_help_does_not_import_numpy():
    """The choices are the command's own: importing them from data.tokenizer made `preprocess --help` import numpy
    with the data package (~120 ms)."""
    import subprocess
    import sys

    code = ("import sys; from pretrain_cli.cli import main\ntry:\n    main(['preprocess', '--help'])\n"
            "except SystemExit as e:\n    assert not e.code, e.code\nassert 'numpy' not in sys.modules, 'numpy imported'")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "--special_tokens_in_text {text,special,extra}" in out.stdout
