"""Whether token files were made with one tokenizer, and with the run's, from their .json sidecars: shared by
`merge-data` (its inputs), `inspect-data` on a directory, the run (`data.build_datasets`: `train`, `check`,
`inspect-data --tokenizer`), `preprocess`'s note on the files it replaces, and a resume from a checkpoint without
tokenizer files, whose args.json records its tokenizer in a sidecar's fields (`training.tokenizer_lineage`). Two forms of one tokenizer (vocab.json + merges.txt against its tokenizer.json) are one
where both sidecars record the ids fingerprint (`data.tokenizer_ids.ids_form`); older sidecars are judged by the
fingerprint, and those from before it by tokenizer.json's sha256.
"""
from __future__ import annotations

TOKENIZER_FIELDS = ("vocab_size", "eos_token_id", "tokenizer_sha256")


def tokenizer_problems(items) -> list[str]:
    """One line per tokenizer field on which the files' sidecars disagree (files without one are not judged). The
    tokenizer itself is compared by its fingerprint where both sidecars have one: a reformatted copy of a tokenizer
    (re-saved with another indent, or exported) has the same fingerprint and another sha256 of tokenizer.json's
    bytes, and is the same tokenizer. Only a sidecar from before the fingerprint is compared by that sha256."""
    problems = []
    for field in ("vocab_size", "eos_token_id"):
        vals = [(p, m[field]) for p, m in items if m and m.get(field) is not None]
        if not vals:
            continue
        p0, v0 = vals[0]
        other = next(((p, v) for p, v in vals if v != v0), None)
        if other is not None:
            problems.append(f"{other[0]}.json: {field} {other[1]!s:.16} differs from {v0!s:.16} in {p0}.json; "
                            "the files were made with different tokenizers: re-run preprocess with one tokenizer")
    pair = _other_tokenizer([(p, m) for p, m in items if m])
    if pair is not None:
        (p0, v0), (p, v), name = pair
        problems.append(f"{p}.json: {name} {v:.12} differs from {v0:.12} in {p0}.json; "
                        "the files were made with different tokenizers: re-run preprocess with one tokenizer")
    return problems


def _other_tokenizer(items):
    """The first two sidecars found naming different tokenizers, by the id both record (named as inspect-data's rows
    name it), or None. Every sidecar with a fingerprint is compared with those accepted before it, by its ids
    fingerprint where the fingerprints differ and both record one (two forms of one tokenizer, as
    `tokenizer_mismatches` judges); one from before the fingerprint with every other by sha256 (a few old files among many new ones:
    linear in the new)."""
    printed = [(p, m) for p, m in items if m.get("tokenizer_fingerprint") is not None]
    # one tokenizer: the sidecars reached from the first through shared fingerprints or ids fingerprints, passed over
    # until none is added (a sidecar accepted late can vouch for one passed earlier: no verdict hangs on the order)
    seen, ids_seen, left = set(), set(), list(printed)
    while left:
        kept = []  # the sidecars this pass could not yet join
        for p, m in left:
            ids = m.get("tokenizer_ids_fingerprint")
            if not seen or m["tokenizer_fingerprint"] in seen or (ids is not None and ids in ids_seen):
                seen.add(m["tokenizer_fingerprint"])
                ids_seen.update([ids] if ids is not None else [])
            else:
                kept.append((p, m))
        if len(kept) == len(left):
            break
        left = kept
    other = left[0] if left else None
    if other is not None:
        return ((printed[0][0], str(printed[0][1]["tokenizer_fingerprint"])),
                (other[0], str(other[1]["tokenizer_fingerprint"])), "tokenizer fingerprint")
    hashed, old = [], []  # the sidecars seen with a sha256; of those, the ones without a fingerprint
    for p, m in items:
        if m.get("tokenizer_sha256") is None:
            continue
        new = m.get("tokenizer_fingerprint") is not None
        for p0, m0 in old if new else hashed:  # two with fingerprints are compared above
            if m0["tokenizer_sha256"] != m["tokenizer_sha256"]:
                return (p0, str(m0["tokenizer_sha256"])), (p, str(m["tokenizer_sha256"])), "tokenizer.json sha256"
        hashed.append((p, m))
        if not new:
            old.append((p, m))
    return None


def tokenizer_mismatches(items, tok, instead: str | None = None) -> list[str]:
    """One line per token file whose sidecar names another tokenizer than `tok` (the run's: vocabulary size, eos
    id, or the tokenizer; files without a sidecar are not judged). Same-sized vocabularies can still split text
    differently (a tokenizer retrained on other text), which only the tokenizer tells: its `fingerprint`, else, as
    a resume judges its checkpoint's (`training.tokenizer_lineage.same_ids`), what decides its ids
    (`Tokenizer.ids_fingerprint`), so the other form of one tokenizer (GPT-2's vocab.json + merges.txt for its
    tokenizer.json) passes. A sidecar without `tokenizer_ids_fingerprint` (written before it) is judged by
    fingerprint alone: the tokenizer is not in it. A sidecar from before the fingerprint has only the sha256 of
    tokenizer.json's bytes, which a reformatted copy of the same tokenizer changes: there only the size and eos id
    are judged."""
    want = {"vocab_size": tok.vocab_size, "eos_token_id": tok.eos_token_id, "tokenizer_fingerprint": tok.fingerprint}
    accepted = {**{f: (v,) for f, v in want.items()}, "tokenizer_fingerprint": tok.fingerprints}
    problems = []
    for p, m in items:
        field = next((f for f in want if m and m.get(f) is not None and m[f] not in accepted[f]
                      and not (f == "tokenizer_fingerprint" and m.get("tokenizer_ids_fingerprint") is not None
                               and m["tokenizer_ids_fingerprint"] == tok.ids_fingerprint)), None)
        if field is not None:
            # `tok`'s value named by its path, not "the run's": inspect-data and eval have no run
            # a fingerprint by its first 12 characters, as train-tokenizer and inspect-data show it
            name, width = ("fingerprint", 12) if field == "tokenizer_fingerprint" else (field, 16)
            problems.append(f"{p}.json: made by another tokenizer than {tok.path} ({name} {m[field]!s:.{width}}; "
                            f"{tok.path} has {want[field]!s:.{width}}); re-run preprocess with {tok.path}, or "
                            f"{instead or 'set tokenizer_name_or_path to the tokenizer that made it'}")
    return problems
