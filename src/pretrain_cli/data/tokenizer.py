"""Tokenizer loading, and byte-level BPE training (the work behind `pretrain-cli train-tokenizer`).

A thin wrapper over `tokenizers.Tokenizer` rather than `transformers`: it loads in
milliseconds, has no network code path, and is all preprocessing and sampling need.
Directories we save load unchanged in `transformers.AutoTokenizer`.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
from pathlib import Path

from pretrain_cli import atomic
from pretrain_cli.errors import UserError

DEFAULT_SPECIALS = ["[PAD]", "[BOT]", "[EOT]", "[UNK]"]
# Fallbacks when the config files do not name a role: the seed tutorial's tokens first.
_FALLBACK = {
    "bos": ["[BOT]", "<s>", "<|begin_of_text|>", "<bos>"],
    "eos": ["[EOT]", "<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>"],
    "pad": ["[PAD]", "<pad>", "<|pad|>"],
    "unk": ["[UNK]", "<unk>"],
}
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
        config = {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "clean_up_tokenization_spaces": False,
            "add_bos_token": False,
            "add_eos_token": False,
            "model_max_length": 1_000_000_000,
            **roles,
        }
        files = {
            "tokenizer.json": self._tok.to_str(pretty=True),
            "tokenizer_config.json": json.dumps(config, indent=2) + "\n",
            "special_tokens_map.json": json.dumps(roles, indent=2) + "\n",
        }
        for name, text in files.items():
            atomic.write_text(d / name, text)


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
        raw = tok.to_str().encode("utf-8")
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
    return Tokenizer(tok, str(d), specials, hashlib.sha256(raw).hexdigest())


def train_bpe(texts, vocab_size: int, special_tokens: list[str], min_frequency: int = 2, length: int | None = None):
    """Byte-level BPE: every byte is in the alphabet, so no text is ever unencodable."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=special_tokens,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer, length=length)
    return tok


def _roles_for(special_tokens: list[str]) -> dict[str, str | None]:
    present = set(special_tokens)
    return {role: next((t for t in fb if t in present), None) for role, fb in _FALLBACK.items()}


def train_tokenizer(ns) -> int:
    """Train a byte-level BPE on `ns.input_path` and save it to `ns.output_dir` (the command's options)."""
    from pretrain_cli.data.documents import DocumentReader, count_documents

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
    roles = _roles_for(list(ns.special_tokens))
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
    print(f"train-tokenizer: {reader.documents} documents -> {out} (vocab {loaded.vocab_size}, "
          f"bos={roles['bos']} eos={roles['eos']} pad={roles['pad']}, sha256 {loaded.sha256[:12]})")
    if reader.bad_lines:
        print(f"train-tokenizer: skipped {reader.bad_lines} bad lines", file=sys.stderr)
    return 0
