"""Training samples from a token file: `packed` (PaddleNLP/Megatron GPT semantics) and
`padded` (one document per sample, the seed tutorial).

Unlike PaddleNLP, sample i is a pure function of (corpus, split, seq_len, seed, i):
the number of samples never enters the index, so changing max_steps, batch size or world
size (or resuming) never reorders data. Epoch e = i // N1 has its own document and sample
permutations drawn from (seed, e, split); epochs are built lazily, so i is unbounded.

Document masking (`attention_mask_type: document`): a packed sample also carries where each of its
tokens' document begins (`doc_start`) and, unless positions keep running, RoPE positions that restart
there (`position_ids`); both come from the document index the sample was cut from (a "document" is one
sequence of the `.idx`, what `preprocess` writes per input document), so no EOS token is needed.

Which documents each split holds, and the `split` that fixes one too small, are `data.splits`'s.
"""
from __future__ import annotations

import hashlib
import os
import zlib
from pathlib import Path

import numpy as np

from pretrain_cli import atomic
from pretrain_cli.data.indexed import IndexedDataset
from pretrain_cli.errors import UserError
from pretrain_cli.ops.loss import IGNORE_INDEX

_EPOCHS_IN_MEMORY = 2


def document_fields(starts, seq_len: int, reset_position_ids: bool = True) -> dict:
    """Per-token document info for the `seq_len` inputs of a sample whose documents begin at `starts`.

    `starts`: sorted offsets within the sample of the documents it holds (the first is 0, where the
    sample's first, possibly cut, document begins). Returns int64 `[seq_len]` arrays: `doc_start` (the
    first position of each token's document: attention sees keys doc_start[i] … i) and, with
    `reset_position_ids`, `position_ids` = i − doc_start[i] (Megatron's reset_position_ids: a cut document
    at the start of the sample counts from 0, as it would if it were the whole document).
    """
    starts = np.asarray(starts, dtype=np.int64)
    starts = starts[starts < seq_len]
    pos = np.arange(seq_len, dtype=np.int64)
    doc_start = starts[np.searchsorted(starts, pos, side="right") - 1]  # [seq_len]
    out = {"doc_start": doc_start}
    if reset_position_ids:
        out["position_ids"] = pos - doc_start  # [seq_len]
    return out


def _rng(seed: int, epoch: int, name: str) -> np.random.Generator:
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, epoch, zlib.crc32(name.encode())])))


def _source_stamp(src: IndexedDataset) -> str:
    """Cheap content stamp for the disk cache: file sizes and mtimes of the index pair."""
    parts = []
    for ext in (".idx", ".bin", "_idx.npz", "_ids.npy"):
        p = src.prefix + ext
        if os.path.exists(p):
            st = os.stat(p)
            parts.append(f"{ext}:{st.st_size}:{st.st_mtime_ns}")
    return "|".join(parts)


