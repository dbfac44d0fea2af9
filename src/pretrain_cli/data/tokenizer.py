"""Tokenizer loading, and byte-level BPE training (the work behind `pretrain-cli train-tokenizer`).

A thin wrapper over `tokenizers.Tokenizer` rather than `transformers`: it loads in
milliseconds, has no network code path, and is all preprocessing and sampling need.

`tokenizer.json` is the tokenizer: every id the data holds came from it through `tokenizers`. What
`transformers.AutoTokenizer` builds from a directory must give the same ids, and transformers >= 5
does not always read `tokenizer.json` whole: for a class it knows (`Qwen2Tokenizer`, `LlamaTokenizer`,
...) it keeps only the vocabulary and merges and rebuilds the normalizer and pre-tokenizer from the
class's own recipe, and for a `config.json` of `model_type` "qwen2" it picks `Qwen2Tokenizer`
whatever `tokenizer_config.json` names. Hence (docs/DATA.md, "Tokenizers and transformers"):
`train_bpe` trains with exactly Qwen2's pipeline (NFC, Qwen2's split pattern, byte level), so the
forced class rebuilds what was trained; `export_files` names `PreTrainedTokenizerFast`, the class that
reads `tokenizer.json` as it is, in every directory a run writes; and `transformers_mismatch` says
when a tokenizer from elsewhere would still be rebuilt differently.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
from pathlib import Path

from pretrain_cli import atomic
from pretrain_cli.counts import count
from pretrain_cli.errors import UserError

DEFAULT_SPECIALS = ["[PAD]", "[BOT]", "[EOT]", "[UNK]"]
# Fallbacks when the config files do not name a role: the seed tutorial's tokens first.
_FALLBACK = {
    "bos": ["[BOT]", "<s>", "<|begin_of_text|>", "<bos>"],
    "eos": ["[EOT]", "<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>"],
    "pad": ["[PAD]", "<pad>", "<|pad|>"],
    "unk": ["[UNK]", "<unk>"],
}
# Qwen2's pre-tokenizer pattern (its tokenizer.json and transformers' Qwen2Tokenizer): contractions, letters
# with one leading non-letter, single digits, punctuation runs, newline runs, other whitespace.
QWEN2_SPLIT = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
               r"""|\s*[\r\n]+|\s+(?!\S)|\s+""")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "merges.txt")
_HOW = "create one with `pretrain-cli train-tokenizer --input_path CORPUS --output_dir DIR --vocab_size N`"


def _token_text(value) -> str | None:
    """HF config files store special tokens as strings or as AddedToken dicts."""
    if isinstance(value, dict):
        return value.get("content")
    return value if isinstance(value, str) else None


def _read_json(path: Path) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            obj = json.load(f)
    except FileNotFoundError:
        return {}
    except ValueError as e:
        raise UserError(f"{path}: not valid JSON ({e}); fix or delete it") from None
    return obj if isinstance(obj, dict) else {}


class Tokenizer:
    """Encode/decode plus the special-token ids sample construction needs."""

    def __init__(self, tok, path: str, special_tokens: dict[str, str | None], sha256: str):
        self._tok = tok
        self.path = path
        self.special_tokens = special_tokens  # role -> token text (None if absent)
        self.sha256 = sha256
        self.vocab_size = tok.get_vocab_size(with_added_tokens=True)

    @property
    def fingerprint(self) -> str:
        """sha256 of the tokenizer as `tokenizers` serialises it, without its post-processor: the same for every
        copy of one tokenizer, however its tokenizer.json is formatted (a run's export writes a pretty-printed one
        for a vocab.json + merges.txt source), where `sha256` is of the file's bytes. What token files are checked
        against (`data.merge`). The post-processor only adds special tokens, which `encode` never asks for, and
        transformers 5 writes a no-op one into every tokenizer it saves: counted, a model's tokenizer saved by
        transformers refused the token files its original made."""
        if getattr(self, "_fingerprint", None) is None:
            spec = json.loads(self._tok.to_str())
            text = self._tok.to_str()
            if spec.get("post_processor") is not None:
                spec["post_processor"] = None
                text = type(self._tok).from_str(json.dumps(spec)).to_str()  # the same canonical serialisation
            self._fingerprint = hashlib.sha256(text.encode("utf-8")).hexdigest()
        return self._fingerprint

    @property
    def fingerprints(self) -> tuple[str, ...]:
        """The fingerprints a token file's sidecar may name for this tokenizer: `fingerprint`, and the one of the
        whole serialisation that sidecars written before the post-processor was left out hold."""
        whole = hashlib.sha256(self._tok.to_str().encode("utf-8")).hexdigest()
        return (self.fingerprint,) if whole == self.fingerprint else (self.fingerprint, whole)

    def _id(self, role: str) -> int | None:
        text = self.special_tokens.get(role)
        return None if text is None else self._tok.token_to_id(text)

    @property
    def bos_token_id(self) -> int | None:
        return self._id("bos")

    @property
    def eos_token_id(self) -> int | None:
        return self._id("eos")

    @property
    def pad_token_id(self) -> int | None:
        return self._id("pad")

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        fast = getattr(self._tok, "encode_batch_fast", None)  # skips offsets; tokenizers >= 0.20
        encs = (fast or self._tok.encode_batch)(texts, add_special_tokens=False)
        return [e.ids for e in encs]

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def save(self, directory: str | os.PathLike) -> None:
        """tokenizer.json + tokenizer_config.json + special_tokens_map.json (HF layout)."""
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        roles = {f"{r}_token": t for r, t in self.special_tokens.items() if t is not None}
        files = {
            "tokenizer.json": self._tok.to_str(pretty=True),
            "tokenizer_config.json": json.dumps(_config_for(self.special_tokens), indent=2) + "\n",
            "special_tokens_map.json": json.dumps(roles, indent=2) + "\n",
        }
        for name, text in files.items():
            atomic.write_text(d / name, text)


def _config_for(special_tokens: dict[str, str | None]) -> dict:
    """tokenizer_config.json: the class that reads tokenizer.json as it is, no tokens added, the roles."""
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "clean_up_tokenization_spaces": False,
        "add_bos_token": False,
        "add_eos_token": False,
        "model_max_length": 1_000_000_000,
        **{f"{r}_token": t for r, t in special_tokens.items() if t is not None},
    }


def load_tokenizer(path: str | os.PathLike) -> Tokenizer:
    """Load a local tokenizer directory (tokenizer.json, or byte-level vocab.json+merges.txt)."""
    from tokenizers import Tokenizer as HFTokenizer

    d = Path(path)
    if not d.is_dir():
        raise UserError(f"{d}: tokenizer directory not found; {_HOW}")
    tj = d / "tokenizer.json"
    if tj.exists():
        raw = tj.read_bytes()
        try:
            tok = HFTokenizer.from_str(raw.decode("utf-8"))
        except Exception as e:  # tokenizers raises a bare Exception on parse errors
            raise UserError(f"{tj}: cannot be loaded ({str(e).splitlines()[0]}); re-create it or {_HOW}") from None
    elif (d / "vocab.json").exists() and (d / "merges.txt").exists():
        from tokenizers import decoders, models, pre_tokenizers

        tok = HFTokenizer(models.BPE.from_file(str(d / "vocab.json"), str(d / "merges.txt")))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        raw = None
    else:
        raise UserError(f"{d}: no tokenizer.json (or vocab.json + merges.txt); {_HOW}")
    config = {**_read_json(d / "special_tokens_map.json"), **_read_json(d / "tokenizer_config.json")}
    vocab = tok.get_vocab(with_added_tokens=True)
    specials = {}
    for role, fallbacks in _FALLBACK.items():
        text = _token_text(config.get(f"{role}_token"))
        if text is None or text not in vocab:
            text = next((t for t in fallbacks if t in vocab), None)
        specials[role] = text
    if raw is None:  # the role tokens are whole tokens in text too, as transformers makes them for these files
        tok.add_special_tokens(sorted({t for t in specials.values() if t is not None}))
        raw = tok.to_str().encode("utf-8")
    return Tokenizer(tok, str(d), specials, hashlib.sha256(raw).hexdigest())


def train_bpe(texts, vocab_size: int, special_tokens: list[str], min_frequency: int = 2, length: int | None = None):
    """Byte-level BPE: every byte is in the alphabet, so no text is ever unencodable."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import models, pre_tokenizers, trainers

    tok = HFTokenizer(models.BPE())
    _qwen2_pipeline(tok)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=special_tokens,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    _interruptible(lambda: tok.train_from_iterator(texts, trainer=trainer, length=length))
    return tok


