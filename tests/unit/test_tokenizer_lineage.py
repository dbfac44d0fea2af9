"""A resume's tokenizer against its checkpoint's, and a continue_training run's against its model directory's: one
tokenizer with two fingerprints (GPT-2's vocab.json + merges.txt and its own tokenizer.json: an added token's
`normalized` flag differs, the ids do not) resumes; another is refused naming the key that supplied it; a copy byte
for byte is never parsed; a model directory carrying another tokenizer is said in one note."""
import json
import shutil

import pytest
from run_helpers import BASE

from pretrain_cli.config.parser import parse_config
from pretrain_cli.data.tokenizer import export_files, load_tokenizer
from pretrain_cli.errors import UserError
from pretrain_cli.training.checkpoint import check_tokenizer
from pretrain_cli.training.tokenizer_lineage import continued_tokenizer, same_ids

TEXT = ["hello world this is a test of the tokenizer number %d" % i for i in range(200)]


def _gpt2_style(tmp_path, prefix_space: bool = False, extra: str | None = None):
    """(the tokenizer.json directory, the vocab.json + merges.txt directory) of one byte-level BPE, as GPT-2 ships
    both: its tokenizer.json flags <|endoftext|> normalized, the two files carry no such flag."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=prefix_space)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.train_from_iterator(TEXT, trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>"],
                                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.add_special_tokens([AddedToken("<|endoftext|>", normalized=True, special=True)])
    if extra:
        tok.add_special_tokens([AddedToken(extra, special=True)])
    name = f"json{'_space' * prefix_space}{'_' + extra.strip('<>') if extra else ''}"
    whole, files = tmp_path / name, tmp_path / f"{name}_vm"
    whole.mkdir()
    files.mkdir()
    tok.save(str(whole / "tokenizer.json"))
    tok.model.save(str(files))
    return whole, files


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
    spaced, _ = _gpt2_style(tmp_path, prefix_space=True)  # the same vocabulary and merges, another pre-tokenizer
    added, _ = _gpt2_style(tmp_path, extra="<|pad|>")  # one added token more
    for other in (spaced, added):
        assert not same_ids(load_tokenizer(whole), load_tokenizer(other))
        with pytest.raises(UserError, match="its token ids would mean other tokens"):
            check_tokenizer(_checkpoint(tmp_path, whole), load_tokenizer(other))


def test_the_refusal_names_the_key_that_supplied_each_tokenizer(tmp_path):
    """The run's from model_name_or_path (no tokenizer_name_or_path): named so, not tokenizer_name_or_path; the
    checkpoint's from its args.json's model_name_or_path where its run named no tokenizer."""
    whole, _ = _gpt2_style(tmp_path)
    spaced, _ = _gpt2_style(tmp_path, prefix_space=True)
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
    spaced, _ = _gpt2_style(tmp_path, prefix_space=True)
    model_dir = _checkpoint(tmp_path, whole)  # (an export's tokenizer files, as a checkpoint's)
    a, other = load_tokenizer(whole), load_tokenizer(spaced)
    assert continued_tokenizer(model_dir, a) == [] and continued_tokenizer(model_dir, load_tokenizer(files)) == []
    assert continued_tokenizer(model_dir, load_tokenizer(model_dir)) == []  # the directory's own
    [note] = continued_tokenizer(model_dir, other)
    assert note == (f"tokenizer_name_or_path: {spaced} (fingerprint {other.fingerprint[:12]}) is not the tokenizer of "
                    f"{model_dir} (fingerprint {a.fingerprint[:12]}), whose weights continue_training loads: their "
                    f"embedding rows were trained on its ids, which mean other tokens here; leave "
                    f"tokenizer_name_or_path out (or set it to {model_dir}) unless a new tokenizer is meant")
