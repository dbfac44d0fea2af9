"""Whether weights trained with one tokenizer meet another: the resume's refusal (`checkpoint.check_tokenizer`) and
the note of a continue_training run whose model directory carries another tokenizer than the run's.

Tokenizers are told apart by fingerprint, as train-tokenizer and inspect-data print it and as token files' sidecars
record it, so the fingerprint stays what it is. But one tokenizer can have two fingerprints: GPT-2's vocab.json +
merges.txt and its own tokenizer.json give the same ids, yet the files loaded from vocab.json + merges.txt flag the
special tokens `normalized: false` where its tokenizer.json says true. `same_ids` compares what decides the ids
instead, and only where the fingerprints differ (a Qwen-size tokenizer is ~15 MB of JSON to parse).
"""
from __future__ import annotations

import json
from pathlib import Path

# the parts of a serialised tokenizer that decide the ids `encode` gives (the decoder and the post-processor,
# which `encode` never asks for, do not)
_ID_PARTS = ("normalizer", "pre_tokenizer", "model", "truncation", "padding")


def _offsets_only(obj):
    """A part without `trim_offsets`, which moves offsets, never ids."""
    if isinstance(obj, dict):
        return {k: _offsets_only(v) for k, v in obj.items() if k != "trim_offsets"}
    if isinstance(obj, list):
        return [_offsets_only(v) for v in obj]
    return obj


def _added(spec: dict) -> list:
    """Each added token as it splits text: its id, content and matching flags; `normalized` only where a normalizer
    makes the normalised text another than the input."""
    normalizes = spec.get("normalizer") is not None
    return sorted((t["id"], t["content"], t.get("special"), t.get("single_word"), t.get("lstrip"), t.get("rstrip"),
                   normalizes and t.get("normalized")) for t in spec.get("added_tokens") or ())


def same_ids(a, b) -> bool:
    """Whether tokenizers `a` and `b` (`data.tokenizer.Tokenizer`) give every text the same ids: the same
    vocabulary, merges, normalizer, pre-tokenizer and added tokens (read from the serialisation `Tokenizer` wraps, as
    `data.tokenizer.transformers_mismatch` reads it). Which token a config file names eos or bos is no id of the
    text's (token files made with another eos are their sidecars' to tell)."""
    if a.fingerprint == b.fingerprint:
        return True
    x, y = json.loads(a._tok.to_str()), json.loads(b._tok.to_str())
    return _added(x) == _added(y) and all(_offsets_only(x.get(k)) == _offsets_only(y.get(k)) for k in _ID_PARTS)


def same_tokenizer(saved, tokenizer) -> bool:
    """`saved` and `tokenizer` by fingerprint (either's older sidecar form too), else by the ids they give."""
    return (saved.fingerprint in tokenizer.fingerprints or tokenizer.fingerprint in saved.fingerprints
            or same_ids(saved, tokenizer))


def continued_tokenizer(model_dir, tokenizer) -> list[str]:
    """One note when the model directory a continue_training run loads carries another tokenizer than the run's
    (`tokenizer_name_or_path`): the weights' embedding rows were trained on the directory's ids, which mean other
    tokens in the run's. A new tokenizer can be meant (a new lineage from an export), so it is said, not refused."""
    from pretrain_cli.data.tokenizer import load_tokenizer

    d = Path(model_dir)
    if tokenizer is None or Path(tokenizer.path).resolve() == d.resolve():
        return []
    if not ((d / "tokenizer.json").is_file() or ((d / "vocab.json").is_file() and (d / "merges.txt").is_file())):
        return []
    if (d / "tokenizer.json").is_file() and tokenizer.sha256 == _sha256(d / "tokenizer.json"):
        return []  # a copy byte for byte (what an export writes): not parsed
    own = load_tokenizer(d)
    if same_tokenizer(own, tokenizer):
        return []
    return [f"tokenizer_name_or_path: {tokenizer.path} (fingerprint {tokenizer.fingerprint[:12]}) is not the "
            f"tokenizer of {d} (fingerprint {own.fingerprint[:12]}), whose weights continue_training loads: their "
            f"embedding rows were trained on its ids, which mean other tokens here; leave tokenizer_name_or_path out "
            f"(or set it to {d}) unless a new tokenizer is meant"]


def _sha256(path: Path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()