def _interruptible(work) -> None:
    """Run `work` on a daemon thread while the main thread waits for it, so that a Ctrl-C ends the command at once.

    Why: the Rust BPE trainer runs its merges without returning to Python, where a signal handler could raise
    KeyboardInterrupt, and its reading of the iterator did not stop on one either: a Ctrl-C in `train-tokenizer`
    was answered only when the whole training had ended (7 s after the key on a 13 MB corpus; hours on a large one).
    It releases the GIL meanwhile, so the waiting main thread takes the KeyboardInterrupt as it comes; the thread,
    a daemon, ends with the process, before anything is written."""
    import threading

    failed = []

    def run():
        try:
            work()
        except BaseException as e:  # handed to the main thread, which raises it as the trainer's own
            failed.append(e)

    thread = threading.Thread(target=run, name="train-tokenizer", daemon=True)
    thread.start()
    while thread.is_alive():
        thread.join(0.1)
    if failed:
        raise failed[0]


def _qwen2_pipeline(tok) -> None:
    """Qwen2's normalizer, pre-tokenizer and decoder, as transformers' `Qwen2Tokenizer` builds them."""
    from tokenizers import Regex, decoders, normalizers, pre_tokenizers

    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()


def transformers_mismatch(tokenizer: Tokenizer, model_type: str) -> str | None:
    """Why `AutoTokenizer` on a directory with this tokenizer and a `model_type` config.json would encode
    otherwise than `tokenizer.json`, or None. Only "qwen2" forces a class (`Qwen2Tokenizer`) over the
    `PreTrainedTokenizerFast` our directories name; that class keeps the BPE vocabulary and merges and
    rebuilds the rest, so the two agree exactly when normalizer, pre-tokenizer and BPE options are Qwen2's."""
    if model_type != "qwen2":
        return None
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import models

    ours = json.loads(tokenizer._tok.to_str())
    rebuilt = HFTokenizer(models.BPE(vocab={}, merges=[], dropout=None, unk_token=None, continuing_subword_prefix="",
                                     end_of_word_suffix="", fuse_unk=False, byte_fallback=False))
    _qwen2_pipeline(rebuilt)
    theirs = json.loads(rebuilt.to_str())
    differs = [part for part in ("normalizer", "pre_tokenizer")
               if _ids_part(ours.get(part)) != _ids_part(theirs.get(part))]
    model = ours.get("model") or {}
    if model.get("type") != "BPE":
        differs.append("model")
    else:
        differs += [f"BPE {k}" for k, v in theirs["model"].items()
                    if k not in ("vocab", "merges") and (model.get(k) or None) != (v or None)]
    if not differs:
        return None
    return (f"tokenizer: {tokenizer.path} differs from Qwen2's in {', '.join(differs)}, and transformers >= 5 loads "
            f"every qwen2 model's tokenizer as Qwen2Tokenizer, which rebuilds those parts: AutoTokenizer on the "
            f"output would give other ids than the training data; load it with "
            f"transformers.PreTrainedTokenizerFast.from_pretrained(DIR), or train the tokenizer with "
            f"`pretrain-cli train-tokenizer` (Qwen2's pipeline)")


