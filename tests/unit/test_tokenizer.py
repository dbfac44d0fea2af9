"""Tokenizer loading, the train-tokenizer subcommand, HF compatibility."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from data_helpers import make_texts, make_tokenizer, write_jsonl
from pretrain_cli.commands import train_tokenizer as cmd
from pretrain_cli.data import tokenizer as tk
from pretrain_cli.data import tokenizer_ids, tokenizer_training
from pretrain_cli.errors import UserError


def _train(argv):
    p = argparse.ArgumentParser()
    cmd.add_arguments(p)
    return cmd.main(p.parse_args(argv))


def test_train_tokenizer_subcommand(tmp_path, capsys):
    corpus = write_jsonl(tmp_path / "c" / "a.jsonl", make_texts(300))
    (tmp_path / "c" / "b.txt").write_text("first paragraph\nstill first\n\nsecond paragraph\n")
    out = tmp_path / "tok"
    assert _train(["--input_path", str(tmp_path / "c"), "--output_dir", str(out), "--vocab_size", "320"]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["special_tokens_map.json", "tokenizer.json", "tokenizer_config.json"]
    assert not list(tmp_path.glob(".tok.tmp*"))
    tok = tk.load_tokenizer(out)
    assert tok.vocab_size == 320
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id) == (0, 1, 2)
    text = json.loads(corpus.read_text().splitlines()[0])["text"]
    assert tok.decode(tok.encode(text)) == text
    assert tok.encode_batch([text, "ü ok"]) == [tok.encode(text), tok.encode("ü ok")]  # byte-level: no UNK
    assert len(tok.sha256) == 64 and tok.sha256 == tk.load_tokenizer(out).sha256
    assert "train-tokenizer" in capsys.readouterr().out


def test_train_tokenizer_says_what_it_made_that_was_not_asked(tmp_path, capsys):
    """A corpus too small for --vocab_size gave fewer tokens without a word (a 4 MB corpus asked for 64,000 gave
    27,763), and the extra special tokens were not in the summary line."""
    write_jsonl(tmp_path / "a.jsonl", make_texts(40))
    out = tmp_path / "tok"
    assert _train(["--input_path", str(tmp_path / "a.jsonl"), "--output_dir", str(out), "--vocab_size", "5000",
                   "--special_tokens", "<pad>", "<s>", "</s>", "<unk>", "<|im_start|>", "<|im_end|>"]) == 0
    made = tk.load_tokenizer(out).vocab_size
    printed = capsys.readouterr()
    assert made < 5000 and ", extra <|im_start|> <|im_end|>, fingerprint " in printed.out
    assert (f"note: --vocab_size 5000: the corpus gave {made} tokens: every merge seen at least --min_frequency 2 "
            f"times is learned; more text or --min_frequency 1 gives more\n") in printed.err


def test_saved_tokenizer_loads_in_transformers(tmp_path):
    import transformers
    d = make_tokenizer(tmp_path / "tok")
    ours = tk.load_tokenizer(d)
    hf = transformers.PreTrainedTokenizerFast.from_pretrained(str(d))
    text = "the quick brown fox jumps over the lazy dog."
    assert hf(text, add_special_tokens=False)["input_ids"] == ours.encode(text)
    assert (hf.eos_token, hf.bos_token, hf.pad_token) == ("[EOT]", "[BOT]", "[PAD]")
    assert len(hf) == ours.vocab_size


def test_extra_special_tokens_are_special_in_transformers(tmp_path):
    """`<|im_start|>` was special in tokenizer.json but missing from both config files, so transformers'
    `all_special_tokens` and `all_special_ids` left it out; a run's export copies them. (Decoding with
    skip_special_tokens drops it either way: tokenizer.json flags it special.)"""
    import transformers

    write_jsonl(tmp_path / "a.jsonl", make_texts(100))
    out = tmp_path / "tok"
    assert _train(["--input_path", str(tmp_path / "a.jsonl"), "--output_dir", str(out), "--vocab_size", "300",
                   "--special_tokens", "<pad>", "<s>", "</s>", "<unk>", "<|im_start|>", "<|im_end|>"]) == 0
    (tmp_path / "run").mkdir()
    tk.export_files(out, tmp_path / "run")
    for d in (out, tmp_path / "run"):
        hf = transformers.AutoTokenizer.from_pretrained(str(d))
        assert hf.all_special_tokens == ["<s>", "</s>", "<unk>", "<pad>", "<|im_start|>", "<|im_end|>"], d
        assert set(hf.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>"])) <= set(hf.all_special_ids), d
        ids = hf("<|im_start|>the fox<|im_end|>", add_special_tokens=False)["input_ids"]
        assert hf.decode(ids, skip_special_tokens=True) == "the fox"
    config = json.loads((out / "tokenizer_config.json").read_text())
    assert config["additional_special_tokens"] == ["<|im_start|>", "<|im_end|>"]


def test_vocab_merges_directory_and_config_roles(tmp_path):
    d = make_tokenizer(tmp_path / "tok")
    ours = tk.load_tokenizer(d)
    model = json.loads((d / "tokenizer.json").read_text())["model"]
    legacy = tmp_path / "legacy"
    legacy.mkdir()
    (legacy / "vocab.json").write_text(json.dumps(model["vocab"]))
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    (legacy / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n")
    (legacy / "tokenizer_config.json").write_text(json.dumps({"eos_token": {"content": "[BOT]"}}))
    tok = tk.load_tokenizer(legacy)
    text = "alpha beta gamma"
    assert tok.encode(text) == ours.encode(text)
    assert tok.eos_token_id == ours.bos_token_id  # the config file wins over the fallback names


def test_load_errors(tmp_path):
    with pytest.raises(UserError, match="tokenizer directory not found.*train-tokenizer"):
        tk.load_tokenizer(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="no tokenizer.json.*train-tokenizer"):
        tk.load_tokenizer(tmp_path / "empty")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "tokenizer.json").write_text("{not json")
    with pytest.raises(UserError, match="cannot be loaded"):
        tk.load_tokenizer(tmp_path / "bad")


def test_train_errors(tmp_path):
    write_jsonl(tmp_path / "a.jsonl", ["x"])
    with pytest.raises(UserError, match="--vocab_size: 100 is below"):
        _train(["--input_path", str(tmp_path / "a.jsonl"), "--output_dir", str(tmp_path / "t"), "--vocab_size", "100"])
    write_jsonl(tmp_path / "e.jsonl", ["", "  "])
    with pytest.raises(UserError, match="no non-empty documents"):
        _train(["--input_path", str(tmp_path / "e.jsonl"), "--output_dir", str(tmp_path / "t"), "--vocab_size", "300"])
    # an output that is a file, or a directory holding a model whose ids the new tokenizer would not match
    (tmp_path / "f").write_text("x")
    with pytest.raises(UserError, match=r"^--output_dir .*f: is a file, not a directory; choose a directory$"):
        _train(["--input_path", str(tmp_path / "a.jsonl"), "--output_dir", str(tmp_path / "f"), "--vocab_size", "300"])
    for weights in ("model.safetensors", "checkpoint-5"):
        run = tmp_path / f"run-{weights}"
        (run / weights).mkdir(parents=True) if "checkpoint" in weights else (run.mkdir(), (run / weights).write_bytes(b""))
        (run / "tokenizer.json").write_text("old")
        with pytest.raises(UserError, match=rf"holds a trained model \({weights}\), whose token ids a new tokenizer"):
            _train(["--input_path", str(tmp_path / "a.jsonl"), "--output_dir", str(run), "--vocab_size", "300"])
        assert (run / "tokenizer.json").read_text() == "old"


# Whitespace runs, blank lines, CRLF, tabs, indented code, digits, CJK, composed and decomposed accents, a special
# token inside text: each is a place where two pre-tokenizers (or a normalizer) can split differently.
HARD_TEXTS = ["a\n\nb", "  two  spaces   end  ", "line\r\nnext\r\n\r\nlast\r", "\tx\t\ty\t", "x\n \n\ty",
              "def f(x):\n    if x:\n        return [x, 10_000]\n\n\nclass A:\n\tpass\n",
              "日本語のテキスト、中文，한국어 mixed", "café naïve Ångström", "cafe\u0301 n\u0303", "12345 3.14159",
              "it's you'll WE'RE", "end [EOT] next"]
_CODE = ["def f(x):\n    return x + 1\n\n", "if a:\r\n\tb = {'k': [1, 2]}\r\n", "日本語 中文 한국어 café naïve"]
_LLAMA3_SPLIT = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
                 r"""|\s*[\r\n]+|\s+(?!\S)|\s+""")


def _hf_written(kind: str, d):
    """A tokenizer directory as transformers writes one: Qwen2's class, or a Llama-3-style BPE (its own split
    pattern, no normalizer, a BOS post-processor) saved as PreTrainedTokenizerFast, or the plain GPT-2
    byte-level pre-tokenizer."""
    import transformers
    from tokenizers import Regex, decoders, pre_tokenizers, processors

    texts = make_texts(300) + _CODE * 30
    tok = tokenizer_training.train_bpe(texts, 600, tk.DEFAULT_SPECIALS, min_frequency=1)
    model = json.loads(tok.to_str())["model"]
    if kind == "hf-qwen2":
        hf = transformers.Qwen2Tokenizer(vocab=model["vocab"], merges=[tuple(m) for m in model["merges"]],
                                         eos_token="[EOT]", pad_token="[PAD]", unk_token=None)
    else:
        if kind == "hf-llama3":
            tok.normalizer = None
            tok.pre_tokenizer = pre_tokenizers.Sequence([
                pre_tokenizers.Split(Regex(_LLAMA3_SPLIT), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
            tok.post_processor = processors.TemplateProcessing(single="[BOT] $A", special_tokens=[("[BOT]", 1)])
        else:  # gpt2
            tok.normalizer = None
            tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        hf = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="[BOT]", eos_token="[EOT]",
                                                  pad_token="[PAD]")
    hf.save_pretrained(str(d))
    return d


@pytest.mark.parametrize("kind", ["ours", "hf-qwen2", "hf-llama3", "gpt2"])
def test_autotokenizer_on_an_exported_directory_gives_the_training_ids(tmp_path, kind):
    """What a run writes (`export_files` + the family's config.json) loads in AutoTokenizer to exactly
    tokenizer.json's ids, for every family; where transformers forces a class that cannot reproduce the
    tokenizer (qwen2 with a non-Qwen2 pipeline), `transformers_mismatch` says so, and only then."""
    import shutil

    import transformers

    from pretrain_cli.config.presets import PRESET_DIR

    src = tmp_path / "tok"
    if kind == "ours":
        write_jsonl(tmp_path / "c.jsonl", make_texts(300) + _CODE * 30)
        assert _train(["--input_path", str(tmp_path / "c.jsonl"), "--output_dir", str(src), "--vocab_size", "600"]) == 0
    else:
        _hf_written(kind, src)
    ours = tk.load_tokenizer(src)
    for family, preset in (("qwen2", "micro-qwen2"), ("qwen3", "qwen3-0.6b"), ("llama", "micro-llama")):
        out = tmp_path / family
        out.mkdir()
        shutil.copy(PRESET_DIR / preset / "config.json", out / "config.json")
        tk.export_files(src, out)
        hf = transformers.AutoTokenizer.from_pretrained(str(out))
        got = [hf.encode(t, add_special_tokens=False) for t in HARD_TEXTS]
        want = [ours.encode(t) for t in HARD_TEXTS]
        mismatch = tokenizer_ids.transformers_mismatch(ours, family)
        assert (got == want) == (mismatch is None), (kind, family, type(hf).__name__, mismatch)
        if kind in ("ours", "hf-qwen2") or family != "qwen2":
            assert got == want, (kind, family, type(hf).__name__)
        else:
            assert "differs from Qwen2's in" in mismatch and "PreTrainedTokenizerFast.from_pretrained" in mismatch
            assert hf.convert_tokens_to_ids("[EOT]") == ours.eos_token_id
        if kind == "ours":  # no special tokens added by default either
            assert [hf.encode(t) for t in HARD_TEXTS] == want
        assert json.loads((out / "tokenizer_config.json").read_text())["tokenizer_class"] == "PreTrainedTokenizerFast"


def test_export_of_a_vocab_merges_directory_writes_the_tokenizer_it_encoded_with(tmp_path):
    import transformers

    d = make_tokenizer(tmp_path / "tok")
    model = json.loads((d / "tokenizer.json").read_text())["model"]
    legacy = tmp_path / "legacy"
    legacy.mkdir()
    (legacy / "vocab.json").write_text(json.dumps(model["vocab"]))
    (legacy / "merges.txt").write_text("#version: 0.2\n" + "\n".join(" ".join(m) for m in model["merges"]) + "\n")
    out = tmp_path / "out"
    out.mkdir()
    (out / "config.json").write_text(json.dumps({"model_type": "llama"}))
    tk.export_files(legacy, out)
    ours = tk.load_tokenizer(legacy)
    hf = transformers.AutoTokenizer.from_pretrained(str(out))
    assert [hf.encode(t, add_special_tokens=False) for t in HARD_TEXTS] == [ours.encode(t) for t in HARD_TEXTS]
    assert hf.eos_token == "[EOT]"


def test_the_shipped_tiny_tokenizer_has_qwen2s_pipeline():
    """data/tiny/tokenizer is train-tokenizer's (Qwen2's pre-tokenizer): AutoTokenizer on a tiny run's export gives
    the training data's ids, so no run on it carries the mismatch note."""
    from pretrain_cli.data.tokenizer import load_tokenizer
    from pretrain_cli.data.tokenizer_ids import transformers_mismatch

    repo = Path(__file__).resolve().parents[2]
    assert transformers_mismatch(load_tokenizer(repo / "data" / "tiny" / "tokenizer"), "qwen2") is None


