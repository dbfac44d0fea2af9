"""Documents -> `<prefix>.bin/.idx` + `<prefix>.json` (the work behind `pretrain-cli preprocess`).

Reading stays in the parent process (so a bad line names its file and line number);
tokenization runs in a worker pool fed through a bounded window of batches, because
`Pool.imap` drains its input eagerly and would hold the whole corpus in memory.
"""
from __future__ import annotations

import collections
import os
import sys
import time

import numpy as np

from pretrain_cli import atomic
from pretrain_cli.data.documents import DocumentReader, batches
from pretrain_cli.data.indexed import SIDECAR_FORMAT, IndexedDatasetWriter, dtype_for_vocab, strip_prefix
from pretrain_cli.data.tokenizer import load_tokenizer
from pretrain_cli.errors import UserError


_WORKER: dict = {}


def _init_worker(tokenizer_dir: str, dtype: str, eos: int | None) -> None:
    from pretrain_cli.data.tokenizer import load_tokenizer

    _WORKER.update(tok=load_tokenizer(tokenizer_dir), dtype=np.dtype(dtype), eos=eos)


def _encode(texts: list[str]):
    """-> (flat tokens, lengths int64 [docs], max id); documents that tokenize to nothing are dropped."""
    ids = _WORKER["tok"].encode_batch(texts)
    eos = _WORKER["eos"]
    if eos is not None:
        ids = [x + [eos] if x else x for x in ids]
    lengths = np.fromiter((len(x) for x in ids), np.int64, len(ids))
    flat = np.fromiter((t for x in ids for t in x), np.int64, int(lengths.sum()))
    max_id = int(flat.max()) if flat.size else -1
    return flat.astype(_WORKER["dtype"]), lengths[lengths > 0], max_id, int((lengths == 0).sum())


def _results(ns, texts, dtype, eos):
    """Yield worker results in input order, keeping at most a few batches in flight."""
    if ns.workers <= 1:
        _init_worker(ns.tokenizer, dtype.str, eos)
        for b in batches(texts):
            yield _encode(b)
        return
    import multiprocessing as mp

    with mp.get_context("fork").Pool(ns.workers, _init_worker, (ns.tokenizer, dtype.str, eos)) as pool:
        window = collections.deque()
        for b in batches(texts):
            window.append(pool.apply_async(_encode, (b,)))
            if len(window) >= 2 * ns.workers + 2:
                yield window.popleft().get()
        while window:
            yield window.popleft().get()


def preprocess(ns) -> int:
    """Tokenize `ns.input_path` into `ns.output_prefix`.bin/.idx/.json (the `preprocess` command's options)."""

    tok = load_tokenizer(ns.tokenizer)
    eos = None
    if ns.append_eos:
        eos = tok.eos_token_id
        if eos is None:
            raise UserError(f"{ns.tokenizer}: no EOS token (tokenizer_config.json eos_token); set one or drop --append_eos")
    prefix = strip_prefix(ns.output_prefix)
    reader = DocumentReader(ns.input_path, ns.json_key, ns.skip_bad_lines, ns.max_doc_num)
    outputs = {os.path.abspath(prefix + ext) for ext in (".bin", ".idx", ".json")}
    clash = [str(f) for f in reader.files if os.path.abspath(f) in outputs]
    if clash:
        raise UserError(f"--output_prefix: {prefix} would overwrite the input {clash[0]}; choose another prefix")
    dtype = dtype_for_vocab(tok.vocab_size)
    t0 = time.perf_counter()
    docs = tokens = max_id = empty_after = 0
    next_log = ns.log_interval
    with IndexedDatasetWriter(prefix, dtype) as writer:
        for flat, lengths, batch_max, n_empty in _results(ns, reader, dtype, eos):
            if batch_max >= tok.vocab_size:
                raise UserError(f"{ns.tokenizer}: produced token id {batch_max} >= vocab size {tok.vocab_size}; "
                                "the tokenizer files are inconsistent, re-create them")
            writer.add_documents(flat, lengths)
            docs, tokens = docs + lengths.size, tokens + int(flat.size)
            max_id, empty_after = max(max_id, batch_max), empty_after + n_empty
            if ns.log_interval and docs >= next_log:
                next_log = docs + ns.log_interval
                el = time.perf_counter() - t0
                print(f"preprocess: {docs} docs, {docs / el:.0f} docs/s, {tokens / el:.0f} tokens/s, "
                      f"{reader.bytes / el / 1e6:.1f} MB/s", file=sys.stderr, flush=True)
        if docs == 0:
            writer.abort()
            raise UserError(f"--input_path: no non-empty documents in {' '.join(map(str, ns.input_path))}; "
                            f"check the files and --json_key ({ns.json_key!r})")
        writer.finalize()
    el = time.perf_counter() - t0
    meta = {
        "format": SIDECAR_FORMAT, "documents": docs, "tokens": tokens, "max_token_id": max_id,
        "dtype": dtype.name, "vocab_size": tok.vocab_size, "tokenizer": str(ns.tokenizer),
        "tokenizer_sha256": tok.sha256, "eos_appended": bool(ns.append_eos), "eos_token_id": eos,
        "json_key": ns.json_key, "input_files": len(reader.files), "skipped_bad_lines": reader.bad_lines,
        "skipped_empty_documents": reader.empty + empty_after,
    }
    atomic.write_json(prefix + ".json", meta, sort_keys=True)
    for f in reader.skipped_files[:5]:
        print(f"preprocess: skipped {f} (not .jsonl/.json/.txt)", file=sys.stderr)
    print(f"preprocess: wrote {prefix}.bin/.idx: {docs} documents, {tokens} tokens ({dtype.name}), "
          f"max id {max_id}, {reader.empty + empty_after} empty skipped, {reader.bad_lines} bad lines skipped, "
          f"{el:.1f}s ({tokens / max(el, 1e-9):.0f} tokens/s, {reader.bytes / max(el, 1e-9) / 1e6:.1f} MB/s)")
    return 0