def _ids_part(obj):
    """A pipeline part without the options that change offsets only (`trim_offsets`), not ids."""
    if isinstance(obj, dict):
        return {k: _ids_part(v) for k, v in obj.items() if k != "trim_offsets"}
    if isinstance(obj, list):
        return [_ids_part(v) for v in obj]
    return obj


def export_files(tokenizer_dir, dest) -> None:
    """The tokenizer files a run writes into `checkpoint-N/` and the output directory: copies, except that
    tokenizer_config.json names `PreTrainedTokenizerFast` (transformers' class that reads tokenizer.json as
    it is; a model-specific class would rebuild the pre-tokenizer from its own recipe)."""
    if tokenizer_dir is None:
        return
    src, dest = Path(tokenizer_dir), Path(dest)
    for name in TOKENIZER_FILES:
        if name != "tokenizer_config.json" and (src / name).is_file():
            atomic.write_bytes(dest / name, (src / name).read_bytes())
    config = _read_json(src / "tokenizer_config.json")
    if not (src / "tokenizer.json").is_file() or not config:  # vocab.json + merges.txt: write what we encoded with
        tok = load_tokenizer(src)
        atomic.write_text(dest / "tokenizer.json", tok._tok.to_str(pretty=True))
        config = {**_config_for(tok.special_tokens), **config}
    config.pop("auto_map", None)  # remote code would replace the class again
    atomic.write_json(dest / "tokenizer_config.json", {**config, "tokenizer_class": "PreTrainedTokenizerFast"})


def _roles_for(special_tokens: list[str]) -> dict[str, str | None]:
    """Roles by the tokens' names (the fallbacks `load_tokenizer` knows), for tokenizers built in code."""
    present = set(special_tokens)
    return {role: next((t for t in fb if t in present), None) for role, fb in _FALLBACK.items()}


