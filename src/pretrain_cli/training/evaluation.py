"""Loss and perplexity over fixed batches: the one evaluation loop.

The trainer's periodic evaluation, `pretrain-cli eval --config` (a run's own valid/test batches) and
`pretrain-cli eval --data` (consecutive windows of a token file) all feed batches to `loss_sum` and
report `perplexity(loss)`, so the three numbers mean the same thing. The loss is the mean over
every counted token (not a mean of per-batch means, which would overweight a short last batch).
"""
from __future__ import annotations

import contextlib
import math

import numpy as np

PPL_CAP_LOSS = 700.0  # exp(700) is near float64's limit: larger losses report exp(700), never inf


def perplexity(loss: float) -> float:
    return math.exp(min(loss, PPL_CAP_LOSS))


def line_values(prefix: str, loss: float, tokens: float, runtime: float, batches: int, samples: int, step: int,
                max_steps: int) -> dict:
    """An evaluation's log line and record (`prefix` eval or test): PaddleNLP's evaluation keys first, in its order
    (`loss`, `runtime`, `samples_per_second`, `steps_per_second` of its `speed_metrics`: `batches` of the global
    `samples`, each data rank's slice of every batch one step), then the eval line's `progress_or_epoch`, which its
    `log` adds (its predict logs no line: the test keys have none; nor has an evaluation-only run without a
    max_steps); then ours."""
    from pretrain_cli.training.closing import progress_or_epoch

    values = {f"{prefix}_loss": loss, f"{prefix}_runtime": round(runtime, 4),
              f"{prefix}_samples_per_second": round(samples / runtime, 4),
              f"{prefix}_steps_per_second": round(batches / runtime, 4)}
    if prefix == "eval" and max_steps > 0:
        values["progress_or_epoch"] = progress_or_epoch(step, max_steps)
    return {**values, f"{prefix}_ppl": round(perplexity(loss), 4), f"{prefix}_tokens": int(tokens),
            "global_step": step}


def model_inputs(batch: dict, shard=None) -> tuple:
    """(input_ids, {name: tensor} of the packed-document fields the batch carries, labels) as tensors for
    `model(ids, **kw)`; a causal batch carries no fields, so the call is the plain `model(ids)`. `shard` (a
    distributed strategy's `shard_batch`) declares each one this rank's piece of the global batch. Made by
    `ops.tensors.from_numpy`: `paddle.to_tensor` leaks host memory at every call, so at every micro-batch."""
    from pretrain_cli.data.loader import DOCUMENT_FIELDS
    from pretrain_cli.ops.tensors import from_numpy

    shard = shard or (lambda tensor: tensor)
    extra = {k: shard(from_numpy(batch[k])) for k in DOCUMENT_FIELDS if k in batch}  # int64 [b, seq_len] each
    return shard(from_numpy(batch["input_ids"])), extra, shard(from_numpy(batch["labels"]))


def loss_sum(model, batches, autocast=None, progress=None, shard=None, to_host=None) -> tuple[float, float, int]:
    """(sum of token losses, counted tokens, samples) over `batches` of {input_ids, labels} (int64 numpy),
    plus doc_start/position_ids when the run masks documents.

    `shard`/`to_host` (a distributed strategy's) declare each batch a piece of a global batch and read the
    global sums back; without them the sums are this process's own."""
    import paddle

    model.eval()
    total, count, samples = 0.0, 0.0, 0
    with paddle.no_grad():
        for batch in batches:
            ids, extra, labels = model_inputs(batch, shard)
            with autocast() if autocast else contextlib.nullcontext():  # the training step's loss path
                s, c = model(ids, labels=labels, **extra)
            if to_host is not None:
                s, c = to_host(s), to_host(c)
            total, count, samples = total + float(s), count + float(c), samples + int(ids.shape[0])
            if progress is not None:
                progress.update(1)
    return total, count, samples


def split_batches(dataset, batch_size: int, batches: int, data_rank: int = 0, data_world: int = 1):
    """This rank's slice of the first `batches` global eval batches: the same batches every time."""
    from pretrain_cli.data.loader import micro_batch

    for k in range(batches):
        yield micro_batch(dataset, k * batch_size * data_world, batch_size, data_rank, data_world)


def read_tokens(prefix: str) -> tuple[np.ndarray, np.ndarray | None]:
    """(the whole token stream, its `.lsm` loss mask or None) as flat memmap views (nothing loaded up front)."""
    from pretrain_cli.data.indexed import open_token_file

    ds = open_token_file(prefix)
    return ds.tokens(0, ds.num_tokens), ds.loss_mask


def document_starts(prefix: str) -> np.ndarray:
    """Token offset in the stream where each document (sequence of the `.idx`) begins, sorted, int64."""
    from pretrain_cli.data.indexed import open_token_file

    ds = open_token_file(prefix)
    return np.asarray(ds.pointers, dtype=np.int64) // ds.dtype.itemsize


def _window_documents(doc_starts: np.ndarray, first: int, seq_len: int, reset_position_ids: bool) -> dict:
    """`document_fields` of the window whose inputs are stream tokens first … first + seq_len − 1."""
    from pretrain_cli.data.samples import document_fields

    lo, hi = np.searchsorted(doc_starts, [first + 1, first + seq_len])
    return document_fields(np.concatenate(([0], doc_starts[lo:hi] - first)), seq_len, reset_position_ids)


def window_count(n_tokens: int, seq_len: int, batch_size: int, max_batches: int | None = None) -> tuple[int, int]:
    """(windows, batches) that `window_batches` yields."""
    n_windows = max(0, (n_tokens - 1) // seq_len)
    n_batches = math.ceil(n_windows / batch_size)
    if max_batches is not None:
        n_batches = min(n_batches, max_batches)
        n_windows = min(n_windows, n_batches * batch_size)
    return n_windows, n_batches


def window_batches(tokens: np.ndarray, seq_len: int, batch_size: int, max_batches: int | None = None,
                   loss_mask: np.ndarray | None = None, doc_starts: np.ndarray | None = None,
                   reset_position_ids: bool = True):
    """Consecutive, unshuffled windows: window k holds tokens k·L … k·L+L (neighbours share one boundary
    token), so every token after the first is predicted exactly once (unless `loss_mask` is 0 there).
    `doc_starts` (`document_starts`): document masking, each window carrying doc_start (and position_ids)."""
    from pretrain_cli.ops.loss import IGNORE_INDEX

    n_windows, n_batches = window_count(len(tokens), seq_len, batch_size, max_batches)
    for b in range(n_batches):
        first, last = b * batch_size, min(b * batch_size + batch_size, n_windows)
        window = np.stack([np.asarray(tokens[k * seq_len: k * seq_len + seq_len + 1], dtype=np.int64)
                           for k in range(first, last)])  # [b, seq_len+1]
        labels = window[:, 1:].copy()
        if loss_mask is not None:
            mask = np.stack([np.asarray(loss_mask[k * seq_len + 1: k * seq_len + seq_len + 1])
                             for k in range(first, last)])  # [b, seq_len]
            labels[mask == 0] = IGNORE_INDEX
        batch = {"input_ids": window[:, :-1], "labels": labels}
        if doc_starts is not None:
            fields = [_window_documents(doc_starts, k * seq_len, seq_len, reset_position_ids)
                      for k in range(first, last)]
            batch.update({key: np.stack([f[key] for f in fields]) for key in fields[0]})  # [b, seq_len] each
        yield batch
