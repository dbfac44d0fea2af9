"""A resume's tokenizer against its checkpoint's, and a continue_training run's against its model directory's: one
tokenizer with two fingerprints (GPT-2's vocab.json + merges.txt and its own tokenizer.json: an added token's
`normalized` flag differs, the ids do not) resumes; another is refused naming the key that supplied it; a copy byte
for byte is never parsed; a model directory carrying another tokenizer is said in one note."""
import json
import shutil

import pytest
from run_helpers import BASE
from tokenizer_forms import edited as _edited, gpt2_style as _gpt2_style, spaced as _spaced

from pretrain_cli.config.parser import parse_config
from pretrain_cli.data.tokenizer import export_files, load_tokenizer
from pretrain_cli.errors import UserError
from pretrain_cli.training.resume_checks import check_tokenizer
from pretrain_cli.training.tokenizer_lineage import continued_tokenizer, same_ids


def _checkpoint(tmp_path, tokenizer_dir, arguments=None):
    ckpt = tmp_path / "out" / "checkpoint-4"
    shutil.rmtree(ckpt, ignore_errors=True)
    ckpt.mkdir(parents=True)
    export_files(tokenizer_dir, ckpt)  # what a save writes
    (ckpt / "args.json").write_text(json.dumps({"arguments": arguments or {}}))
    return ckpt


def test_one_tokenizer_in_its_two_forms_resumes_either_way(tmp_path):
    whole, files = _gpt2_style(tmp_path)
    a, b = load_tokenizer(whole), load_tokenizer(files)
    assert a.fingerprint != b.fingerprint and a.encode("hello<|endoftext|> 12") == b.encode("hello<|endoftext|> 12")
    assert same_ids(a, b)
    check_tokenizer(_checkpoint(tmp_path, whole), b)  # (refused before: the fingerprints differ)
    check_tokenizer(_checkpoint(tmp_path, files), a)


def test_a_tokenizer_giving_other_ids_is_still_refused(tmp_path):
    whole, _ = _gpt2_style(tmp_path)
    spaced = _spaced(tmp_path, whole)  # the same vocabulary and merges, another pre-tokenizer
    assert load_tokenizer(spaced).encode("hello world") != load_tokenizer(whole).encode("hello world")
    added, _ = _gpt2_style(tmp_path, extra="<|pad|>")  # one added token more
    for other in (spaced, added):
        assert not same_ids(load_tokenizer(whole), load_tokenizer(other))
        with pytest.raises(UserError, match="its token ids would mean other tokens"):
            check_tokenizer(_checkpoint(tmp_path, whole), load_tokenizer(other))


def _with_added(tmp_path, whole, name: str, flags: dict):
    """`whole` with the added tokens `flags` names (content -> `normalized`) after its own, in that order."""
    from tokenizers import AddedToken, Tokenizer

    tok = Tokenizer.from_file(str(whole / "tokenizer.json"))
    tok.add_tokens([AddedToken(text, normalized=flag) for text, flag in flags.items()])
    (tmp_path / name).mkdir()
    tok.save(str(tmp_path / name / "tokenizer.json"))
    return load_tokenizer(tmp_path / name)


def test_added_tokens_normalized_flag_counts_where_two_of_them_overlap(tmp_path):
    """With no normalizer `normalized` only orders two passes of matching (the tokens flagged false first): it
    changes no split unless one added token's match can share a character with another's. `ab` and `bc` can: "xabc"
    is x+`ab`+c with `ab` matched first and xa+`bc` with `bc` first."""
    whole, _ = _gpt2_style(tmp_path)
    a = _with_added(tmp_path, whole, "ab_first", {"ab": False, "bc": True})
    b = _with_added(tmp_path, whole, "bc_first", {"ab": True, "bc": False})
    assert a.encode("xabc abc") != b.encode("xabc abc")
    assert not same_ids(a, b)
    with pytest.raises(UserError, match="its token ids would mean other tokens"):
        check_tokenizer(_checkpoint(tmp_path, tmp_path / "ab_first"), b)
    # tokens that cannot overlap: the flags change no split, one tokenizer
    c = _with_added(tmp_path, whole, "apart", {"ab": False, "cd": True})
    d = _with_added(tmp_path, whole, "apart_flipped", {"ab": True, "cd": False})
    assert c.fingerprint != d.fingerprint and c.encode("xabcd abcd") == d.encode("xabcd abcd") and same_ids(c, d)