def roles_by_position(special_tokens: list[str]) -> dict[str, str]:
    """`train-tokenizer --special_tokens PAD BOS EOS UNK [EXTRA...]`: the first four are the pad, bos, eos and unk
    tokens whatever their names (a name-based guess left `<p> <b> <e> <u>` without an EOS, which `preprocess
    --append_eos` then lacks); further ones are special tokens with no role (kept whole in text). Fewer than four,
    an empty or blank token, or one given twice (which the trainer would silently keep once) are refused."""
    tokens = list(special_tokens)
    blank = next((i for i, t in enumerate(tokens) if not t.strip()), None)
    if blank is not None:
        raise UserError(f"--special_tokens: token {blank + 1} is empty or blank; pass non-blank tokens")
    twice = next((t for i, t in enumerate(tokens) if t in tokens[:i]), None)
    if twice is not None:
        raise UserError(f"--special_tokens: {twice!r} is given twice; pass each token once")
    if len(tokens) < len(_FALLBACK):
        raise UserError(f"--special_tokens: {len(tokens)} tokens, but the first four are the pad, bos, eos and unk "
                        f"tokens, in that order (e.g. {' '.join(DEFAULT_SPECIALS)}); pass at least four")
    return dict(zip(("pad", "bos", "eos", "unk"), tokens))


def _check_output_dir(out: Path) -> None:
    """Refused before any training: a file, or a directory holding model weights, whose token ids a new
    tokenizer would no longer match (a directory with only a config.json, or an older tokenizer, is fine)."""
    if out.exists() and not out.is_dir():
        raise UserError(f"--output_dir {out}: is a file, not a directory; choose a directory")
    weights = [n for n in ("model.safetensors", "model.safetensors.index.json") if (out / n).is_file()]
    weights += sorted(p.name for p in out.glob("checkpoint-*") if p.is_dir())[:1] if out.is_dir() else []
    if weights:
        raise UserError(f"--output_dir {out}: holds a trained model ({weights[0]}), whose token ids a new tokenizer "
                        f"would not match; choose another directory")


def train_tokenizer(ns) -> int:
    """Train a byte-level BPE on `ns.input_path` and save it to `ns.output_dir` (the command's options)."""
    from pretrain_cli.data.documents import DocumentReader, count_documents

    _check_output_dir(Path(ns.output_dir))
    roles = roles_by_position(ns.special_tokens)
    min_vocab = 256 + len(ns.special_tokens)
    if ns.vocab_size < min_vocab:
        raise UserError(f"--vocab_size: {ns.vocab_size} is below the byte alphabet plus special tokens "
                        f"({min_vocab}); pass at least {min_vocab}")
    reader = DocumentReader(ns.input_path, ns.json_key, ns.skip_bad_lines, note=lambda line: print(line, file=sys.stderr))
    n_docs = count_documents(ns.input_path)  # cheap line count: tqdm and the trainer want a length
    from tqdm import tqdm

    texts = tqdm(reader, total=n_docs, unit="doc", desc="train-tokenizer", file=sys.stderr,
                 disable=not sys.stderr.isatty())
    tok = train_bpe(texts, ns.vocab_size, list(ns.special_tokens), ns.min_frequency, n_docs)
    if reader.documents == 0:
        raise UserError(f"--input_path: no non-empty documents in {' '.join(ns.input_path)}; check the files and --json_key")
    out = Path(ns.output_dir)
    if out.exists():  # keep unrelated files (e.g. a model config); each of ours is replaced atomically
        Tokenizer(tok, str(out), roles, "").save(out)
    else:  # a new directory appears complete or not at all
        tmp = atomic.tmp_path(out)
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            Tokenizer(tok, str(out), roles, "").save(tmp)
            atomic.publish_dir(tmp, out)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    loaded = load_tokenizer(out)
    extra = f", extra {' '.join(ns.special_tokens[4:])}" if len(ns.special_tokens) > 4 else ""
    print(f"train-tokenizer: {count(reader.documents, 'document')} -> {out} (vocab {loaded.vocab_size}, pad={roles['pad']} "
          f"bos={roles['bos']} eos={roles['eos']} unk={roles['unk']}{extra}, sha256 {loaded.sha256[:12]})")
    if loaded.vocab_size < ns.vocab_size:  # the trainer ran out of frequent pairs: said, as a model sized to the
        lower = " or --min_frequency 1" if ns.min_frequency > 1 else ""  # number asked for would not match it
        print(f"note: --vocab_size {ns.vocab_size}: the corpus gave {loaded.vocab_size} tokens: every merge seen at "
              f"least --min_frequency {ns.min_frequency} times is learned; more text{lower} gives more",
              file=sys.stderr)
    if reader.bad_lines:
        print(f"train-tokenizer: skipped {reader.bad_lines} bad lines", file=sys.stderr)
    return 0
