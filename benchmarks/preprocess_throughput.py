"""Preprocess throughput per input format vs the tokenizer's raw `encode_batch`, peak RSS vs input size,
and micro-batch fetch latency.

Corpus: the demo corpus (`scripts/make_demo_corpus.py`: pydoc topics and standard-library docstrings),
repeated to --mb MB and written as plain .jsonl, .jsonl.zst and Parquet; tokenizer: a byte-level BPE with
--vocab_size ids trained on it (the same algorithm and pre-tokenizer as GPT-2's, Qwen's and Llama-3's).
Nothing is downloaded. The raw rate is `Tokenizer.encode_batch` over the same batches preprocess makes,
in the same process and run, measured before and after every preprocess run. The RSS part preprocesses
synthetic .jsonl.zst corpora of each --rss_mb size in a fresh process, which reports its peak RSS (VmHWM).
Prints numbers and ratios only (target: preprocess >= 0.9 x raw; RSS flat in the input size).

    python benchmarks/preprocess_throughput.py [--mb 20] [--workers 1 2] [--vocab_size 32000] \
        [--rss_mb 20 100] [--large]    # --large adds a 2,000 MB RSS run (minutes; the machine is shared)
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def demo_docs(tmp: Path) -> list[str]:
    out = tmp / "demo.jsonl"
    subprocess.run([sys.executable, str(REPO / "scripts" / "make_demo_corpus.py"), str(out)], check=True,
                   stdout=subprocess.DEVNULL)
    return [json.loads(line)["text"] for line in out.read_text(encoding="utf-8").splitlines()]


def write_formats(docs: list[str], tmp: Path) -> dict[str, Path]:
    import pyarrow as pa
    import pyarrow.parquet as pq
    import zstandard

    data = "".join(json.dumps({"text": d}) + "\n" for d in docs).encode()
    (tmp / "c.jsonl").write_bytes(data)
    (tmp / "c.jsonl.zst").write_bytes(zstandard.ZstdCompressor(level=3).compress(data))
    pq.write_table(pa.table({"text": docs}), tmp / "c.parquet", row_group_size=10_000)
    return {"jsonl": tmp / "c.jsonl", "zst": tmp / "c.jsonl.zst", "parquet": tmp / "c.parquet"}


def raw_rate(tok_dir: Path, docs: list[str]) -> tuple[float, int]:
    from pretrain_cli.data.documents import batches
    from pretrain_cli.data.tokenizer import load_tokenizer

    tok = load_tokenizer(tok_dir)
    t, c = time.perf_counter(), cpu_seconds()
    n = sum(len(x) for b in batches(docs) for x in tok.encode_batch(b))
    return n / (time.perf_counter() - t), n, n / (cpu_seconds() - c)


def cpu_seconds() -> float:
    """CPU time of this process (all its threads) and of its reaped children (pool workers)."""
    import resource

    ch = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + ch.ru_utime + ch.ru_stime


def run_preprocess(src: Path, out: Path, tok_dir: Path, workers: int) -> tuple[float, int]:
    from pretrain_cli.cli import main

    argv = ["preprocess", "--input_path", str(src), "--output_prefix", str(out), "--tokenizer", str(tok_dir),
            "--workers", str(workers), "--log_interval", "0"]
    t, c = time.perf_counter(), cpu_seconds()
    with open(os.devnull, "w") as null:
        stdout, sys.stdout = sys.stdout, null
        try:
            assert main(argv) == 0
        finally:
            sys.stdout = stdout
    el, cpu = time.perf_counter() - t, cpu_seconds() - c
    return el, json.loads(out.with_suffix(".json").read_text())["tokens"], cpu


def synthetic(path: Path, docs: list[str], mb: int) -> int:
    """`mb` MB of distinct documents (demo documents with a running number), zstd-streamed to disk."""
    import zstandard

    budget, written, i = mb * 10**6, 0, 0
    with open(path, "wb") as raw, zstandard.ZstdCompressor(level=1).stream_writer(raw) as f:
        while written < budget:
            line = (json.dumps({"text": f"{i}: {docs[i % len(docs)]}"}) + "\n").encode()
            f.write(line)
            written += len(line)
            i += 1
    return written


def peak_rss(src: Path, out: Path, tok_dir: Path, workers: int) -> tuple[float, float]:
    """(peak RSS MB of a fresh `pretrain-cli preprocess` process, seconds). The child reports its own VmHWM:
    wait4's ru_maxrss would include this parent's RSS, which Linux carries into a child across fork + exec."""
    code = ("import sys; from pretrain_cli.cli import main; rc = main(sys.argv[1:]); "
            "print(next(x for x in open('/proc/self/status') if x.startswith('VmHWM')).split()[1]); sys.exit(rc)")
    argv = [sys.executable, "-c", code, "preprocess", "--input_path", str(src), "--output_prefix", str(out),
            "--tokenizer", str(tok_dir), "--workers", str(workers), "--log_interval", "0"]
    t = time.perf_counter()
    p = subprocess.run(argv, stdout=subprocess.PIPE, text=True, check=True)
    return int(p.stdout.split()[-1]) / 1024, time.perf_counter() - t


def fetch_latency(prefix: Path, seq_len: int, micro_bs: int) -> None:
    from pretrain_cli.data import build_datasets
    from pretrain_cli.data.loader import micro_batch

    ds = build_datasets(str(prefix), "1", seq_len, 0, need=("train",)).train
    micro_batch(ds, 0, micro_bs)  # builds epoch 0's index
    n = 200
    t = time.perf_counter()
    for k in range(n):
        micro_batch(ds, k * micro_bs, micro_bs)
    us = (time.perf_counter() - t) / n * 1e6
    print(f"micro-batch fetch: {us:.0f} us per [{micro_bs}, {seq_len}] batch "
          f"({micro_bs * seq_len / us * 1e6:,.0f} tokens/s); {len(ds)} samples per epoch")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=float, default=20, help="throughput corpus size in MB of text")
    ap.add_argument("--workers", type=int, nargs="*", default=[1, 2], help="none: skip the throughput runs")
    ap.add_argument("--vocab_size", type=int, default=32000)
    ap.add_argument("--rss_mb", type=int, nargs="*", default=[20, 100], help="synthetic corpus sizes for RSS")
    ap.add_argument("--large", action="store_true", help="also measure RSS at 2,000 MB (minutes)")
    ap.add_argument("--seq_len", type=int, default=1024)
    ap.add_argument("--micro_bs", type=int, default=8)
    a = ap.parse_args()

    from pretrain_cli.data.tokenizer import DEFAULT_SPECIALS, Tokenizer, _roles_for
    from pretrain_cli.data.tokenizer_training import train_bpe

    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at start "
          "(shared: other jobs may run during the measurement)")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        demo = demo_docs(tmp)
        t = time.perf_counter()
        tok = train_bpe(demo, a.vocab_size, DEFAULT_SPECIALS)
        Tokenizer(tok, str(tmp / "tok"), _roles_for(DEFAULT_SPECIALS), "").save(tmp / "tok")
        demo_mb = sum(len(d.encode()) for d in demo) / 1e6
        docs = demo * max(1, round(a.mb / demo_mb))
        mb = sum(len(d.encode()) for d in docs) / 1e6
        print(f"corpus: demo corpus x{len(docs) // len(demo)} = {len(docs)} documents, {mb:.1f} MB; "
              f"tokenizer: byte-level BPE, vocab {tok.get_vocab_size()}, trained in {time.perf_counter() - t:.1f}s")
        files = write_formats(docs, tmp)
        # raw measured between every two preprocess runs; each run is compared with the mean of its two
        # neighbours, so a load change on the shared machine affects both sides of a ratio alike
        raws = [raw_rate(tmp / "tok", docs)]
        n_raw = raws[0][1]
        runs = []
        for workers in a.workers:
            for name, src in files.items():
                el, n, cpu = run_preprocess(src, tmp / "out" / f"{name}{workers}", tmp / "tok", workers)
                assert n == n_raw, (n, n_raw)
                raws.append(raw_rate(tmp / "tok", docs))
                runs.append((name, workers, n / el, mb / el, (raws[-2][0] + raws[-1][0]) / 2, n / cpu,
                             (raws[-2][2] + raws[-1][2]) / 2))
        print(f"raw encode_batch ({n_raw} tokens, {len(raws)} measurements): "
              + ", ".join(f"{r[0]:,.0f}" for r in raws) + " tokens/s; "
              + ", ".join(f"{r[2]:,.0f}" for r in raws) + " tokens per CPU-second")
        print("wall: tokens/s vs raw measured just before and after; cpu: tokens per CPU-second (all threads and "
              "workers), which a busy machine distorts less")
        for name, workers, rate, mbs, raw, cpu_rate, raw_cpu in runs:
            print(f"preprocess {name:<8} workers={workers}: wall {rate:>10,.0f} tokens/s {mbs:5.1f} MB/s, "
                  f"raw {raw:>10,.0f}, ratio {rate / raw:.2f} (target >= 0.9) | cpu {cpu_rate:>10,.0f} vs "
                  f"raw {raw_cpu:>10,.0f}, ratio {cpu_rate / raw_cpu:.2f}")
        if runs:
            fetch_latency(tmp / "out" / f"jsonl{a.workers[0]}", a.seq_len, a.micro_bs)
        sizes = list(a.rss_mb) + ([2000] if a.large else [])
        for size in sizes:
            src = tmp / f"syn{size}.jsonl.zst"
            written = synthetic(src, demo, size)
            rss, el = peak_rss(src, tmp / "rss" / f"s{size}", tmp / "tok", 1)
            tokens = json.loads((tmp / "rss" / f"s{size}.json").read_text())["tokens"]
            print(f"peak RSS: {written / 1e6:8.0f} MB input (.jsonl.zst, {src.stat().st_size / 1e6:.0f} MB on disk) -> "
                  f"{rss:6.0f} MB RSS, {tokens:,} tokens in {el:.0f}s ({tokens / el:,.0f} tokens/s)")
            for p in [src, *(tmp / "rss").glob(f"s{size}.*")]:
                p.unlink()


if __name__ == "__main__":
    main()
