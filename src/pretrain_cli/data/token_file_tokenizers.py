"""Whether token files were made with one tokenizer, and with the run's, from their .json sidecars: shared by
`merge-data` (its inputs), `inspect-data` on a directory, the run (`data.build_datasets`: `train`, `check`,
`inspect-data --tokenizer`), `preprocess`'s note on the files it replaces, and a model directory without tokenizer
files (a resume, eval, continue_training), whose args.json records its tokenizer in a sidecar's fields
(`training.tokenizer_lineage`). Two forms of one tokenizer (vocab.json + merges.txt against its tokenizer.json) are
one where both sidecars record the ids fingerprint (`data.tokenizer_ids.ids_form`); older sidecars are judged by the
fingerprint, and those from before it by tokenizer.json's sha256.
"""
from __future__ import annotations

TOKENIZER_FIELDS = ("vocab_size", "eos_token_id", "tokenizer_sha256")


def tokenizer_problems(items) -> list[str]:
    """One line per tokenizer field on which the files' sidecars disagree (files without one are not judged), each
    a `disagreements` tuple said with the way out: re-run preprocess with one tokenizer."""
    return [f"{p}.json: {name} {v} differs from {v0} in {p0}.json; the files were made with different tokenizers: "
            "re-run preprocess with one tokenizer" for p, name, v, p0, v0 in disagreements(items)]


def disagreements(items) -> list[tuple[str, str, str, str, str]]:
    """(prefix, field, its value, the prefix it differs from, that one's value) per tokenizer field on which the
    sidecars of `items` ((prefix, sidecar or None)) disagree: vocabulary size, EOS id, and the tokenizer, which
    differs where they fall into more than one of `tokenizer_groups` (named by the fingerprint where a sidecar of
    each group records one, else by tokenizer.json's sha256). Values as the lines show them: a fingerprint or sha256
    by its first 12 characters, as train-tokenizer and inspect-data print it."""
    found = []
    for field in ("vocab_size", "eos_token_id"):
        vals = [(p, m[field]) for p, m in items if m and m.get(field) is not None]
        other = next(((p, v) for p, v in vals if v != vals[0][1]), None)
        if other is not None:
            found.append((other[0], field, f"{other[1]!s:.16}", vals[0][0], f"{vals[0][1]!s:.16}"))
    groups = tokenizer_groups(items)
    if len(groups) > 1:
        for field, name in (("tokenizer_fingerprint", "tokenizer fingerprint"),
                            ("tokenizer_sha256", "tokenizer.json sha256")):
            a, b = (next(((p, m[field]) for p, m in g if m.get(field)), None) for g in groups[:2])
            if a is not None and b is not None:
                found.append((b[0], name, f"{b[1]!s:.12}", a[0], f"{a[1]!s:.12}"))
                break
        else:  # each group names its tokenizer by another field: each by its own
            (p0, m0), (p, m) = groups[0][0], groups[1][0]
            found.append((p, "tokenizer", tokenizer_named(m), p0, tokenizer_named(m0)))
    return found


