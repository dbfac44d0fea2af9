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
"""
from __future__ import annotations

import hashlib
import os
import re
import zlib
from pathlib import Path

import numpy as np

from pretrain_cli import atomic
from pretrain_cli.counts import count
from pretrain_cli.data.blend import short_sources
from pretrain_cli.data.indexed import IndexedDataset
from pretrain_cli.errors import UserError
from pretrain_cli.ops.loss import IGNORE_INDEX

SPLIT_NAMES = ("train", "valid", "test")
PHASE_OF = {"train": "do_train", "valid": "do_eval", "test": "do_predict"}
_EPOCHS_IN_MEMORY = 2


def parse_split(split: str) -> list[float]:
    """'949,50,1' or '949/50/1' -> three fractions summing to 1 (missing parts are 0)."""
    parts = [p for p in re.split(r"[,/]", str(split).strip()) if p.strip()]
    try:
        vals = [float(p) for p in parts]
    except ValueError:
        raise UserError(f"split: {split!r} is not numbers separated by ',' or '/'; use e.g. \"949,50,1\"") from None
    if not vals or len(vals) > 3 or any(v < 0 for v in vals) or sum(vals) <= 0:
        raise UserError(f"split: {split!r} needs 1-3 non-negative shares with a positive sum; use e.g. \"949,50,1\"")
    vals += [0.0] * (3 - len(vals))
    return [v / sum(vals) for v in vals]


def split_bounds(fractions, size: int) -> list[int]:
    """PaddleNLP's boundaries: b[i+1] = b[i] + round(f_i*size), excess taken off every later boundary."""
    b = [0]
    for f in fractions:
        b.append(b[-1] + int(round(f * float(size))))
    diff = b[-1] - size
    return [b[0]] + [min(max(x - diff, 0), size) for x in b[1:]]


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


def split_datasets(source: IndexedDataset, fractions, seq_len: int, seed: int, mode: str = "packed",
                   need=SPLIT_NAMES, special: dict | None = None, cache_dir: str | None = None,
                   document_mask: bool = False, reset_position_ids: bool = True, split_text: str = "",
                   blend: list | None = None) -> dict:
    """name -> dataset (None when the split is empty and not needed); `document_mask` applies to packed
    samples only (a padded sample holds one document). `fractions`: `parse_split`'s (`RunConfig.data.split`),
    `split_text` as the user wrote it (for messages). `need`: the splits the run uses, or {name: samples the run
    reads from it}, what a `split` named to fix a split too small aims at (`_split_for`). `blend`: every source of
    the run (input_dir's, `source` among them) with its weight, which that one `split` must fix at once."""
    if mode not in ("packed", "padded"):
        raise UserError(f"sample_mode: unknown {mode!r}; use 'packed' or 'padded'")
    b = split_bounds(fractions, len(source))
    split = split_text or ",".join(f"{f:g}" for f in fractions)
    out = {}
    for k, name in enumerate(SPLIT_NAMES):
        lo, hi = b[k], b[k + 1]
        if hi <= lo:
            if name in need:
                better = _split_for(blend or [(1.0, source)], fractions, seq_len, mode, need) if k else None
                fix = (f"set split: {better}" if better else f"give {name} a non-zero share (e.g. \"949,50,1\")"
                       if fractions[k] == 0 else "its share rounds to 0 documents: raise it or use more documents")
                raise UserError(f"split: {split!r} leaves the {name} split empty (0 of {len(source)} documents in "
                                f"{source.prefix}) but {PHASE_OF[name]} needs it; {fix}, or turn off {PHASE_OF[name]}")
            out[name] = None
            continue
        args = (source, lo, hi, seq_len, seed, name)
        try:
            if mode == "packed":
                out[name] = PackedDataset(*args, cache_dir=cache_dir, document_mask=document_mask,
                                          reset_position_ids=reset_position_ids)
            else:
                out[name] = PaddedDataset(*args, cache_dir=cache_dir, **special)
        except UserError as e:
            if name not in need:
                out[name] = None  # too small to use, but nobody asked for it
                continue
            better = _split_for(blend or [(1.0, source)], fractions, seq_len, mode, need) if k else None
            if better is None:
                raise
            raise UserError(f"{e}, or set split: {better}") from None
    return out


def _split_for(blend: list, fractions, seq_len: int, mode: str, need) -> str | None:
    """`"split"` and what it gives each evaluation split the run needs, or None if no split does: shares taken from
    train's, in thousandths, until every needed split at once (valid and test) holds, in every source of the run
    (`blend`: its (weight, source) pairs), the samples the run reads from it (`need`'s counts, each source's share
    by its weight: `blend.short_sources`, the judge the run's note asks too), the evaluation splits together keeping
    within a tenth of the data (or the share the user gave them), else one sample each, train keeping one in every
    source. A user who sees a split too small for one sample is shown the `split` value that fixes it, not only more
    data or shorter samples, and not one that fixes that split (or that source) only for the next check to stop at
    the other."""
    parts = [int(round(f * 1000)) for f in fractions]
    total = sum(parts)
    weights, sources = [w for w, _ in blend], [src for _, src in blend]
    cums = [np.concatenate(([0], np.cumsum(np.asarray(src.sizes, dtype=np.int64)))) for src in sources]  # [n+1] each
    wanted = [k for k in (1, 2) if SPLIT_NAMES[k] in need]
    reads = {k: max(1, int(need[SPLIT_NAMES[k]] or 1)) for k in wanted} if isinstance(need, dict) else {}

    def samples(trial, k: int) -> list[int]:
        """The samples split k holds in each source under shares `trial`."""
        held = []
        for src, cum in zip(sources, cums):
            b = split_bounds([t / total for t in trial], len(src))
            # packed: n samples of seq_len take n * seq_len + 1 tokens; padded: one document a sample
            held.append(max(0, int(cum[b[k + 1]] - cum[b[k]] - 1) // seq_len) if mode == "packed" else b[k + 1] - b[k])
        return held

    def short_of(held: list[int], k: int, target) -> bool:
        return min(held) < 1 or (target is not None and bool(short_sources(held, weights, target[k])))

    tiers = [(reads, max(total // 10, total - parts[0]))] if any(v > 1 for v in reads.values()) else []
    for target, cap in (*tiers, (None, total)):
        trial = list(parts)
        while True:
            short = [k for k in wanted if short_of(samples(trial, k), k, target)]
            if not short:
                break
            if trial[0] <= len(short) or total - trial[0] + len(short) > cap:
                trial = None
                break
            for k in short:
                trial[0], trial[k] = trial[0] - 1, trial[k] + 1
        if trial is None or trial == parts or ("train" in need and min(samples(trial, 0)) < 1):
            continue
        got = {k: samples(trial, k) for k in wanted}
        whose, least = ("this source's", "") if len(sources) == 1 else ("every source's", "at least ")
        held = [f"{SPLIT_NAMES[k]} split {least}{count(min(got[k]), 'sample', True)}" for k in wanted]
        said = f"{whose} {' and its '.join(held)}".replace(" split ", " split would then hold ", 1)
        short = [f"{reads[k]:,} {SPLIT_NAMES[k]}" for k in wanted if k in reads and short_of(got[k], k, reads)]
        if short:
            said += f"; the run reads {' and '.join(short)} samples, so evaluation repeats them"
        elif reads:
            said += (f", the samples the run reads from {'each' if len(wanted) > 1 else 'it'}" if len(sources) == 1
                     else ", each source's share by its weight of the samples the run reads")
        return f"\"{','.join(map(str, trial))}\" ({said})"
    return None
