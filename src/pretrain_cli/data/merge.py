"""Joining token files into one pair (the work behind `pretrain-cli merge-data`), and the checks that
several token files were made with the same tokenizer (shared with `inspect-data` on a directory), and with
the run's (`data.build_datasets`: `train`, `check`, `inspect-data --tokenizer`).

The join is Megatron-LM's `merge_datasets.py` / PaddleNLP's `merge_file_`: tokens back to back,
sizes appended, pointers recomputed, each input's doc_idx shifted by the sequences before it, and
the dtypes must agree. Inputs are streamed in chunks and the pair is published with the writer's
renames, so memory stays flat and a crash leaves nothing under the output's name. Joining the
outputs of `preprocess --num_tasks N` in task order gives exactly the bytes of one single run. The output
prefix's lock (`data/prefix_lock.py`, as `preprocess` takes it) is held from before the inputs are opened until
the sidecar is written: a merge and a preprocess (or two merges) into one prefix would share its in-progress files.
"""
from __future__ import annotations

import os

import numpy as np

from pretrain_cli import atomic
from pretrain_cli.counts import count
from pretrain_cli.data.indexed import SIDECAR_FORMAT, open_token_file, read_sidecar, strip_prefix, token_prefixes
from pretrain_cli.data.indexed_writer import IndexedDatasetWriter, check_output_prefix
from pretrain_cli.data.prefix_lock import PrefixLock
from pretrain_cli.errors import UserError

TOKENIZER_FIELDS = ("vocab_size", "eos_token_id", "tokenizer_sha256")
_CHUNK = 1 << 24


def expand_prefixes(inputs, note=None) -> list[str]:
    """Prefixes as given, a directory standing for all its token files in sorted order. A file given more than once
    (by its prefix and in its directory, twice over, or through a symlinked directory: `same_file`) is joined once,
    where it first comes, and `note` gets one line saying so, each mention as typed; a directory's files given again
    together (the directory twice) get one line for them all. A source repeated on purpose is a copy under another
    name, which `repeated_inputs` names."""
    out, given = [], {}  # same_file key -> (the prefix joined, how each mention gave it)
    for x in map(str, inputs):
        if os.path.isdir(x):
            found = token_prefixes(x)
            if not found:
                raise UserError(f"{x}: directory holds no .idx or _idx.npz token files; pass token file prefixes")
            how = f"in {x}"
        else:
            found, how = [strip_prefix(x)], f"as {x}"
        for p in found:
            first = given.setdefault(same_file(p), (p, []))
            first[1].append(how)
            if len(first[1]) == 1:
                out.append(p)
    said: dict = {}  # the mentions of files given more than once -> those files
    for p, hows in given.values():
        if len(hows) > 1:
            said.setdefault(tuple(hows), []).append(p)
    for hows, files in said.items() if note is not None else ():
        times = "twice" if len(hows) == 2 else f"{len(hows)} times"
        mentions = f"{', '.join(hows[:-1])} and {hows[-1]}"
        if len(files) == 1:
            note(f"note: {files[0]} is given {times} ({mentions}): joined once, where it first comes; to join it "
                 f"{times}, give a copy under another name")
        else:  # only directories' mentions name more than one file: the first names where they are
            note(f"note: {count(len(files), 'token file')} {hows[0]} are given {times} ({mentions}): each joined "
                 f"once, where it first comes; to join them {times}, give copies under other names")
    return out


def same_file(prefix: str) -> str:
    """What tells two prefixes of one token file apart from two files: the prefix's real path, its directories'
    symlinks followed (`e/man` with e -> d is `d/man`), so that no file is joined twice and no output overwrites an
    input. A prefix whose own .bin/.idx are symlinks stays its own name: a symlinked `alias.bin` is how a source is
    repeated on purpose without a copy of its bytes, and the output is published by renames, which replace such a
    link and leave its target alone. An output whose files are an input's link targets (`d/man.bin -> d/other.bin`,
    output `d/other`) is judged by `_files_of`: those renames would replace the input's bytes."""
    return os.path.realpath(prefix)


