"""Tokenizer loading and export (`data.tokenizer_training` trains one: `pretrain-cli train-tokenizer`).

A thin wrapper over `tokenizers.Tokenizer` rather than `transformers`: it loads in
milliseconds, has no network code path, and is all preprocessing and sampling need.

`tokenizer.json` is the tokenizer: every id the data holds came from it through `tokenizers`. What
`transformers.AutoTokenizer` builds from a directory must give the same ids, and transformers >= 5
does not always read `tokenizer.json` whole: for a class it knows (`Qwen2Tokenizer`, `LlamaTokenizer`,
...) it keeps only the vocabulary and merges and rebuilds the normalizer and pre-tokenizer from the
class's own recipe, and for a `config.json` of `model_type` "qwen2" it picks `Qwen2Tokenizer`
whatever `tokenizer_config.json` names. Hence (docs/DATA.md, "Tokenizers and transformers"):
`tokenizer_training.train_bpe` trains with exactly Qwen2's pipeline (NFC, Qwen2's split pattern, byte level), so the
forced class rebuilds what was trained; `export_files` names `PreTrainedTokenizerFast`, the class that
reads `tokenizer.json` as it is, in every directory a run writes; and `tokenizer_ids.transformers_mismatch` says
when a tokenizer from elsewhere would still be rebuilt differently.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

from pretrain_cli import atomic, json_mistakes
from pretrain_cli.data.tokenizer_ids import ids_form
from pretrain_cli.errors import UserError

DEFAULT_SPECIALS = ["[PAD]", "[BOT]", "[EOT]", "[UNK]"]
# Fallbacks when the config files do not name a role: the seed tutorial's tokens first.
_FALLBACK = {
    "bos": ["[BOT]", "<s>", "<|begin_of_text|>", "<bos>"],
    "eos": ["[EOT]", "<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>"],
    "pad": ["[PAD]", "<pad>", "<|pad|>"],
    "unk": ["[UNK]", "<unk>"],
}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "merges.txt")
_HOW = "create one with `pretrain-cli train-tokenizer --input_path CORPUS --output_dir DIR --vocab_size N`"


def _token_text(value) -> str | None:
    """HF config files store special tokens as strings or as AddedToken dicts."""
    if isinstance(value, dict):
        return value.get("content")
    return value if isinstance(value, str) else None


def _read_json(path: Path) -> dict:
    """A tokenizer config file's object ({} when it is not there), read as every user's JSON file is
    (`json_mistakes.loads`: the mistake at its line:column, deep nesting and bytes not UTF-8 one line each)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return {}
    obj = json_mistakes.loads(data, str(path), holds=f"{path.name} is one JSON object; fix or delete it",
                              fix="fix or delete it")
    return obj if isinstance(obj, dict) else {}