def test_special_tokens_take_their_roles_by_position(tmp_path, capsys):
    """`--special_tokens P B E U` gave no roles (special_tokens_map.json `{}`, then `preprocess --append_eos`: no
    EOS token); 2 tokens, a duplicate or an empty one were silently accepted."""
    write_jsonl(tmp_path / "c" / "a.jsonl", make_texts(100))
    argv = ["--input_path", str(tmp_path / "c"), "--output_dir", str(tmp_path / "tok"), "--vocab_size", "300"]
    assert _train(argv + ["--special_tokens", "<p>", "<b>", "<e>", "<u>", "<|x|>"]) == 0
    roles = json.loads((tmp_path / "tok" / "special_tokens_map.json").read_text())
    assert roles == {"pad_token": "<p>", "bos_token": "<b>", "eos_token": "<e>", "unk_token": "<u>",
                     "additional_special_tokens": ["<|x|>"]}
    tok = tk.load_tokenizer(tmp_path / "tok")
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id) == (0, 1, 2)
    assert tok.encode("a <|x|> b").count(tok.token_to_id("<|x|>")) == 1  # an extra one: kept whole, no role
    assert "pad=<p> bos=<b> eos=<e> unk=<u>" in capsys.readouterr().out
    for specials, want in ((["<p>", "<b>"], "2 tokens, but the first four are the pad, bos, eos and unk tokens"),
                           (["<p>", "<b>", "<b>", "<u>"], "'<b>' is given twice"),
                           (["<p>", "", "<e>", "<u>"], "token 2 is empty or blank")):
        with pytest.raises(UserError) as e:
            _train(["--input_path", str(tmp_path / "c"), "--output_dir", str(tmp_path / "refused"), "--vocab_size",
                    "300", "--special_tokens", *specials])
        assert str(e.value).startswith(f"--special_tokens: {want}") and "\n" not in str(e.value), str(e.value)
    assert not (tmp_path / "refused").exists()