def tokenizer_groups(items) -> list[list[tuple]]:
    """The sidecars of `items` that name a tokenizer, in groups of one tokenizer each, in the order of each group's
    first sidecar: the one rule of "the same tokenizer" between token files (`tokenizer_problems` refuses more than
    one group; inspect-data names the groups). Two sidecars are of one tokenizer where both record one fingerprint;
    or one ids fingerprint, with fingerprints that differ (two forms of one tokenizer, as `tokenizer_mismatches`
    judges); or, where either is from before the fingerprint, one tokenizer.json sha256 (a reformatted copy changes
    the sha256, not the fingerprint: two with fingerprints are not compared by it). And so are two joined through
    others: the groups are the connected ones, so no verdict hangs on the files' order; linear in the sidecars."""
    named = [(p, m) for p, m in items if m and (m.get("tokenizer_fingerprint") or m.get("tokenizer_sha256"))]
    parent = list(range(len(named)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    def has(m: dict) -> list[tuple]:
        """The values a sidecar is found by: its fingerprint, its ids fingerprint, its sha256 ("any") and, from
        before the fingerprint, its sha256 again ("old")."""
        fp, sha = m.get("tokenizer_fingerprint"), m.get("tokenizer_sha256")
        return [k for k in (("fp", fp), ("ids", fp and m.get("tokenizer_ids_fingerprint")), ("any", sha),
                            ("old", not fp and sha)) if k[1]]

    def joins(m: dict) -> list[tuple]:
        """The values that join it to the first sidecar found by the same: one from before the fingerprint, by its
        sha256 to any; one after, by its fingerprints, and by its sha256 to one from before."""
        fp, sha = m.get("tokenizer_fingerprint"), m.get("tokenizer_sha256")
        if not fp:
            return [("any", sha)]
        return [k for k in (("fp", fp), ("ids", m.get("tokenizer_ids_fingerprint")), ("old", sha)) if k[1]]

    first: dict = {}  # (kind, value) -> the first sidecar that has it
    for i, (_, m) in enumerate(named):
        for k in has(m):
            first.setdefault(k, i)
    for i, (_, m) in enumerate(named):
        for k in joins(m):
            if k in first:
                parent[root(i)] = root(first[k])
    groups: dict = {}  # root -> its sidecars, in the order each group's first sidecar comes
    for i, item in enumerate(named):
        groups.setdefault(root(i), []).append(item)
    return list(groups.values())


def tokenizer_named(meta: dict) -> str:
    """A tokenizer as a sidecar (or a run's record of it: `training.tokenizer_lineage`) names it: its path as
    preprocess was given it (none where a merge joined files made with tokenizers at several paths), its ids
    fingerprint (`Tokenizer.ids_fingerprint`: what decides whether two files, or a file and a run's tokenizer,
    match) and its fingerprint (what train-tokenizer prints and check's error names), each by its first 12
    characters. A sidecar from before the ids fingerprint has the fingerprint alone; one from before that,
    tokenizer.json's sha256, said as such."""
    ids, fp = meta.get("tokenizer_ids_fingerprint"), meta.get("tokenizer_fingerprint")
    if fp:
        said = f"ids fingerprint {str(ids)[:12]}, fingerprint {str(fp)[:12]}" if ids else f"fingerprint {str(fp)[:12]}"
    else:
        said = f"tokenizer.json sha256 {str(meta.get('tokenizer_sha256'))[:12]}"
    return f"tokenizer {meta['tokenizer']} ({said})" if meta.get("tokenizer") else f"tokenizer ({said})"


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
    problems, judged = [], _judge(tok)
    for p, m in items:
        found = judged(m)
        if found is not None:
            # `tok`'s value named by its path, not "the run's": inspect-data and eval have no run
            name, have, want = found
            problems.append(f"{p}.json: made by another tokenizer than {tok.path} ({name} {have}; {tok.path} has "
                            f"{want}); re-run preprocess with {tok.path}, or "
                            f"{instead or 'set tokenizer_name_or_path to the tokenizer that made it'}")
    return problems


def mismatch(meta: dict | None, tok) -> tuple[str, str, str] | None:
    """(field, the sidecar's value, `tok`'s) of the first field on which `meta` names another tokenizer than `tok`
    (`tokenizer_mismatches`' rule), or None; a fingerprint by its first 12 characters, as train-tokenizer and
    inspect-data show it."""
    return _judge(tok)(meta)


def _judge(tok):
    """`mismatch` against `tok`, its accepted values read once (`Tokenizer.fingerprints` serialises the tokenizer:
    a Qwen-size one, ~0.4 s), for every sidecar of a run's files."""
    want = {"vocab_size": tok.vocab_size, "eos_token_id": tok.eos_token_id, "tokenizer_fingerprint": tok.fingerprint}
    accepted = {**{f: (v,) for f, v in want.items()}, "tokenizer_fingerprint": tok.fingerprints}

    def judged(meta: dict | None) -> tuple[str, str, str] | None:
        field = next((f for f in want if meta and meta.get(f) is not None and meta[f] not in accepted[f]
                      and not (f == "tokenizer_fingerprint" and meta.get("tokenizer_ids_fingerprint") is not None
                               and meta["tokenizer_ids_fingerprint"] == tok.ids_fingerprint)), None)
        if field is None:
            return None
        name, width = ("fingerprint", 12) if field == "tokenizer_fingerprint" else (field, 16)
        return name, f"{meta[field]!s:.{width}}", f"{want[field]!s:.{width}}"
    return judged
