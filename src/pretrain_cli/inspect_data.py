"""`pretrain-cli inspect-data`: validate and summarise a token file pair, decode a document,
or show exactly which samples (and batch hashes) training sees at a given step.

Opening the pair runs every structural check (magic, version, dtype, sizes vs file
length, pointer monotonicity), so "it opens" already means "it is well-formed".
"""
from __future__ import annotations

import argparse
import json

import numpy as np

from pretrain_cli.errors import UserError

_CHUNK = 1 << 20


def summarize(ds, tokenizer=None) -> dict:
    """Counts, document length statistics and a log2 length histogram."""
    doc_idx = np.asarray(ds.doc_idx, dtype=np.int64)
    sizes = np.asarray(ds.sizes, dtype=np.int64)
    seq_start = np.concatenate(([0], np.cumsum(sizes)))  # [N+1] element offset of each sequence
    doc_len = seq_start[doc_idx[1:]] - seq_start[doc_idx[:-1]]  # [documents] tokens per document
    hist: dict[str, int] = {}
    if doc_len.size:
        buckets = np.floor(np.log2(np.maximum(doc_len, 1))).astype(np.int64)
        for b, c in zip(*np.unique(buckets, return_counts=True)):
            hist[f"{2 ** int(b)}-{2 ** (int(b) + 1) - 1}"] = int(c)
    out = {
        "prefix": ds.prefix, "format": ds.format, "dtype": ds.dtype.name,
        "documents": ds.num_documents, "sequences": len(ds), "tokens": ds.num_tokens,
        "max_token_id": ds.max_token_id(),
        "doc_length": {"min": int(doc_len.min()), "mean": float(doc_len.mean()), "max": int(doc_len.max())},
        "length_histogram": hist, "loss_mask": ds.loss_mask is not None,
    }
    if tokenizer is not None:
        out["vocab_size"] = tokenizer.vocab_size
        eos = tokenizer.eos_token_id
        if eos is not None:
            nonempty = doc_len > 0
            last = seq_start[doc_idx[1:]][nonempty] - 1  # element index of each document's last token
            ends = sum(int((np.asarray(ds.data[last[s : s + _CHUNK]]) == eos).sum()) for s in range(0, last.size, _CHUNK))
            out["eos_rate"] = ends / max(1, int(nonempty.sum()))
    return out


def check_vocab(ds, tokenizer, tokenizer_dir: str) -> None:
    max_id = ds.max_token_id()
    if max_id >= tokenizer.vocab_size:
        raise UserError(f"{ds.prefix}.bin: max token id {max_id} >= vocab size {tokenizer.vocab_size} of {tokenizer_dir}; "
                        "the file was made with another tokenizer: re-run preprocess with this one")


def describe_step(dataset, step: int, micro_bs: int, acc: int, dp_size: int, tokenizer=None,
                  decode_chars: int = 120) -> list[str]:
    """Samples and hashes of optimizer step `step` (1-based, as logged): step k consumes global
    samples [(k-1)*B, k*B), B = micro_bs*dp_size*acc; micro-step m on rank r takes its slice."""
    from pretrain_cli.data.loader import batch_hash, micro_batch

    if step < 1:
        raise UserError(f"--step: {step} must be >= 1 (steps are counted from 1, as in the training log)")
    g = micro_bs * dp_size
    first = (step - 1) * g * acc
    lines = [f"step {step}: global samples [{first}, {first + g * acc}) (micro_bs {micro_bs} x dp {dp_size} x acc {acc})"]
    for m in range(acc):
        consumed = first + m * g
        whole = micro_batch(dataset, consumed, g, 0, 1)
        lines.append(f"  micro-step {m}: samples [{consumed}, {consumed + g}) global hash {batch_hash(whole)}")
        for r in range(dp_size):
            part = micro_batch(dataset, consumed, micro_bs, r, dp_size)
            lines.append(f"    rank {r}: samples [{consumed + r * micro_bs}, {consumed + (r + 1) * micro_bs}) "
                         f"hash {batch_hash(part)}")
            if tokenizer is not None:
                text = tokenizer.decode(part["input_ids"][0])[:decode_chars]
                lines.append(f"      first sample: {text!r}")
    return lines


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("prefix", nargs="?", help="token file prefix (PREFIX.bin/.idx; .bin/.idx suffix accepted)")
    parser.add_argument("--tokenizer", help="tokenizer directory: checks ids against its vocab, enables --decode")
    parser.add_argument("--decode", type=int, metavar="N", help="print document N as text")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--step", type=int, help="show the samples and batch hashes of optimizer step K")
    parser.add_argument("--config", help="training config (JSON): data keys and batch sizes for --step")
    parser.add_argument("--max_seq_length", type=int, default=1024)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--split", default="949,50,1")
    parser.add_argument("--sample_mode", default="packed", choices=("packed", "padded"))
    parser.add_argument("--batch_size", type=int, default=8, help="per-device micro-batch")
    parser.add_argument("--gradient_accumulation_steps", type=int, default=1)
    parser.add_argument("--dp_size", type=int, default=1, help="data-parallel ranks (dp x sharding)")