def test_a_tokenizer_saved_by_transformers_reads_the_token_files_of_its_original(tmp_path):
    """transformers 5 writes a no-op post-processor into every tokenizer it saves (`save_pretrained`, as with a model
    from the hub); the ids do not change (`encode` adds no special tokens), yet its fingerprint did, so a run of
    that tokenizer refused the token files the original made. A sidecar written before the post-processor was left
    out of the fingerprint names the whole serialisation's: still accepted."""
    import transformers

    from pretrain_cli.data.token_file_tokenizers import tokenizer_mismatches

    src = make_tokenizer(tmp_path / "ours")
    transformers.AutoTokenizer.from_pretrained(str(src)).save_pretrained(str(tmp_path / "saved"))
    ours, saved = tk.load_tokenizer(src), tk.load_tokenizer(tmp_path / "saved")
    assert json.loads((tmp_path / "saved" / "tokenizer.json").read_text())["post_processor"] is not None
    text = " ".join(make_texts(5))
    assert saved.encode(text) == ours.encode(text) and saved.fingerprint == ours.fingerprint
    meta = {"vocab_size": ours.vocab_size, "eos_token_id": ours.eos_token_id, "tokenizer_fingerprint": ours.fingerprint}
    assert tokenizer_mismatches([("a", meta)], saved) == [] and tokenizer_mismatches([("a", meta)], ours) == []
    import hashlib

    whole = hashlib.sha256(saved._tok.to_str().encode("utf-8")).hexdigest()  # what such a sidecar holds
    assert whole != saved.fingerprint
    assert tokenizer_mismatches([("a", {**meta, "tokenizer_fingerprint": whole})], saved) == []
    assert tokenizer_mismatches([("a", {**meta, "tokenizer_fingerprint": "0" * 64})], saved) != []


