"""Whether weights trained with one tokenizer meet another: the resume's refusal (`checkpoint.check_tokenizer`) and
the note of a continue_training run whose model directory carries another tokenizer than the run's.

Tokenizers are told apart by fingerprint, as train-tokenizer and inspect-data print it and as token files' sidecars
record it, so the fingerprint stays what it is. But one tokenizer can have two fingerprints: GPT-2's vocab.json +
merges.txt and its own tokenizer.json give the same ids, yet the files loaded from vocab.json + merges.txt flag the
special tokens `normalized: false` where its tokenizer.json says true. Where the fingerprints differ, `same_ids`
compares what decides the ids (`data.tokenizer_ids.ids_form`), the rule token files' sidecars are judged by too
(`data.token_file_tokenizers.tokenizer_mismatches`); it parses both (a Qwen-size tokenizer is ~15 MB of JSON), so only then.
"""
from __future__ import annotations

from pathlib import Path


def same_ids(a, b) -> bool:
    """Whether tokenizers `a` and `b` (`data.tokenizer.Tokenizer`) give every text the same ids: the same
    vocabulary, merges, normalizer, pre-tokenizer and added tokens (`Tokenizer.ids_fingerprint`). Which token a
    config file names eos or bos is no id of the text's (token files made with another eos are their sidecars' to
    tell)."""
    return a.fingerprint == b.fingerprint or a.ids_fingerprint == b.ids_fingerprint


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