class Tokenizer:
    """Encode/decode plus the special-token ids sample construction needs."""

    def __init__(self, tok, path: str, special_tokens: dict[str, str | None], sha256: str):
        self._tok = tok
        self.path = path
        self.special_tokens = special_tokens  # role -> token text (None if absent)
        self.sha256 = sha256
        self.vocab_size = tok.get_vocab_size(with_added_tokens=True)
        self._enc = tok  # what encode/encode_batch use (`for_documents`); `_tok` is the tokenizer as its file says
        self._pipeline: dict | None = None  # `pipeline()`, once parsed

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
    def ids_fingerprint(self) -> str:
        """sha256 of what decides the ids `encode` gives (`ids_form`): one for the forms of one tokenizer whose
        fingerprints differ (GPT-2's vocab.json + merges.txt and its tokenizer.json flag its added token's
        `normalized` differently), so a resume (`training.tokenizer_lineage`) and token files' sidecars
        (`data.token_file_tokenizers.tokenizer_mismatches`) judge "the same tokenizer" alike. Parses the whole
        serialisation."""
        if getattr(self, "_ids_fingerprint", None) is None:
            form = json.dumps(ids_form(self.spec()), sort_keys=True, ensure_ascii=False)
            self._ids_fingerprint = hashlib.sha256(form.encode("utf-8")).hexdigest()
        return self._ids_fingerprint

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

    def for_documents(self, special_tokens: str = "text", keep_original: bool = True) -> "Tokenizer":
        """This tokenizer as `preprocess` encodes documents (`--special_tokens_in_text`, docs/DATA.md): "text", a
        special token's text in a document is plain text (a literal `</s>` as the EOS id would be a false document
        boundary in packed samples); "special", each is its id (transformers' default); "extra", only the special
        tokens with no pad/bos/eos/unk role are (a corpus's chat markers), the role tokens' text stays text.
        `tokenizers` encodes a token flagged special as text under `encode_special_tokens` and still matches every
        other added token, so the tokens to match lose the flag in a copy used for encoding only: the flag decides
        nothing else of encoding (tests/unit/test_special_tokens_in_text.py compares "special" with tokenizers' own
        matching). Fingerprint and sha256 stay the file's: it is not another tokenizer. The copy is built from one
        parse of the serialised tokenizer (a Qwen-size one: ~15 MB of JSON); "text" and a choice that matches
        nothing make none. `keep_original=False` (a worker, which only encodes) drops the tokenizer as its file says,
        and with it all but `encode`, `encode_batch` and `pipeline` (`fingerprint`, `decode`, the role ids, `save`
        fail): the copy alone is the memory of one tokenizer."""
        self._enc, self._pipeline = self._tok, None
        if special_tokens == "special":
            matched = set(self._special_texts())
        elif special_tokens == "extra":  # (the roles' texts are what it leaves text)
            matched = set(self.extra_special_tokens())
        elif special_tokens == "text":
            matched = set()
        else:  # the command's choices (commands/preprocess.py, SPECIAL_TOKENS_IN_TEXT) are these three
            raise ValueError(f"special_tokens {special_tokens!r}: not text, special or extra")
        if matched:
            text = self._tok.to_str()
            parts, (a, b) = _parts_before_model(text)
            for t in parts["added_tokens"]:
                if t.get("special") and t["content"] in matched:
                    t["special"] = False
            self._enc = type(self._tok).from_str(text[:a] + json.dumps(parts["added_tokens"]) + text[b:])
            self._pipeline, text = parts, None
            if not keep_original:
                self._tok = None
        self._enc.encode_special_tokens = True  # tokenizers >= 0.15.1; not serialised: no fingerprint changes
        return self

    def _special_texts(self) -> list[str]:
        """The added tokens flagged special, in id order (read without serialising the tokenizer)."""
        added = (self._tok if self._tok is not None else self._enc).get_added_tokens_decoder()
        return [added[i].content for i in sorted(added) if added[i].special]

    def extra_special_tokens(self) -> list[str]:
        """The special tokens with no pad/bos/eos/unk role, in id order (what `for_documents("extra")` matches)."""
        roles = {t for t in self.special_tokens.values() if t is not None}
        return [t for t in self._special_texts() if t not in roles]

    def role_special_tokens(self) -> list[str]:
        """The special tokens that have a pad/bos/eos/unk role, in id order (what `for_documents("extra")` leaves
        text)."""
        roles = {t for t in self.special_tokens.values() if t is not None}
        return [t for t in self._special_texts() if t in roles]

    def spec(self) -> dict:
        """tokenizer.json as `tokenizers` serialises this tokenizer (the file's content, however it was read)."""
        return json.loads(self._tok.to_str())

    def pipeline(self) -> dict:
        """tokenizer.json's parts as `tokenizers` serialises them for encoding, those before the model (which it
        writes last: its vocabulary and merges are most of the size). `long_documents.cuttable` reads the
        normalizer, pre-tokenizer and added tokens: with `for_documents`, the special tokens that stay text are
        the ones flagged special."""
        if self._pipeline is None:
            self._pipeline = _parts_before_model(self._enc.to_str())[0]
        return self._pipeline

    def encode(self, text: str) -> list[int]:
        return self._enc.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        fast = getattr(self._enc, "encode_batch_fast", None)  # skips offsets; tokenizers >= 0.20
        encs = (fast or self._enc.encode_batch)(texts, add_special_tokens=False)
        return [e.ids for e in encs]

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def id_to_token(self, i: int) -> str | None:
        return self._tok.id_to_token(int(i))

    def save(self, directory: str | os.PathLike) -> None:
        """tokenizer.json + tokenizer_config.json + special_tokens_map.json (HF layout). The special tokens without
        a role are listed as `additional_special_tokens` in both config files: tokenizer.json flags them special
        (so `decode(skip_special_tokens=True)` drops them either way), but transformers' `all_special_tokens` and
        `all_special_ids` list only the config files' tokens; 5.x reads the key as its `extra_special_tokens`, and
        4.x, whose `extra_special_tokens` is a dict of named tokens, reads it as it is."""
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        extra = self.extra_special_tokens()
        roles = {f"{r}_token": t for r, t in self.special_tokens.items() if t is not None}
        roles.update({"additional_special_tokens": extra} if extra else {})
        files = {
            "tokenizer.json": self._tok.to_str(pretty=True),
            "tokenizer_config.json": json.dumps(_config_for(self.special_tokens, extra), indent=2) + "\n",
            "special_tokens_map.json": json.dumps(roles, indent=2) + "\n",
        }
        for name, text in files.items():
            atomic.write_text(d / name, text)


def _parts_before_model(text: str) -> tuple[dict, tuple[int, int]]:
    """The top-level parts of a serialised tokenizer before "model" (all of them if it has none), parsed one by
    one, and where the "added_tokens" value lies in `text`: the model, ~15 MB of JSON in a Qwen-size tokenizer,
    is never parsed. `to_str` writes the model last; were it not, the parts after it are simply not read."""
    dec, ws = json.JSONDecoder(), re.compile(r"[\s,]*")
    parts, span, i = {}, (0, 0), ws.match(text, text.index("{") + 1).end()
    while i < len(text) and text[i] != "}":
        key, i = dec.raw_decode(text, i)
        i = ws.match(text, text.index(":", i) + 1).end()
        if key == "model":
            break
        parts[key], end = dec.raw_decode(text, i)
        if key == "added_tokens":
            span = (i, end)
        i = ws.match(text, end).end()
    return parts, span


def _config_for(special_tokens: dict[str, str | None], extra=()) -> dict:
    """tokenizer_config.json: the class that reads tokenizer.json as it is, no tokens added, the roles and the
    special tokens without one (`extra`, as `Tokenizer.save` says)."""
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "clean_up_tokenization_spaces": False,
        "add_bos_token": False,
        "add_eos_token": False,
        "model_max_length": 1_000_000_000,
        **{f"{r}_token": t for r, t in special_tokens.items() if t is not None},
        **({"additional_special_tokens": list(extra)} if extra else {}),
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
