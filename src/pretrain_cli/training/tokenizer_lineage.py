"""Whether weights trained with one tokenizer meet another: the resume's refusal (`resume_checks.check_tokenizer`) and
the note of a continue_training run whose model directory carries another tokenizer than the run's; and what a run's
args.json records of its tokenizer (`trained_with`), which a model directory without tokenizer files is judged by
(`recorded_problem`: a resume's refusal, eval's, continue_training's note).

Tokenizers are told apart by fingerprint, as train-tokenizer and inspect-data print it and as token files' sidecars
record it, so the fingerprint stays what it is. But one tokenizer can have two fingerprints: GPT-2's vocab.json +
merges.txt and its own tokenizer.json give the same ids, yet the files loaded from vocab.json + merges.txt flag the
special tokens `normalized: false` where its tokenizer.json says true. Where the fingerprints differ, `same_ids`
compares what decides the ids (`data.tokenizer_ids.ids_form`), the rule token files' sidecars are judged by too
(`data.token_file_tokenizers.tokenizer_mismatches`); it parses both (a Qwen-size tokenizer is ~15 MB of JSON), so
only then.
"""
from __future__ import annotations

from pathlib import Path

from pretrain_cli.errors import UserError
from pretrain_cli.run_dir import ARGS_FILE
from pretrain_cli.storage.checkpoint_dir import CheckpointDir


# the sidecar fields `trained_with` records, so that the judges of token files' sidecars judge it
# (`data.token_file_tokenizers`: `mismatch` against a tokenizer, `disagreements` against sidecars)
RECORDED = ("tokenizer", "tokenizer_fingerprint", "tokenizer_ids_fingerprint", "tokenizer_sha256", "vocab_size",
            "eos_token_id")


def trained_with(tokenizer, prefixes=(), starts=()) -> dict | None:
    """What args.json records of the tokenizer the run's weights train with (its `tokenizer`), in the fields and
    meaning of a token file's sidecar: a run without a tokenizer writes no tokenizer files into its checkpoints, so
    this is what a resume from one, eval of one and continue_training from its final directory are judged by
    (`recorded_problem`). The run's tokenizer, in every field (`of_tokenizer`: the record is carried forward into
    the checkpoints of a later run without one, which hold no files to decide); else what the first of its token
    files (`prefixes`) whose sidecar names a tokenizer records (the sources of a run agree: `data.check_tokenizer`);
    else the first of `starts` (the checkpoint it resumes, the directory it continues from) that tells: its
    tokenizer files where it holds them (a record of its own may be older than its fields), else its record,
    carried forward; else None."""
    from pretrain_cli.data.indexed import read_sidecar

    if tokenizer is not None:
        return of_tokenizer(tokenizer, prefixes)
    for p in prefixes:
        meta = read_sidecar(p) or {}
        if meta.get("tokenizer_fingerprint") or meta.get("tokenizer_sha256"):
            return {f: meta[f] for f in RECORDED if meta.get(f) is not None}
    for d in starts:
        if d is None:
            continue
        ckpt = CheckpointDir.of(d)
        if _holds_files(ckpt.path):
            from pretrain_cli.data.tokenizer import load_tokenizer

            arguments = (ckpt.args or {}).get("arguments") or {}
            was = arguments.get("tokenizer_name_or_path") or arguments.get("model_name_or_path")
            return {**of_tokenizer(load_tokenizer(ckpt.path)), "tokenizer": was or str(ckpt.path)}
        if recorded(ckpt) is not None:
            return recorded(ckpt)
    return None


def of_tokenizer(tokenizer, prefixes=()) -> dict:
    """`tokenizer`'s record: its path, fingerprint, ids fingerprint, tokenizer.json's sha256 (read as it loaded),
    vocabulary size and EOS id. The ids fingerprint parses the whole serialisation (a Qwen-size tokenizer, 151k
    tokens: ~1.8 s on a loaded 2-core machine), so it is taken from a token file's sidecar (`prefixes`) that
    records it for this fingerprint (preprocess computed it), and computed only where none does or the data check
    has not already (`Tokenizer.ids_fingerprint` keeps it); a run takes its record on rank 0 alone, which writes
    args.json (`training.run.args_record`), so it is computed once a run."""
    from pretrain_cli.data.indexed import read_sidecar

    fp = tokenizer.fingerprint
    ids = next((m["tokenizer_ids_fingerprint"] for m in map(read_sidecar, prefixes)
                if m and m.get("tokenizer_ids_fingerprint") and m.get("tokenizer_fingerprint") == fp), None)
    return {"tokenizer": tokenizer.path, "tokenizer_fingerprint": fp,
            "tokenizer_ids_fingerprint": ids or tokenizer.ids_fingerprint, "tokenizer_sha256": tokenizer.sha256,
            "vocab_size": tokenizer.vocab_size, "eos_token_id": tokenizer.eos_token_id}


def _holds_files(d: Path) -> bool:
    """Whether model directory `d` holds a tokenizer (tokenizer.json, or vocab.json + merges.txt)."""
    return (d / "tokenizer.json").is_file() or ((d / "vocab.json").is_file() and (d / "merges.txt").is_file())


def recorded(ckpt) -> dict | None:
    """The tokenizer a checkpoint's (or a final directory's) args.json records (`trained_with`), or None where it
    records none (a run without a tokenizer or token files naming one, or from before the record)."""
    rec = (CheckpointDir.of(ckpt).args or {}).get("tokenizer")
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


