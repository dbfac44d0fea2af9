"""Preprocess throughput vs raw `tokenizers.encode_batch`, and micro-batch fetch latency.

Corpus: the stdlib's pydoc topics (English prose and code), repeated; nothing is downloaded.
Prints numbers only. Target: preprocess tokens/s >= 0.8 x raw encode_batch on the same text.

    python benchmarks/preprocess_throughput.py [--repeat 20] [--workers 1] [--vocab_size 4096]
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path


def corpus(repeat: int) -> list[str]:
    from pydoc_data.topics import topics

    docs = [t for t in topics.values() if t.strip()]
    return docs * repeat


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--vocab_size", type=int, default=4096)
    ap.add_argument("--seq_len", type=int, default=1024)
    ap.add_argument("--micro_bs", type=int, default=8)
    a = ap.parse_args()

    from pretrain_cli.data import build_datasets, preprocess
    from pretrain_cli.data.loader import micro_batch
    from pretrain_cli.data.tokenizer import DEFAULT_SPECIALS, Tokenizer, _roles_for, load_tokenizer, train_bpe

    docs = corpus(a.repeat)
    mb = sum(len(d.encode()) for d in docs) / 1e6
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        t = time.perf_counter()
        tok = train_bpe(corpus(1), a.vocab_size, DEFAULT_SPECIALS)
        Tokenizer(tok, str(tmp / "tok"), _roles_for(DEFAULT_SPECIALS), "").save(tmp / "tok")
        print(f"corpus: {len(docs)} documents, {mb:.1f} MB; tokenizer trained in {time.perf_counter() - t:.2f}s")
        with open(tmp / "c.jsonl", "w") as f:
            for d in docs:
                f.write(json.dumps({"text": d}) + "\n")

        wrapped = load_tokenizer(tmp / "tok")
        t = time.perf_counter()
        n_raw = sum(len(e.ids) for e in wrapped._tok.encode_batch(docs, add_special_tokens=False))
        raw = n_raw / (time.perf_counter() - t)

        p = argparse.ArgumentParser()
        preprocess.add_arguments(p)
        ns = p.parse_args(["--input_path", str(tmp / "c.jsonl"), "--output_prefix", str(tmp / "out" / "c"),
                           "--tokenizer", str(tmp / "tok"), "--workers", str(a.workers), "--log_interval", "0"])
        t = time.perf_counter()
        preprocess.main(ns)
        el = time.perf_counter() - t
        n_pre = json.loads((tmp / "out" / "c.json").read_text())["tokens"]
        pre = n_pre / el
        print(f"raw encode_batch: {raw:,.0f} tokens/s ({n_raw} tokens)")
        print(f"preprocess (workers={a.workers}): {pre:,.0f} tokens/s, {mb / el:.1f} MB/s ({n_pre} tokens)")
        print(f"ratio preprocess/raw: {pre / raw:.2f} (target >= 0.8)")

        ds = build_datasets(str(tmp / "out" / "c"), "1", a.seq_len, 0, need=("train",)).train
        micro_batch(ds, 0, a.micro_bs)  # builds epoch 0's index
        n = 200
        t = time.perf_counter()
        for k in range(n):
            micro_batch(ds, k * a.micro_bs, a.micro_bs)
        us = (time.perf_counter() - t) / n * 1e6
        print(f"micro-batch fetch: {us:.0f} us per [{a.micro_bs}, {a.seq_len}] batch "
              f"({a.micro_bs * a.seq_len / us * 1e6:,.0f} tokens/s); {len(ds)} samples per epoch")
        t = time.perf_counter()
        ds._build_epoch(1)
        print(f"epoch index build: {(time.perf_counter() - t) * 1e3:.1f} ms for {ds.num_docs} documents")


if __name__ == "__main__":
    main()