def _step_settings(ns) -> dict:
    """Data and batch settings for --step: from --config when given, else from the flags."""
    keys = dict(input_dir=ns.prefix, split=ns.split, max_seq_length=ns.max_seq_length, seed=ns.seed,
                sample_mode=ns.sample_mode, micro_bs=ns.batch_size, acc=ns.gradient_accumulation_steps)
    if ns.config:
        from pretrain_cli.arg_parser import parse_config

        args = parse_config(ns.config, [])
        d, t = args.data, args.training
        keys.update(split=d.split, max_seq_length=d.max_seq_length, seed=t.seed, sample_mode=d.sample_mode,
                    micro_bs=t.per_device_train_batch_size, acc=t.gradient_accumulation_steps)
        keys["input_dir"] = ns.prefix or d.input_dir
    if not keys["input_dir"]:
        raise UserError("inspect-data: no data; pass a PREFIX or a --config with input_dir")
    return keys


def main(ns: argparse.Namespace) -> int:
    tok = None
    if ns.tokenizer:
        from pretrain_cli.tokenizer import load_tokenizer

        tok = load_tokenizer(ns.tokenizer)
    if ns.step is not None:
        from pretrain_cli.data import build_datasets

        k = _step_settings(ns)
        splits = build_datasets(k["input_dir"], k["split"], k["max_seq_length"], k["seed"], k["sample_mode"],
                                tokenizer=tok, need=("train",), vocab_size=tok.vocab_size if tok else None)
        for line in splits.describe():
            print(line)
        for line in describe_step(splits.train, ns.step, k["micro_bs"], k["acc"], ns.dp_size, tok):
            print(line)
        return 0
    if not ns.prefix:
        raise UserError("inspect-data: PREFIX is required (the token files' path without .bin/.idx)")
    from pretrain_cli.data.indexed import open_token_file

    ds = open_token_file(ns.prefix)
    if tok is not None:
        check_vocab(ds, tok, ns.tokenizer)
    if ns.decode is not None:
        if tok is None:
            raise UserError("--decode: needs --tokenizer DIR to turn ids back into text")
        if not 0 <= ns.decode < ds.num_documents:
            raise UserError(f"--decode: document {ns.decode} out of range; {ds.prefix} has {ds.num_documents} documents")
        a, b = int(ds.doc_idx[ns.decode]), int(ds.doc_idx[ns.decode + 1])
        ids = np.concatenate([ds.get(i) for i in range(a, b)]) if b > a else np.zeros(0, np.int64)
        print(tok.decode(ids))
        return 0
    info = summarize(ds, tok)
    if ns.json:
        print(json.dumps(info, sort_keys=True))
        return 0
    dl = info["doc_length"]
    print(f"{info['prefix']}: OK ({info['format']}, {info['dtype']})")
    print(f"documents {info['documents']}  sequences {info['sequences']}  tokens {info['tokens']}  "
          f"max token id {info['max_token_id']}" + (f" (vocab {info['vocab_size']})" if "vocab_size" in info else ""))
    print(f"document length: min {dl['min']}  mean {dl['mean']:.1f}  max {dl['max']}")
    if "eos_rate" in info:
        print(f"documents ending in EOS: {100 * info['eos_rate']:.1f}%")
    width = max(info["length_histogram"].values(), default=1)
    for bucket, count in info["length_histogram"].items():
        print(f"  {bucket:>15} {count:>9} {'#' * max(1, round(40 * count / width))}")
    return 0
