"""Joining token files into one pair (the work behind `pretrain-cli merge-data`), after the checks that the inputs
were made with one tokenizer (`data.token_file_tokenizers`) and the warnings for an input repeated inside another
or a source two inputs share (`data.repeats`).

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
from pretrain_cli.data.repeats import repeated_inputs
from pretrain_cli.data.token_file_tokenizers import TOKENIZER_FIELDS, tokenizer_problems
from pretrain_cli.errors import UserError

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


def merge(output: str, inputs, note=None) -> dict:
    """Write `output`.bin/.idx (+ .lsm if every input has one) + .json from `inputs`; returns the sidecar. `note`
    receives, before anything is written, a `note: ` line for each input given more than once (`expand_prefixes`),
    a `warning: ` line for each input repeated inside another and each source inputs share (`repeated_inputs`), and
    a `note: ` line when the inputs' `--special_tokens_in_text` differ."""
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