class _SplitBase:
    """Documents [lo, hi) of one source, with lazily built, cached per-epoch permutations."""

    mode = "?"

    def __init__(self, source: IndexedDataset, lo: int, hi: int, seq_len: int, seed: int, name: str,
                 cache_dir: str | None = None):
        if seq_len < 1:
            raise UserError(f"max_seq_length: {seq_len} must be >= 1")
        if seed < 0:
            raise UserError(f"seed: {seed} must be >= 0")
        self.source, self.lo, self.hi = source, lo, hi
        self.seq_len, self.seed, self.name = seq_len, seed, name
        self.doc_sizes = np.asarray(source.sizes[lo:hi], dtype=np.int64)
        itemsize = source.dtype.itemsize
        self.doc_starts = np.asarray(source.pointers[lo:hi], dtype=np.int64) // itemsize
        self.num_docs = hi - lo
        self.num_tokens = int(self.doc_sizes.sum())
        self.cache_dir = cache_dir
        self._epochs: dict[int, tuple] = {}

    def __len__(self) -> int:
        """Samples per epoch; indices beyond it are valid and fall in later epochs."""
        return self.samples_per_epoch

    def epochs_for(self, num_samples: int) -> float:
        return num_samples / self.samples_per_epoch

    def epochs_begun(self, first: int, count: int) -> list[tuple[str, int]]:
        """(source name, epoch) of each epoch whose first sample is among samples [first, first + count): where a
        reader of those samples wraps around to the start of the split, its documents in a new order."""
        n = self.samples_per_epoch
        name = os.path.basename(self.source.prefix) or self.source.prefix
        return [(name, e) for e in range(-(-first // n), (first + count - 1) // n + 1)]

    def _build_epoch(self, epoch: int) -> tuple:
        raise NotImplementedError

    def _epoch(self, epoch: int) -> tuple:
        hit = self._epochs.get(epoch)
        if hit is None:
            hit = self._load_or_build(epoch)
            if len(self._epochs) >= _EPOCHS_IN_MEMORY:
                self._epochs.pop(next(iter(self._epochs)))
            self._epochs[epoch] = hit
        return hit

    def _load_or_build(self, epoch: int) -> tuple:
        if not self.cache_dir:
            return self._build_epoch(epoch)
        key = hashlib.sha1(
            f"{self.mode}|{_source_stamp(self.source)}|{self.lo}:{self.hi}|{self.seq_len}|{self.seed}|{self.name}|"
            f"{epoch}".encode()
        ).hexdigest()[:20]
        d = Path(self.cache_dir)
        files = [d / f"{key}_{k}.npy" for k in range(3)]
        if all(f.exists() for f in files):
            try:
                return tuple(np.load(f, mmap_mode="r") for f in files)
            except (OSError, ValueError):
                pass  # a damaged cache entry is rebuilt below
        arrays = self._build_epoch(epoch)
        try:
            d.mkdir(parents=True, exist_ok=True)
            for f, a in zip(files, arrays):
                with atomic.publishing(f) as fh:  # concurrent ranks write identical content
                    np.save(fh, a)
        except OSError:
            pass  # a read-only cache directory only costs a rebuild
        return arrays


class PackedDataset(_SplitBase):
    """Shuffled documents concatenated per epoch; sample j spans tokens [j*L, j*L + L + 1).

    `document_mask`: each sample also carries `document_fields` (doc_start, and position_ids when
    `reset_position_ids`); the token order is the same either way.
    """

    mode = "packed"

    def __init__(self, *args, document_mask: bool = False, reset_position_ids: bool = True, **kw):
        super().__init__(*args, **kw)
        self.document_mask, self.reset_position_ids = document_mask, reset_position_ids
        self.samples_per_epoch = max(0, (self.num_tokens - 1) // self.seq_len)
        if self.samples_per_epoch == 0:
            raise UserError(f"{self.source.prefix}: the {self.name} split has {self.num_tokens} tokens, fewer than one "
                            f"sample of max_seq_length+1 = {self.seq_len + 1}; use more data or a shorter "
                            "max_seq_length")

    def _build_epoch(self, epoch: int) -> tuple:
        rng = _rng(self.seed, epoch, self.name)
        order = rng.permutation(self.num_docs).astype(np.int64)
        cum = np.zeros(self.num_docs + 1, np.int64)
        np.cumsum(self.doc_sizes[order], out=cum[1:])  # [docs+1] token offset of each doc in the epoch stream
        positions = rng.permutation(self.samples_per_epoch).astype(np.int64)
        return order, cum, positions

    def _spans(self, i: int) -> list[tuple[int, int]]:
        """(first token in the source, length) of each document piece sample i covers, L+1 tokens in all."""
        if i < 0:
            raise IndexError(i)
        order, cum, positions = self._epoch(i // self.samples_per_epoch)
        start = int(positions[i % self.samples_per_epoch]) * self.seq_len
        k = int(np.searchsorted(cum, start, side="right")) - 1
        off, need, out = start - int(cum[k]), self.seq_len + 1, []
        while need:
            d = int(order[k])
            take = min(int(self.doc_sizes[d]) - off, need)
            if take > 0:
                out.append((int(self.doc_starts[d]) + off, take))
                need -= take
            k, off = k + 1, 0
        return out

    def _gather(self, i: int, array, spans=None) -> np.ndarray:
        """The L+1 elements of `array` (the token stream, or its loss mask) that sample i covers."""
        return np.concatenate([array[s : s + n] for s, n in (spans or self._spans(i))])

    def tokens(self, i: int) -> np.ndarray:
        """The L+1 tokens of sample i as int64 (consecutive positions share one token)."""
        return self._gather(i, self.source.data).astype(np.int64)

    def __getitem__(self, i: int) -> dict:
        spans = self._spans(int(i))
        t = self._gather(int(i), self.source.data, spans).astype(np.int64)
        labels = t[1:].copy()
        if self.source.loss_mask is not None:  # `.lsm`: a 0 byte keeps that token out of the loss as a target
            labels[self._gather(int(i), self.source.loss_mask, spans)[1:] == 0] = IGNORE_INDEX
        item = {"input_ids": t[:-1], "labels": labels}
        if self.document_mask:
            starts = np.cumsum([0] + [n for _, n in spans[:-1]])  # where each piece begins in the sample
            item.update(document_fields(starts, self.seq_len, self.reset_position_ids))
        return item


class PaddedDataset(_SplitBase):
    """One document per sample: [BOS] + doc + [EOS], clipped/padded to L+1; pad targets are -100."""

    mode = "padded"

    def __init__(self, *args, bos: int, eos: int, pad: int, **kw):
        super().__init__(*args, **kw)
        self.bos, self.eos, self.pad = bos, eos, pad
        self.samples_per_epoch = self.num_docs
        if self.num_docs == 0:
            raise UserError(f"{self.source.prefix}: the {self.name} split has no documents; use more data")

    def _build_epoch(self, epoch: int) -> tuple:
        order = _rng(self.seed, epoch, self.name).permutation(self.num_docs).astype(np.int64)
        return order, np.zeros(0, np.int64), np.zeros(0, np.int64)

    def __getitem__(self, i: int) -> dict:
        i = int(i)
        if i < 0:
            raise IndexError(i)
        order = self._epoch(i // self.samples_per_epoch)[0]
        d = int(order[i % self.samples_per_epoch])
        L = self.seq_len
        s, n = int(self.doc_starts[d]), int(self.doc_sizes[d])
        doc = np.asarray(self.source.data[s : s + min(n, L + 1)], dtype=np.int64)
        if n <= L + 1 and doc.size and doc[-1] == self.eos:
            doc = doc[:-1]  # preprocessed with --append_eos: do not add a second EOS
        seq = np.full(L + 1, self.pad, np.int64)
        real = np.concatenate(([self.bos], doc, [self.eos]))[: L + 1]
        seq[: real.size] = real
        labels = seq[1:].copy()
        labels[real.size - 1 :] = IGNORE_INDEX  # targets past the real tokens are padding
        if self.source.loss_mask is not None:  # `.lsm`: a 0 byte keeps that document token out of the loss
            keep = np.asarray(self.source.loss_mask[s : s + doc.size]) != 0  # doc token t is label t (after BOS)
            labels[: doc.size][~keep[: min(doc.size, L)]] = IGNORE_INDEX
        return {"input_ids": seq[:-1], "labels": labels}


def special_ids(tokenizer, tokenizer_name: str) -> dict:
    """bos/eos/pad ids for padded mode, or a UserError naming the missing role."""
    if tokenizer is None:
        raise UserError("sample_mode: 'padded' needs a tokenizer (bos/eos/pad ids); set tokenizer_name_or_path")
    ids = {"bos": tokenizer.bos_token_id, "eos": tokenizer.eos_token_id, "pad": tokenizer.pad_token_id}
    for role, v in ids.items():
        if v is None:
            raise UserError(f"{tokenizer_name}: tokenizer has no {role} token (needed by sample_mode 'padded'); "
                            f"set {role}_token in tokenizer_config.json or use sample_mode 'packed'")
    return ids