def _files_of(prefix: str, follow: bool = True) -> set[str]:
    """The real files a prefix's .bin and .idx are, their own symlinks followed (an input's: what the output must not
    be); `follow=False` for the output, whose own links the merge's renames replace without touching their targets."""
    if follow:
        return {os.path.realpath(prefix + ext) for ext in (".bin", ".idx")}
    where, name = os.path.split(prefix)
    return {os.path.join(os.path.realpath(where or "."), name + ext) for ext in (".bin", ".idx")}


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


_WHOLE = 1_000_000  # tokens: a smaller repeated window is compared whole


_NAMED = 3  # inputs a repeat is named in; past them "and N more"


def repeated_inputs(datasets) -> list[str]:
    """One line per input, or group of identical inputs, whose sequences all appear, in a row, inside other inputs
    (an identical file, or a file preprocessed from a superset of its corpus, e.g. `all` made from man + code merged
    with `man`), naming every input they are in, the group's own copies too (the first `_NAMED`, then how many
    more): joined, those documents would be trained on once more for each. Sidecars record only one sha256 of all of
    a file's inputs and settings, which cannot tell that one corpus holds another, so the tokens are compared
    (`_repeat_at`). Identical inputs are grouped first (`_identical`) and each group is compared through its first
    input alone, so k copies cost k - 1 comparisons, not k(k-1)/2. What it costs: each pair of distinct inputs has
    its lengths compared (the .idx, in memory); where some start's first and last lengths agree, it reads the
    smaller's first sequence, the larger's first token at each such start, and its sequence at each start where that
    token agrees too; the window's tokens where a start's first sequence and the lengths agree;
    a pair found repeated reads its window in both files (whole under `_WHOLE` tokens, else 10 sequences), so a
    merge with repeats reads more than one without: a repeated input's window twice for each distinct input
    holding it."""
    groups = _identical(datasets)
    lines = []
    for group in groups:
        b = datasets[group[0]]
        nb = len(b)
        found = [(i, f"those of {datasets[i].prefix}") for i in group[:-1]]  # its own copies
        for holders in groups:
            na = len(datasets[holders[0]])
            if na <= nb:  # (equal lengths: the same only, and those are grouped)
                continue
            hit = _repeat_at(datasets[holders[0]], b)
            if hit is not None:  # in each of that group's copies alike
                found += [(i, f"sequences {hit:,} to {hit + nb - 1:,} of {na:,} of {datasets[i].prefix}")
                          for i in holders]
        if found:
            said = [text for _, text in sorted(found)]
            named = said[:_NAMED] + ([f"those of {count(len(said) - _NAMED, 'more input')}"]
                                     if len(said) > _NAMED else [])
            where = named[0] if len(named) == 1 else f"{', '.join(named[:-1])} and {named[-1]}"
            times = "twice" if len(said) == 1 else f"{len(said) + 1} times"
            lines.append((group[-1], f"{datasets[group[-1]].prefix}: its {count(nb, 'sequence', grouped=True)} are "
                                     f"{where}; joined, they are trained on {times}: drop "
                                     f"{'one input' if len(said) == 1 else 'the repeats'} unless you mean to repeat "
                                     f"them"))
    return [line for _, line in sorted(lines)]


def _identical(datasets) -> list[list[int]]:
    """The non-empty inputs' indices in groups of identical ones (each in input order, a group's line said for its
    last), groups in the order their first comes: each input is compared with the first of each group of its
    length only, never again with the copies already found."""
    groups: list[list[int]] = []
    for j, b in enumerate(datasets):
        if len(b) == 0:
            continue
        same = next((g for g in groups if len(datasets[g[0]]) == len(b) and _repeat_at(datasets[g[0]], b) == 0),
                    None)
        if same is None:
            groups.append([j])
        else:
            same.append(j)
    return groups