def test_a_vocabulary_token_named_trim_offsets_is_a_token(tmp_path):
    """Only ByteLevel's `trim_offsets` option moves offsets and not ids; a vocabulary entry of that name is one
    token more (a 301-token tokenizer is not its 300-token base)."""
    whole, _ = _gpt2_style(tmp_path)
    more = _edited(tmp_path, whole, "more", lambda spec: spec["model"]["vocab"].update(trim_offsets=300))
    base, other = load_tokenizer(whole), load_tokenizer(more)
    assert (base.vocab_size, other.vocab_size) == (300, 301) and not same_ids(base, other)
    trims = _edited(tmp_path, whole, "trims", lambda spec: spec["pre_tokenizer"].update(trim_offsets=False))
    assert same_ids(base, load_tokenizer(trims))  # the option itself: offsets only


def test_token_files_made_with_either_form_are_the_run_s(tmp_path):
    """A resume whose tokenizer is the other form of its checkpoint's passes `check_tokenizer`, so the token files
    made with either form pass the sidecar check by the same rule: the sidecar records the ids' fingerprint too.
    One written before it records the tokenizer's fingerprint only, which cannot tell: judged by that alone."""
    from data_helpers import make_texts, run_preprocess, write_jsonl

    from pretrain_cli.data import check_tokenizer as check_files

    whole, files = _gpt2_style(tmp_path)
    write_jsonl(tmp_path / "c.jsonl", make_texts(20))
    prefix = tmp_path / "d" / "c"
    assert run_preprocess("--input_path", tmp_path / "c.jsonl", "--output_prefix", prefix, "--tokenizer", whole) == 0
    check_tokenizer(_checkpoint(tmp_path, whole), load_tokenizer(files))
    check_files([str(prefix)], load_tokenizer(files))  # (refused before: the fingerprints differ)
    with pytest.raises(UserError, match="made by another tokenizer than"):
        check_files([str(prefix)], load_tokenizer(_spaced(tmp_path, whole)))
    sidecar = json.loads((tmp_path / "d" / "c.json").read_text())
    del sidecar["tokenizer_ids_fingerprint"]
    (tmp_path / "d" / "c.json").write_text(json.dumps(sidecar))
    check_files([str(prefix)], load_tokenizer(whole))
    with pytest.raises(UserError, match="made by another tokenizer than"):
        check_files([str(prefix)], load_tokenizer(files))


def test_token_files_of_the_two_forms_merge_and_blend(tmp_path):
    """Files made with the two forms of one tokenizer are one tokenizer's to merge-data and to a run without a
    tokenizer too; the merged sidecar records a fingerprint (the first input's) and the ids', so a run of either
    form reads it and one of another tokenizer is still refused."""
    from data_helpers import make_texts, run_preprocess, write_jsonl

    from pretrain_cli.data import check_tokenizer as check_files
    from pretrain_cli.data.merge import merge
    from pretrain_cli.data.token_file_tokenizers import tokenizer_problems

    whole, files = _gpt2_style(tmp_path)
    for name, tok in (("a", whole), ("b", files)):
        write_jsonl(tmp_path / f"{name}.jsonl", make_texts(20, seed=len(name) + ord(name)))
        assert run_preprocess("--input_path", tmp_path / f"{name}.jsonl", "--output_prefix", tmp_path / "d" / name,
                              "--tokenizer", tok, "--append_eos") == 0
    metas = [json.loads((tmp_path / "d" / f"{n}.json").read_text()) for n in "ab"]
    assert metas[0]["tokenizer_fingerprint"] != metas[1]["tokenizer_fingerprint"]
    assert tokenizer_problems([(str(tmp_path / "d" / n), m) for n, m in zip("ab", metas)]) == []
    meta = merge(str(tmp_path / "m"), [str(tmp_path / "d" / n) for n in "ab"])
    assert meta["tokenizer_fingerprint"] == metas[0]["tokenizer_fingerprint"]
    for tok in (whole, files):
        check_files([str(tmp_path / "m")], load_tokenizer(tok))
    with pytest.raises(UserError, match="made by another tokenizer than"):
        check_files([str(tmp_path / "m")], load_tokenizer(_spaced(tmp_path, whole)))


