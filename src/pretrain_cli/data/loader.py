"""Stateless global-index batching.

Global micro-batch k holds samples [k*G, (k+1)*G), G = micro_bs * dp_size, and data rank r
takes its contiguous micro_bs slice, so the concatenation of all ranks' slices is the same
sample order for any dp_size (PaddleNLP's DistributedBatchSampler layout). The only state
is `consumed_samples`: resuming means constructing the iterator with it, no skipping.
Batches stay numpy int64; the trainer converts (uint16 arrays would become bfloat16 in Paddle).
"""
from __future__ import annotations

import hashlib
import queue
import threading

import numpy as np


# per-token fields a sample may carry beyond input_ids/labels (packed documents; data.samples.document_fields)
DOCUMENT_FIELDS = ("position_ids", "doc_start")


def micro_batch(dataset, consumed_samples: int, micro_bs: int, dp_rank: int = 0, dp_size: int = 1) -> dict:
    """This rank's samples [consumed + r*bs, consumed + (r+1)*bs) stacked to int64 [bs, L] (input_ids, labels,
    and the document fields when the samples carry them)."""
    if not 0 <= dp_rank < dp_size:
        raise ValueError(f"dp_rank {dp_rank} outside [0, {dp_size})")
    first = consumed_samples + dp_rank * micro_bs
    items = [dataset[i] for i in range(first, first + micro_bs)]
    keys = ("input_ids", "labels") + tuple(k for k in DOCUMENT_FIELDS if k in items[0])
    return {key: np.stack([it[key] for it in items]).astype(np.int64, copy=False) for key in keys}


def batch_hash(batch: dict) -> str:
    """Short sha1 of the int64 token ids: log it per step and compare after resume."""
    h = hashlib.sha1()
    for key in ("input_ids", "labels"):
        if key in batch:
            h.update(np.ascontiguousarray(batch[key], dtype=np.int64).tobytes())
    return h.hexdigest()[:12]


class BatchIterator:
    """Infinite iterator of this rank's micro-batches, prefetched by one background thread.

    `consumed_samples` counts global samples *delivered* to the caller (not prefetched),
    so it is the value to checkpoint.
    """

    _STOP = object()

    def __init__(self, dataset, start_consumed: int, micro_bs: int, dp_rank: int = 0, dp_size: int = 1,
                 prefetch: int = 2):
        self.dataset, self.micro_bs, self.dp_rank, self.dp_size = dataset, micro_bs, dp_rank, dp_size
        self.consumed_samples = int(start_consumed)
        self._step = micro_bs * dp_size
        self._queue: queue.Queue = queue.Queue(maxsize=max(1, prefetch))
        self._stop = threading.Event()
        self._thread = None
        if prefetch > 0:
            self._thread = threading.Thread(target=self._work, args=(self.consumed_samples,), daemon=True)
            self._thread.start()

    def _work(self, consumed: int) -> None:
        while not self._stop.is_set():
            try:
                item = micro_batch(self.dataset, consumed, self.micro_bs, self.dp_rank, self.dp_size)
            except BaseException as e:  # surface in the consumer, not in a dead thread
                item = e
            while not self._stop.is_set():
                try:
                    self._queue.put(item, timeout=0.1)
                    break
                except queue.Full:
                    continue
            if isinstance(item, BaseException):
                return
            consumed += self._step

    def __iter__(self):
        return self

    def __next__(self) -> dict:
        if self._thread is None:
            batch = micro_batch(self.dataset, self.consumed_samples, self.micro_bs, self.dp_rank, self.dp_size)
        else:
            batch = self._queue.get()
            if isinstance(batch, BaseException):
                raise batch
        self.consumed_samples += self._step
        return batch

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __del__(self):
        self._stop.set()