def _repeat_at(a, b) -> int | None:
    """The first sequence of `a` from which all of `b`'s follow, or None. Every start is tried (sequences of
    equal lengths make every start a candidate by length), filtered cheaply first: the first and last lengths,
    the first token (one gather), the first sequence's tokens, then the window of lengths; a start past those
    is checked on the tokens: the whole window under `_WHOLE` tokens, else the first, last and 8 evenly spaced
    interior sequences (a chance match of every length and ten documents' tokens is no risk worth a full scan)."""
    na, nb = len(a), len(b)
    sa, sb = np.asarray(a.sizes), np.asarray(b.sizes)
    starts = np.flatnonzero((sa[: na - nb + 1] == sb[0]) & (sa[nb - 1 :] == sb[-1]))
    if not len(starts):
        return None
    first = np.asarray(b.get(0))
    if len(first):
        offsets = np.asarray(a.pointers)[starts] // a.dtype.itemsize
        starts = starts[np.asarray(a.data[offsets]) == first[0]]
    b0 = b.element_offset(0)
    width = b.element_offset(nb - 1) + int(sb[-1]) - b0  # b's tokens, stored back to back
    picks = np.unique(np.linspace(0, nb - 1, 10).round().astype(np.int64))  # first, last, 8 between
    for k in map(int, starts):
        if not (np.array_equal(a.get(k), first) and np.array_equal(sa[k : k + nb], sb)):
            continue
        if width < _WHOLE:
            a0 = a.element_offset(k)
            same = np.array_equal(a.tokens(a0, a0 + width), b.tokens(b0, b0 + width))
        else:
            same = all(np.array_equal(a.get(k + int(p)), b.get(int(p))) for p in picks)
        if same:
            return k
    return None


def merge(output: str, inputs, note=None) -> dict:
    """Write `output`.bin/.idx (+ .lsm if every input has one) + .json from `inputs`; returns the sidecar. `note`
    receives, before anything is written, a `note: ` line for each input given more than once (`expand_prefixes`),
    a `warning: ` line for each input repeated inside another (`repeated_inputs`) and a `note: ` line when the
    inputs' `--special_tokens_in_text` differ."""
    out = check_output_prefix(str(output), "output")
    prefixes = expand_prefixes(inputs, note)
    if same_file(out) in {same_file(p) for p in prefixes}:
        raise UserError(f"{out}: the output is also an input; choose another output prefix")
    linked = next((p for p in prefixes if _files_of(out, follow=False) & _files_of(p)), None)
    if linked is not None:
        raise UserError(f"{out}: the output's files are those {linked}.bin/.idx link to, an input; choose another "
                        "output prefix")
    warn = None if note is None else lambda line: note(f"warning: {line}")
    lock = PrefixLock(out, "output prefix", "merge-data", warn)  # before anything under the prefix is written
    try:
        return _merge(out, prefixes, note)
    finally:
        lock.release()


