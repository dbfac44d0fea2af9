"""Documents -> `<prefix>.bin/.idx` + `<prefix>.json` (the work behind `pretrain-cli preprocess`).

The documents are encoded in input order by `data.encode_pool` (reading in the parent, tokenizing in a worker
pool). A batch never spans two input files, so when a file's last batch is written the task records it as
finished (`data/tasks.py`) and a re-run after a kill continues with the next file. A task holds its prefix's
lock (`data/prefix_lock.py`) from before it looks at the prefix's files until it ends: two runs sharing the
in-progress files would publish a corrupt pair.

The command builds the `Job` and says where the lines go (`say`: results, `note`: progress and warnings);
this module prints nothing itself.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

from pretrain_cli import atomic
from pretrain_cli.counts import count
from pretrain_cli.data import encode_pool, tasks
from pretrain_cli.data.documents import DocumentReader, list_input_files, paragraph_note
from pretrain_cli.data.indexed import SIDECAR_FORMAT, dtype_for_vocab, read_sidecar, strip_prefix
from pretrain_cli.data.indexed_writer import IndexedDatasetWriter, check_output_prefix, sidecar_mismatch
from pretrain_cli.data.prefix_lock import PrefixLock
from pretrain_cli.data.token_file_tokenizers import tokenizer_mismatches
from pretrain_cli.errors import UserError



@dataclass(frozen=True)
class Job:
    """One preprocess task, as `pretrain-cli preprocess` builds it from its options (docs/DATA.md)."""

    input_path: tuple  # files, directories or glob patterns
    output_prefix: str
    tokenizer: str  # the tokenizer directory
    json_key: str = "text"
    append_eos: bool = False
    workers: int = 1
    log_interval: int = 10000  # documents between progress notes; 0: none
    max_doc_num: int | None = None
    skip_bad_lines: bool = False
    num_tasks: int = 1
    task_index: int = 0
    special_tokens_in_text: str = "text"  # what a document's special-token text becomes (`Tokenizer.for_documents`)


def _quiet(line: str) -> None:
    """Where a line goes when the caller asks for none."""


@dataclass
class _Task:
    """What the encoding loop works with, opened by `preprocess`: the job, its reader and writer, its files and
    prefix, the settings recorded with its progress, the token dtype, the EOS id, the tokenizer and whether a long
    document may be encoded in pieces."""

    job: Job
    reader: DocumentReader
    writer: IndexedDatasetWriter
    files: list
    prefix: str
    settings: dict
    dtype: np.dtype
    eos: int | None
    tok: object
    cuttable: object  # long_documents.cuttable's answer: where a long document may be cut, or None


def _inputs(job: Job, base: str, note: Callable[[str], None]):
    """(this task's files, files skipped by name, files in the whole job)."""
    all_files, skipped = list_input_files(job.input_path, lambda p: tasks.is_own_output(p, base), note)
    clash = [str(f) for f in all_files if tasks.is_own_output(f, base)]
    if clash:
        raise UserError(f"--output_prefix: {base} would overwrite the input {clash[0]}; choose another prefix")
    return tasks.task_share(all_files, job.num_tasks, job.task_index), skipped, len(all_files)


def preprocess(job: Job, say: Callable[[str], None] = _quiet, note: Callable[[str], None] = _quiet) -> int:
    """Tokenize `job.input_path` (this task's share) into `<output_prefix>[-iiiii-of-nnnnn]`.bin/.idx/.json.
    `say`: the outcome lines (the command's stdout); `note`: progress and warnings (its stderr)."""
    tasks.check_task(job.num_tasks, job.task_index)
    base = check_output_prefix(job.output_prefix, "--output_prefix",
                               tasks.task_prefix(strip_prefix(job.output_prefix), job.num_tasks, job.task_index))
    tok, cuttable = encode_pool.load(job.tokenizer, job.special_tokens_in_text)
    if job.special_tokens_in_text == "extra":
        _say_extra(job.tokenizer, tok, note)
    eos = None
    if job.append_eos:
        eos = tok.eos_token_id
        if eos is None:
            raise UserError(f"{job.tokenizer}: no EOS token (tokenizer_config.json eos_token); set one or drop "
                            "--append_eos")
    prefix = tasks.task_prefix(base, job.num_tasks, job.task_index)
    files, skipped, n_all = _inputs(job, base, note)
    task = f" (task {job.task_index} of {job.num_tasks}: files {len(files)} of {n_all})" if job.num_tasks > 1 else ""
    if not files:
        say(f"preprocess: nothing to do{task}: {count(n_all, 'input file')} for {count(job.num_tasks, 'task')}")
        return 0
    # before anything under the prefix is read or written
    lock = PrefixLock(prefix, note=lambda line: note(f"preprocess: warning: {line}"))
    try:
        return _locked(job, prefix, files, skipped, task, tok, cuttable, eos, say, note)
    finally:
        lock.release()


def _say_extra(tokenizer: str, tok, note: Callable[[str], None]) -> None:
    """`--special_tokens_in_text extra`'s note: no special token to match, or the special tokens left text for their
    role, which may be half a chat format (Qwen's instruct tokenizers make the marker `<|im_end|>` the EOS)."""
    if not tok.extra_special_tokens():
        note(f"preprocess: note: --special_tokens_in_text extra: {tokenizer} has no special token without a pad/bos/"
             f"eos/unk role, so every special token's text in a document stays text, as with `text`")
        return
    roles: dict[str, str] = {}  # token -> its roles ("pad/eos": one token may have two)
    for r, t in tok.special_tokens.items():
        if t is not None:
            roles[t] = f"{roles[t]}/{r}" if t in roles else r
    kept = [f"{t} ({roles[t]})" for t in tok.role_special_tokens()]
    if kept:
        note(f"preprocess: note: --special_tokens_in_text extra: the text of {', '.join(kept)} in a document stays "
             f"text, as {'that token has a role' if len(kept) == 1 else 'those tokens have roles'} in {tokenizer}; "
             f"use --special_tokens_in_text special to match them")


def _locked(job: Job, prefix: str, files: list, skipped: list, task: str, tok, cuttable, eos: int | None,
            say: Callable[[str], None], note: Callable[[str], None]) -> int:
    """`preprocess`'s work once it holds the prefix's lock."""
    dtype = dtype_for_vocab(tok.vocab_size)
    settings = {"tokenizer_sha256": tok.sha256, "dtype": dtype.name, "eos": eos, "json_key": job.json_key,
                "max_doc_num": job.max_doc_num,
                "special_tokens": job.special_tokens_in_text}  # (what a document's `</s>` becomes: another file)
    inputs_sha = tasks.files_sha256(files, settings)
    meta = read_sidecar(prefix)
    ours = (meta and meta.get("inputs_sha256") == inputs_sha and os.path.exists(prefix + ".bin")
            and os.path.exists(prefix + ".idx"))
    broken = sidecar_mismatch(prefix, meta) if ours else None
    if ours and not broken:
        tasks.remove_progress(prefix)
        say(f"preprocess: {prefix}.bin/.idx already complete for these inputs and settings{task}; nothing to do")
        return 0
    if broken:
        note(f"preprocess: {prefix}.bin/.idx are not what their sidecar describes ({broken}); re-creating them")
    elif meta and os.path.exists(prefix + ".bin"):  # other inputs or settings: the token files are replaced
        # "another tokenizer" as a run's check of the sidecar judges it: the other form of this one is not
        other = "another tokenizer" if tokenizer_mismatches([(prefix, meta)], tok) else "other inputs or settings"
        note(f"preprocess: replacing {prefix}.bin/.idx, made from {other}; the new files are published when "
             f"complete")
    rec = tasks.load_progress(prefix, files, settings, note)
    writer = None
    if rec is not None:
        try:
            writer = IndexedDatasetWriter(prefix, dtype, resume=rec["writer"])
        except FileNotFoundError as e:
            note(f"preprocess: cannot resume ({e}); starting this task over")
            rec = None
    if writer is None:
        tasks.remove_progress(prefix)
        writer = IndexedDatasetWriter(prefix, dtype)
    reader = DocumentReader(None, job.json_key, job.skip_bad_lines, job.max_doc_num, files=files, note=note)
    start, stats = 0, {"written": 0, "tokens": 0, "min_id": -1, "max_id": -1, "empty_after": 0}
    if rec is not None:
        reader.restore(rec["counters"])
        start = rec["done_files"]
        # a record from before min_id was kept: the finished files' smallest id is unknown (-2), never recorded
        stats = {k: int(rec["counters"].get(k, -2 if k == "min_id" else v)) for k, v in stats.items()}
        note(f"preprocess: resuming {prefix} after {start} of {count(len(files), 'file')} (last: {rec['last_file']}; "
             f"{count(stats['written'], 'document')} kept)")
    try:
        el, new_tokens, new_bytes = _run(_Task(job, reader, writer, files, prefix, settings, dtype, eos, tok,
                                               cuttable), start, stats, note)
    except BaseException as e:
        try:  # the record this run (or the one it resumed) saved, judged as a re-run will judge it
            rec = tasks.load_progress(prefix, files, settings)
        except OSError:  # (an input gone meanwhile: a re-run could not resume either)
            rec = None
        kept = rec["done_files"] if rec else 0
        if kept:  # keep finished files for the re-run
            writer.close()
        else:
            writer.abort()
        if isinstance(e, KeyboardInterrupt):  # the CLI's own line says only "interrupted"
            note(f"preprocess: interrupted: {kept} of {count(len(files), 'file')} kept in "
                 f"{tasks.progress_path(prefix)}; re-run the same command to resume" if kept else
                 f"preprocess: interrupted before the first of {count(len(files), 'file')} was finished; nothing kept "
                 f"(a re-run starts over)")
        raise
    docs, tokens, empty = stats["written"], stats["tokens"], reader.empty + stats["empty_after"]
    atomic.write_json(prefix + ".json", {
        "format": SIDECAR_FORMAT, "documents": docs, "tokens": tokens, "max_token_id": stats["max_id"],
        **({"min_token_id": stats["min_id"]} if stats["min_id"] >= 0 else {}),
        "dtype": dtype.name, "vocab_size": tok.vocab_size, "tokenizer": str(job.tokenizer),
        "tokenizer_sha256": tok.sha256, "tokenizer_fingerprint": tok.fingerprint,
        "tokenizer_ids_fingerprint": tok.ids_fingerprint,
        "eos_appended": bool(job.append_eos), "eos_token_id": tok.eos_token_id,
        "json_key": job.json_key, "special_tokens_in_text": job.special_tokens_in_text,
        "input_files": len(files), "num_tasks": job.num_tasks, "task_index": job.task_index,
        "inputs_sha256": inputs_sha, "skipped_bad_lines": reader.bad_lines,
        "skipped_corrupt_parts": reader.bad_parts, "skipped_empty_documents": empty,
        "skipped_long_paragraphs": reader.dropped_paragraphs,
    }, sort_keys=True)
    tasks.remove_progress(prefix)
    for f in skipped[:5]:
        note(f"preprocess: skipped {f} (not a .jsonl/.json/.txt/.parquet input)")
    corrupt = f", {reader.bad_parts} corrupt parts skipped" if reader.bad_parts else ""
    corrupt += f", {reader.dropped_note()} skipped" if reader.dropped_paragraphs else ""
    # --max_doc_num takes the first documents in file order: said, with how far into the files that reached
    cap = (f"; --max_doc_num {job.max_doc_num}: the first documents, from {start + reader.files_read} of "
           f"{count(len(files), 'file')}" if reader.exhausted else "")
    say(f"preprocess: wrote {prefix}.bin/.idx{task}: {count(docs, 'document')}, {count(tokens, 'token')} "
        f"({dtype.name}), max id {stats['max_id']}, {empty} empty skipped, {reader.bad_lines} bad lines skipped"
        f"{corrupt}, {el:.1f}s ({new_tokens / max(el, 1e-9):.0f} tokens/s, {new_bytes / max(el, 1e-9) / 1e6:.1f} "
        f"MB/s){cap}")
    said = paragraph_note(reader)
    if said:
        note(f"preprocess: {said}")
    if eos is None and tok.eos_token_id is not None:  # (after the summary: a bad input's error stays one line)
        note(f"preprocess: note: no --append_eos: the documents do not end in {tok.special_tokens['eos']} (the EOS "
             f"of {job.tokenizer}), so packed training samples run one document into the next with nothing between "
             f"them; add --append_eos (sample_mode padded adds an EOS itself)")
    return 0


def _run(t: _Task, start: int, stats: dict, note: Callable[[str], None]) -> tuple[float, int, int]:
    """Encode and write from file `start` on; record each finished file; finalize.
    Returns (seconds, tokens written, bytes read) of this process."""
    job, reader, writer, files, prefix, settings, tok = t.job, t.reader, t.writer, t.files, t.prefix, t.settings, t.tok
    t0 = time.perf_counter()
    bytes0, docs0, tokens0 = reader.bytes, stats["written"], stats["tokens"]
    next_log = docs0 + job.log_interval
    for item in encode_pool.results(job, encode_pool.work(reader, files, start), t.dtype, t.eos, tok, t.cuttable):
        if isinstance(item, encode_pool.FileDone):
            tasks.save_progress(prefix, files, item.k + 1, settings, writer.checkpoint(), {**item.counters, **stats})
            continue
        flat, lengths, batch_max, n_empty = item
        if batch_max >= tok.vocab_size:
            raise UserError(f"{job.tokenizer}: produced token id {batch_max} >= vocab size {tok.vocab_size}; "
                            "the tokenizer files are inconsistent, re-create them")
        writer.add_documents(flat, lengths)
        stats["written"] += lengths.size
        stats["tokens"] += int(flat.size)
        stats["max_id"] = max(stats["max_id"], batch_max)
        if flat.size and stats["min_id"] != -2:  # recorded so that `check` need not scan an int32 file for ids < 0
            low = int(flat.min())
            stats["min_id"] = low if stats["min_id"] == -1 else min(stats["min_id"], low)
        stats["empty_after"] += n_empty
        if job.log_interval and stats["written"] >= next_log:
            next_log = stats["written"] + job.log_interval
            el = time.perf_counter() - t0
            done = stats["written"] - docs0
            note(f"preprocess: {stats['written']} docs, {done / el:.0f} docs/s, "
                 f"{(stats['tokens'] - tokens0) / el:.0f} tokens/s, {(reader.bytes - bytes0) / el / 1e6:.1f} MB/s")
    if stats["written"] == 0:
        tasks.remove_progress(prefix)
        raise UserError(f"--input_path: no non-empty documents in {' '.join(map(str, job.input_path))}; "
                        f"check the files and --json_key ({job.json_key!r})")
    writer.finalize()
    return time.perf_counter() - t0, stats["tokens"] - tokens0, reader.bytes - bytes0