def test_a_ctrl_c_during_training_ends_the_command_at_once(tmp_path, monkeypatch):
    """The Rust BPE trainer neither returns to Python during its merges nor stopped on a Ctrl-C while it read:
    `train-tokenizer` answered the key only when the whole training had ended, and then wrote the tokenizer. A
    trainer that swallows the interrupt as it does (here: its Python stand-in, which then trains for real) is left
    behind: the command raises KeyboardInterrupt (the CLI's `error: interrupted`, exit 130) and writes nothing."""
    import os
    import signal
    import threading

    import tokenizers

    real, release = tokenizers.Tokenizer, threading.Event()

    class Deaf:
        """tokenizers.Tokenizer whose training, like the Rust one, does not stop on a Ctrl-C."""

        def __init__(self, model):
            object.__setattr__(self, "_tok", real(model))

        def __getattr__(self, name):
            return getattr(self._tok, name)

        def __setattr__(self, name, value):
            setattr(self._tok, name, value)

        def train_from_iterator(self, texts, trainer, length=None):
            for i in range(40):  # the trainer's own work, deaf to it (bounded: the old code runs it to the end)
                try:
                    if i == 0:
                        os.kill(os.getpid(), signal.SIGINT)  # the user's Ctrl-C, delivered to the main thread
                    if release.wait(0.05):
                        return
                except KeyboardInterrupt:
                    pass
            self._tok.train_from_iterator(texts, trainer=trainer, length=length)

    monkeypatch.setattr(tokenizers, "Tokenizer", Deaf)
    write_jsonl(tmp_path / "a.jsonl", make_texts(50))
    before = signal.signal(signal.SIGINT, signal.default_int_handler)  # Python's own Ctrl-C, as in the CLI
    try:
        with pytest.raises(KeyboardInterrupt):
            _train(["--input_path", str(tmp_path / "a.jsonl"), "--output_dir", str(tmp_path / "tok"),
                    "--vocab_size", "300"])
    finally:
        release.set()  # the stand-in's thread ends; the real one is a daemon that ends with the process
        signal.signal(signal.SIGINT, before)
    assert not (tmp_path / "tok").exists() and not list(tmp_path.glob(".tok.tmp*"))