def _merge(out: str, prefixes: list[str], note) -> dict:
    """`merge`'s work once it holds the output prefix's lock."""
    datasets = [open_token_file(p) for p in prefixes]  # every structural check before any write
    metas = [read_sidecar(p) for p in prefixes]
    first = datasets[0]
    for ds in datasets[1:]:
        if ds.dtype != first.dtype:
            raise UserError(f"{ds.prefix}: dtype {ds.dtype.name} differs from {first.dtype.name} of {first.prefix}; "
                            "token files can only be joined if they share a dtype (re-run preprocess with one "
                            "tokenizer)")
    problems = tokenizer_problems(list(zip(prefixes, metas)))
    if problems:
        raise UserError("\n".join(problems))
    _check_eos(prefixes, metas)
    for line in repeated_inputs(datasets) if note is not None else ():
        note(f"warning: {line}")
    specials, mixed = _special_tokens_in_text(prefixes, metas)
    if mixed is not None and note is not None:
        note(f"note: the inputs' --special_tokens_in_text differ ({mixed}): their special-token text is not alike, "
             f"so {out}.json records none")
    with_lsm = [ds.loss_mask is not None for ds in datasets]
    if any(with_lsm) and not all(with_lsm):
        odd = datasets[with_lsm.index(not with_lsm[0])]
        raise UserError(f"{odd.prefix}: has {'a' if odd.loss_mask is not None else 'no'} .lsm loss mask unlike "
                        f"{first.prefix}; give every input a mask or none")
    try:
        with IndexedDatasetWriter(out, first.dtype) as writer:
            if all(with_lsm):  # before the .idx, which is the commit point
                with atomic.publishing(out + ".lsm") as f:
                    for ds in datasets:
                        for s in range(0, ds.num_tokens, _CHUNK):
                            f.write(np.asarray(ds.loss_mask[s : s + _CHUNK], np.uint8).tobytes())
            for ds in datasets:
                writer.add_dataset(ds)
            writer.finalize()
    except BaseException:
        if all(with_lsm) and not os.path.exists(out + ".idx") and os.path.exists(out + ".lsm"):
            os.remove(out + ".lsm")
        raise
    known = [m for m in metas if m]
    meta = {"format": SIDECAR_FORMAT, "documents": sum(d.num_documents for d in datasets),
            "tokens": sum(d.num_tokens for d in datasets), "dtype": first.dtype.name,
            "max_token_id": max(d.max_token_id() for d in datasets), "merged_from": prefixes,
            "inputs_without_sidecar": len(prefixes) - len(known)}
    if first.dtype.kind != "u":  # what `check` needs of a signed file (no id below 0), so it need not scan it
        meta["min_token_id"] = min(d.min_token_id() for d in datasets)
    for field in (*TOKENIZER_FIELDS, "tokenizer_fingerprint", "tokenizer_ids_fingerprint", "tokenizer",
                  "eos_appended", "json_key"):
        vals = {str(m.get(field)) for m in known if field in m}
        # several fingerprints: forms of one tokenizer (`tokenizer_problems` passed), the first's is recorded
        if len(vals) == 1 or (vals and field == "tokenizer_fingerprint"):
            meta[field] = next(m[field] for m in known if field in m)
    if specials is not None:
        meta["special_tokens_in_text"] = specials
    atomic.write_json(out + ".json", meta, sort_keys=True)
    return meta


def _special_tokens_in_text(prefixes, metas) -> tuple[str | None, str | None]:
    """(the inputs' `special_tokens_in_text` if every input with a sidecar records the same one, else None; what
    differs, for a note, or None). A sidecar from before the option records none, and its file may hold special
    tokens' text as text or as ids (before 4862da56), so one such input leaves the output's unknown too."""
    modes: dict = {}  # choice (None: not recorded) -> the inputs made with it
    for p, m in zip(prefixes, metas):
        if m:
            modes.setdefault(m.get("special_tokens_in_text"), []).append(p)
    if len(modes) <= 1:
        return next(iter(modes), None), None
    said = "; ".join(f"{mode or 'not recorded'}: {ps[0]}" + (f" and {len(ps) - 1} more" if len(ps) > 1 else "")
                     for mode, ps in modes.items())
    return None, said


def _check_eos(prefixes, metas) -> None:
    """Inputs preprocessed with and without `--append_eos` are refused: joined, the files without EOS would run their
    documents together in packed samples (EOS is the only separator), and the output could not say whether it has
    EOS. Files without a sidecar are not judged."""
    known = [(p, m["eos_appended"]) for p, m in zip(prefixes, metas) if m and m.get("eos_appended") is not None]
    odd = next(((p, v) for p, v in known if v != known[0][1]), None)
    if odd is not None:
        with_eos, without = (odd[0], known[0][0]) if odd[1] else (known[0][0], odd[0])
        raise UserError(f"{without}.json: made without --append_eos, unlike {with_eos}.json (eos_appended); "
                        f"re-run preprocess for one of them so that all inputs agree")


def merge_summary(output: str, meta: dict) -> str:
    n = meta["inputs_without_sidecar"]
    note = (f"; {count(n, 'input')} had no .json sidecar, so {'its' if n == 1 else 'their'} tokenizer is unchecked"
            if n else "")
    return (f"merge-data: wrote {strip_prefix(output)}.bin/.idx from {count(len(meta['merged_from']), 'file')}: "
            f"{count(meta['documents'], 'document')}, {count(meta['tokens'], 'token')} ({meta['dtype']}){note}")

