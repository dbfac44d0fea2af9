"""A preprocess task's documents encoded in input order: reading (and JSON parsing) on a thread of the parent, so a bad
line names its file and line number; tokenization in a worker pool fed through a bounded window of batches, because
`Pool.imap` drains its input eagerly and would hold the whole corpus in memory. A batch never spans two input files,
and a `FileDone` marker follows each file's last batch, so the task can record the file as finished (`data.tasks`).
"""
from __future__ import annotations

import collections
import itertools
import queue
import threading

import numpy as np

from pretrain_cli.data import long_documents
from pretrain_cli.data.documents import DocumentReader, batches
from pretrain_cli.data.tokenizer import load_tokenizer

_WORKER: dict = {}


def load(tokenizer_dir: str, special_tokens: str, keep_original: bool = True):
    """The tokenizer as preprocess encodes with it: what special tokens' text in documents becomes (by default plain
    text: only --append_eos adds an EOS), and whether a long document may be encoded in pieces
    (`data.long_documents`). A worker keeps only what encodes (`Tokenizer.for_documents`)."""
    tok = load_tokenizer(tokenizer_dir).for_documents(special_tokens, keep_original)
    return tok, long_documents.cuttable(tok.pipeline())


def _init_worker(tokenizer_dir: str, special_tokens: str, dtype: str, eos: int | None) -> None:
    tok, cuttable = load(tokenizer_dir, special_tokens, keep_original=False)
    _trim_heap()
    _WORKER.update(tok=tok, cuttable=cuttable, dtype=np.dtype(dtype), eos=eos)


def _trim_heap() -> None:
    """Give the heap that loading freed back to the system (glibc's `malloc_trim`; elsewhere nothing): a worker's
    dropped tokenizer and parse garbage are otherwise kept for its life. With both, a worker's added memory after
    its start for a Qwen-size tokenizer (151k vocabulary) is 52 MiB with `text` (141 without), 72 MiB with
    `special` or `extra` (211 without)."""
    import ctypes
    import ctypes.util

    try:
        ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _encode(texts: list[str]):
    """-> (flat tokens, lengths int64 [docs], max id, documents that tokenize to nothing, which are dropped)."""
    eos = _WORKER["eos"]
    if _WORKER["cuttable"] and any(len(t) > long_documents.PIECE_CHARS for t in texts):
        # memory bounded by a piece, not the document
        docs = long_documents.encode(_WORKER["tok"], texts, np.int64, _WORKER["cuttable"])
        lengths = np.fromiter((len(x) + (eos is not None and len(x) > 0) for x in docs), np.int64, len(docs))
        parts = [part for x in docs if len(x) for part in ((x, [eos]) if eos is not None else (x,))]
        flat = np.concatenate(parts) if parts else np.zeros(0, np.int64)  # (int64: `parts` are)
    else:
        ids = _WORKER["tok"].encode_batch(texts)
        if eos is not None:
            ids = [x + [eos] if x else x for x in ids]
        lengths = np.fromiter(map(len, ids), np.int64, len(ids))
        flat = np.fromiter(itertools.chain.from_iterable(ids), np.int64, int(lengths.sum()))
    max_id = int(flat.max()) if flat.size else -1
    return flat.astype(_WORKER["dtype"]), lengths[lengths > 0], max_id, int((lengths == 0).sum())


class FileDone:
    """Marks the end of input file k in the result stream, with the reader's counters at that point."""

    def __init__(self, k: int, counters: dict):
        self.k, self.counters = k, counters

    def get(self):
        return self


def work(reader: DocumentReader, files: list, start: int):
    for k in range(start, len(files)):
        if reader.exhausted:
            return
        yield from batches(reader.read(files[k]))
        yield FileDone(k, reader.counters())


def _prefetched(items, depth: int = 4):
    """`items` produced by a thread: reading and JSON parsing overlap `encode_batch`, which releases the GIL."""
    q: queue.Queue = queue.Queue(depth)
    stop, end = threading.Event(), object()

    def produce():
        try:
            for x in items:
                while not stop.is_set():
                    try:
                        q.put(x, timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
        except BaseException as e:  # noqa: BLE001 - handed to the consumer, which raises it
            q.put(_Raised(e))
            return
        q.put(end)

    threading.Thread(target=produce, daemon=True, name="preprocess-reader").start()
    try:
        while (x := q.get()) is not end:
            if isinstance(x, _Raised):
                raise x.error
            yield x
    finally:
        stop.set()


class _Raised:
    def __init__(self, error: BaseException):
        self.error = error


def results(job, work, dtype, eos, tok, cuttable):
    """Yield encoded batches (and file markers) of `job` (`preprocess.Job`: its workers, tokenizer and special-token
    mode) in input order, keeping at most a few batches in flight."""
    if job.workers <= 1:
        _WORKER.update(tok=tok, cuttable=cuttable, dtype=dtype, eos=eos)
        for item in _prefetched(work):
            yield item if isinstance(item, FileDone) else _encode(item)
        return
    import multiprocessing as mp

    with mp.get_context("fork").Pool(job.workers, _init_worker,
                                       (job.tokenizer, job.special_tokens_in_text, dtype.str, eos)) as pool:
        window = collections.deque()
        for item in work:
            window.append(item if isinstance(item, FileDone) else pool.apply_async(_encode, (item,)))
            if len(window) >= 2 * job.workers + 2:
                yield window.popleft().get()
        while window:
            yield window.popleft().get()