def continued_tokenizer(model_dir, tokenizer, prefixes=()) -> list[str]:
    """One note when the model directory a continue_training run loads was trained with another tokenizer than the
    run's (`tokenizer_name_or_path`) or, for a run without one, than its token files' (`prefixes`): the weights'
    embedding rows were trained on the directory's ids, which mean other tokens in the run's. Judged by the
    directory's tokenizer files, else by the tokenizer its args.json records (`recorded_problem`: a run without a
    tokenizer exports none). A new tokenizer can be meant (a new lineage from an export), so it is said, not
    refused."""
    from pretrain_cli.data.tokenizer import load_tokenizer

    d = Path(model_dir)
    unless = "unless a new tokenizer is meant"
    if not _holds_files(d):
        found = recorded_problem(d, tokenizer, prefixes, "tokenizer_name_or_path", "input_dir")
        if found is None:
            return []
        way = "set tokenizer_name_or_path to that tokenizer" if found[1] == "tokenizer" else "use data made with it"
        return [f"{found[0]}: continue_training loads its weights, whose embedding rows were trained on that "
                f"tokenizer's ids; {way} {unless}"]
    if tokenizer is None or Path(tokenizer.path).resolve() == d.resolve():
        return []
    if (d / "tokenizer.json").is_file() and tokenizer.sha256 == _sha256(d / "tokenizer.json"):
        return []  # a copy byte for byte (what an export writes): not parsed
    own = load_tokenizer(d)
    if same_tokenizer(own, tokenizer):
        return []
    return [f"tokenizer_name_or_path: {tokenizer.path} (fingerprint {tokenizer.fingerprint[:12]}) is not the "
            f"tokenizer of {d} (fingerprint {own.fingerprint[:12]}), whose weights continue_training loads: their "
            f"embedding rows were trained on its ids, which mean other tokens here; leave tokenizer_name_or_path out "
            f"(or set it to {d}) {unless}"]


def _sha256(path: Path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()


def recorded_problem(ckpt, tokenizer, prefixes, key: str, data_key: str) -> tuple[str, str] | None:
    """For a model directory without tokenizer files (a checkpoint or final directory of a run without a
    tokenizer): the tokenizer its args.json records (`recorded`, in a sidecar's fields), judged as a token file's
    sidecar is, by the same judges: against `tokenizer` (`mismatch`: vocabulary size, EOS id, fingerprint, else the
    ids fingerprint) or, without one, against each token file's sidecar (`disagreements`). The refusal's line,
    naming the key (`key` the tokenizer's, `data_key` the token files') and the field on which they differ with
    both values, and which of the two it names ("tokenizer" or "data"): each caller says its own way out. None
    where they agree or no tokenizer is recorded."""
    from pretrain_cli.data.indexed import read_sidecar
    from pretrain_cli.data.token_file_tokenizers import disagreements, mismatch, tokenizer_named

    ckpt = CheckpointDir.of(ckpt)
    rec = recorded(ckpt)
    if rec is None:
        return None
    said = f"{ckpt} was trained with ({tokenizer_named(rec)}, as its {ARGS_FILE} records it)"
    if tokenizer is not None:
        found = mismatch(rec, tokenizer)
        if found is None:
            return None
        name, theirs, ours = found
        return (f"{key}: {tokenizer.path} is not the tokenizer {said}: its {name} is {ours}, the record's {theirs}; "
                f"its token ids would mean other tokens", "tokenizer")
    here = str(ckpt.path / Path(ARGS_FILE).stem)  # (named `<it>.json` by the judges: the args.json)
    for p in prefixes:
        meta = read_sidecar(p)
        found = next(iter(disagreements([(here, rec), (p, meta)])), None) if meta else None
        if found is not None:
            _, name, v, where, v0 = found
            ours, theirs = (v, v0) if where == here else (v0, v)
            return (f"{data_key}: {p}.json was made with another tokenizer than the one {said}: its {name} is "
                    f"{ours}, the record's {theirs}; its token ids would mean other tokens", "data")
    return None


def check_recorded(ckpt, tokenizer, prefixes, args) -> None:
    """A resume from a checkpoint without tokenizer files: refused where the tokenizer its args.json records is
    not the run's, or not its token files' (`recorded_problem`)."""
    found = recorded_problem(ckpt, tokenizer, prefixes, refusal_key(args), "input_dir")
    if found is not None:
        line, which = found
        way = "resume with that tokenizer" if which == "tokenizer" else "resume with data made with that tokenizer"
        raise UserError(f"{line}; {way}, {new_lineage(CheckpointDir.of(ckpt))}")


def refusal_key(args) -> str:
    """The key that supplied the run's tokenizer: tokenizer_name_or_path, else model_name_or_path."""
    return ("model_name_or_path" if args is not None and args.model.tokenizer_name_or_path is None
            else "tokenizer_name_or_path")


def new_lineage(ckpt) -> str:
    """The way to another tokenizer on purpose, as a refusal ends."""
    return (f"or, to start a new lineage on purpose, model_name_or_path: an export of it (`pretrain-cli export "
            f"{ckpt} DIR`, or the run's final directory) with continue_training: 1 in another output_dir")