def test_the_refusal_names_the_key_that_supplied_each_tokenizer(tmp_path):
    """The run's from model_name_or_path (no tokenizer_name_or_path): named so, not tokenizer_name_or_path; the
    checkpoint's from its args.json's model_name_or_path where its run named no tokenizer."""
    whole, _ = _gpt2_style(tmp_path)
    spaced = _spaced(tmp_path, whole)
    ckpt = _checkpoint(tmp_path, whole, {"model_name_or_path": "models/gpt2-small"})
    args = parse_config(None, [*BASE, "--model_name_or_path", str(spaced)])
    with pytest.raises(UserError) as refused:
        check_tokenizer(ckpt, load_tokenizer(spaced), args=args)
    said = str(refused.value)
    assert said.startswith(f"model_name_or_path: {spaced} (fingerprint "), said
    assert f"was trained with (models/gpt2-small, fingerprint {load_tokenizer(whole).fingerprint[:12]})" in said
    named = parse_config(None, [*BASE, "--tokenizer_name_or_path", str(spaced)])
    with pytest.raises(UserError, match=f"^tokenizer_name_or_path: {spaced} "):
        check_tokenizer(ckpt, load_tokenizer(spaced), args=named)


def test_a_byte_for_byte_copy_is_not_parsed(tmp_path, monkeypatch):
    """A save copies the run's tokenizer.json byte for byte: the check compares the bytes' sha256 and parses
    nothing (a Qwen-size tokenizer is ~15 MB of JSON)."""
    import pretrain_cli.data.tokenizer as tokenizer_module

    whole, _ = _gpt2_style(tmp_path)
    run_tok, ckpt = load_tokenizer(whole), _checkpoint(tmp_path, whole)

    def parsed(*_):
        raise AssertionError("the checkpoint's tokenizer was parsed")

    monkeypatch.setattr(tokenizer_module, "load_tokenizer", parsed)
    check_tokenizer(ckpt, run_tok)
    assert continued_tokenizer(ckpt, run_tok) == []
    (ckpt / "tokenizer.json").write_text((ckpt / "tokenizer.json").read_text() + "\n")  # one byte more: parsed
    with pytest.raises(AssertionError, match="was parsed"):
        check_tokenizer(ckpt, run_tok)


def test_a_continued_model_directory_with_another_tokenizer_is_said_once(tmp_path):
    whole, files = _gpt2_style(tmp_path)
    spaced = _spaced(tmp_path, whole)
    model_dir = _checkpoint(tmp_path, whole)  # (an export's tokenizer files, as a checkpoint's)
    a, other = load_tokenizer(whole), load_tokenizer(spaced)
    assert continued_tokenizer(model_dir, a) == [] and continued_tokenizer(model_dir, load_tokenizer(files)) == []
    assert continued_tokenizer(model_dir, load_tokenizer(model_dir)) == []  # the directory's own
    [note] = continued_tokenizer(model_dir, other)
    assert note == (f"tokenizer_name_or_path: {spaced} (fingerprint {other.fingerprint[:12]}) is not the tokenizer of "
                    f"{model_dir} (fingerprint {a.fingerprint[:12]}), whose weights continue_training loads: their "
                    f"embedding rows were trained on its ids, which mean other tokens here; leave "
                    f"tokenizer_name_or_path out (or set it to {model_dir}) unless a new tokenizer is meant")


def test_preprocess_replacing_files_of_the_other_form_names_no_other_tokenizer(tmp_path, capsys):
    """A re-run of preprocess with the other form of the tokenizer that made the files (vocab.json + merges.txt for
    its tokenizer.json) replaces them, saying other inputs or settings (its fingerprint differs, its ids do not: a
    run reads the files it replaces); a tokenizer giving other ids is named as another tokenizer."""
    from data_helpers import make_texts, run_preprocess, write_jsonl

    whole, files = _gpt2_style(tmp_path)
    write_jsonl(tmp_path / "c.jsonl", make_texts(20))
    out = tmp_path / "d" / "c"
    for tok, said in ((whole, None), (files, "other inputs or settings"), (whole, "other inputs or settings"),
                      (_spaced(tmp_path, whole), "another tokenizer")):
        capsys.readouterr()
        assert run_preprocess("--input_path", tmp_path / "c.jsonl", "--output_prefix", out, "--tokenizer", tok) == 0
        err = capsys.readouterr().err
        # (the line, not the word: the tmp path holds "replacing", and the no --append_eos note names it)
        assert (f"replacing {out}.bin/.idx, made from {said};" in err) if said else "preprocess: replacing" not in err, \
            (tok, err)
