"""Whether weights trained with one tokenizer meet another: the resume's refusal (`checkpoint.check_tokenizer`) and
the note of a continue_training run whose model directory carries another tokenizer than the run's; and what a run's
args.json records of its tokenizer (`trained_with`), which a resume from a checkpoint without tokenizer files is
judged by (`check_recorded`).

Tokenizers are told apart by fingerprint, as train-tokenizer and inspect-data print it and as token files' sidecars
record it, so the fingerprint stays what it is. But one tokenizer can have two fingerprints: GPT-2's vocab.json +
merges.txt and its own tokenizer.json give the same ids, yet the files loaded from vocab.json + merges.txt flag the
special tokens `normalized: false` where its tokenizer.json says true. Where the fingerprints differ, `same_ids`
compares what decides the ids (`data.tokenizer_ids.ids_form`), the rule token files' sidecars are judged by too
(`data.token_file_tokenizers.tokenizer_mismatches`); it parses both (a Qwen-size tokenizer is ~15 MB of JSON), so only then.
"""
from __future__ import annotations

from pathlib import Path

from pretrain_cli.errors import UserError
from pretrain_cli.run_dir import ARGS_FILE


# the sidecar fields `trained_with` records, so that the judges of token files' sidecars judge it
# (`data.token_file_tokenizers`: `tokenizer_mismatches` against a tokenizer, `tokenizer_problems` against sidecars)
RECORDED = ("tokenizer", "tokenizer_fingerprint", "tokenizer_ids_fingerprint", "tokenizer_sha256", "vocab_size",
            "eos_token_id")


def trained_with(tokenizer, prefixes=(), resumed=None) -> dict | None:
    """What args.json records of the tokenizer the run's weights train with (its `tokenizer`), in the fields and
    meaning of a token file's sidecar: a run without a tokenizer writes no tokenizer files into its checkpoints, so
    this is what a resume from one is checked by (`checkpoint.check_tokenizer`). The run's tokenizer (its path,
    fingerprint, vocabulary size and EOS id: its checkpoints hold its files, which decide; the ids fingerprint, a
    parse of the whole tokenizer, is left to those), else what the first of its token files (`prefixes`) whose
    sidecar names a tokenizer records (the sources of a run agree: `data.check_tokenizer`), else the record of the
    checkpoint it resumes (`resumed`, a `CheckpointDir`), carried forward; else None."""
    from pretrain_cli.data.indexed import read_sidecar

    if tokenizer is not None:
        return {"tokenizer": tokenizer.path, "tokenizer_fingerprint": tokenizer.fingerprint,
                "vocab_size": tokenizer.vocab_size, "eos_token_id": tokenizer.eos_token_id}
    for p in prefixes:
        meta = read_sidecar(p) or {}
        if meta.get("tokenizer_fingerprint") or meta.get("tokenizer_sha256"):
            return {f: meta[f] for f in RECORDED if meta.get(f) is not None}
    return recorded(resumed) if resumed is not None else None


def recorded(ckpt) -> dict | None:
    """The tokenizer a checkpoint's args.json records (`trained_with`), or None where it records none (a run without
    a tokenizer or token files naming one, or from before the record)."""
    rec = (ckpt.args or {}).get("tokenizer")
    ok = isinstance(rec, dict) and (rec.get("tokenizer_fingerprint") or rec.get("tokenizer_sha256"))
    return rec if ok else None


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


def check_recorded(ckpt, tokenizer, prefixes, args) -> None:
    """A checkpoint without tokenizer files: the tokenizer its args.json records (`recorded`, in a
    sidecar's fields), judged as a token file's sidecar is, by the same judges: against the run's tokenizer
    (`tokenizer_mismatches`: vocabulary size, EOS id, fingerprint, else the ids fingerprint) or, for a run without
    one, against each of its token files' sidecars (`tokenizer_problems`)."""
    from pretrain_cli.data.indexed import read_sidecar
    from pretrain_cli.data.token_file_tokenizers import tokenizer_mismatches, tokenizer_problems

    rec = recorded(ckpt)
    if rec is None:
        return
    item = (str(ckpt.path / Path(ARGS_FILE).stem), rec)  # (named `<it>.json` by the judges: the args.json)
    with_it = f"{rec['tokenizer']}, {_named(rec)}" if rec.get("tokenizer") else _named(rec)
    said = f"{ckpt} was trained with ({with_it}, as its {ARGS_FILE} records it)"
    if tokenizer is not None:
        if tokenizer_mismatches([item], tokenizer):
            raise UserError(f"{refusal_key(args)}: {tokenizer.path} (fingerprint {tokenizer.fingerprint[:12]}) is "
                            f"not the tokenizer {said}: its token ids would mean other tokens; resume with that "
                            f"tokenizer, {new_lineage(ckpt)}")
        return
    for p in prefixes:
        meta = read_sidecar(p)
        if meta and tokenizer_problems([item, (p, meta)]):
            raise UserError(f"input_dir: {p}.json names another tokenizer ({_named(meta)}) than the one {said}: its "
                            f"token ids would mean other tokens; resume with data made with that tokenizer, "
                            f"{new_lineage(ckpt)}")


def _named(meta: dict) -> str:
    """A tokenizer as a sidecar (or a checkpoint's record) names it: its fingerprint, by its first 12 characters, as
    train-tokenizer and inspect-data print it; from before the fingerprint, tokenizer.json's sha256."""
    fp = meta.get("tokenizer_fingerprint")
    return f"fingerprint {fp[:12]}" if fp else f"tokenizer.json sha256 {str(meta.get('tokenizer_sha256'))[:12]}"


def refusal_key(args) -> str:
    """The key that supplied the run's tokenizer: tokenizer_name_or_path, else model_name_or_path."""
    return ("model_name_or_path" if args is not None and args.model.tokenizer_name_or_path is None
            else "tokenizer_name_or_path")


def new_lineage(ckpt) -> str:
    """The way to another tokenizer on purpose, as a refusal ends."""
    return (f"or, to start a new lineage on purpose, model_name_or_path: an export of it (`pretrain-cli export "
            f"{ckpt} DIR`, or the run's final directory) with continue_training: 1 in another output_dir")
