"""Peak RSS of preprocess on one long document: encoded in pieces (`data/long_documents.py`) or whole, for words
(a cut point at every space), CJK paragraphs between blank lines (cut only after the blank lines: Llama 3's and
Qwen2's patterns, not GPT-2's) and minified JSON (no cut point: one piece whatever the tokenizer).

Why: the tokenizer holds about 100 bytes per character of a text it encodes at once; docs/DATA.md ("Speed and
memory") states what cutting saves and where it cannot. Each run is a fresh `pretrain-cli preprocess` process
that reports its own VmHWM; the input is one JSON line holding one document of --chars million characters;
the tokenizer a byte-level BPE (train-tokenizer's Qwen2 pipeline, which is cuttable) trained on a sample of the
same kinds of text. Nothing is downloaded. Prints one line per (text, mode): MiB, and bytes per character above
a run on a 1,000-character document (the process's own).

    python benchmarks/long_document_rss.py [--chars 5 20] [--text words cjk json] [--whole]
    # --whole adds runs with the cut disabled (PIECE_CHARS past the document): ~100 B/char, 2 GiB at 20 M
"""
from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_WORDS = ("alpha beta gamma delta the quick brown fox jumps over lazy dog lorem ipsum data model token "
          "train loss step").split()


def make_text(kind: str, n: int, seed: int = 0) -> str:
    """`n` characters of `kind`: words (space-separated lines), cjk (paragraphs of CJK characters between blank
    lines), json (minified records on one line)."""
    rng, parts, size = random.Random(seed), [], 0
    while size < n:
        if kind == "words":
            line = " ".join(rng.choice(_WORDS) for _ in range(12)) + "\n"
        elif kind == "cjk":
            line = "".join(chr(rng.randint(0x4E00, 0x4FFF)) for _ in range(200)) + "\u3002\n\n"
        else:
            line = json.dumps({"id": size, "k": rng.choice(_WORDS), "v": [rng.random() for _ in range(4)]},
                              separators=(",", ":"))
        parts.append(line)
        size += len(line)
    return "".join(parts)[:n]


def peak_rss(src: Path, out: Path, tok_dir: Path, whole: bool) -> tuple[float, float]:
    """(peak RSS MiB of a fresh preprocess process, seconds)."""
    code = ("import sys; from pretrain_cli.data import long_documents; "
            + ("long_documents.PIECE_CHARS = 1 << 62; " if whole else "")
            + "from pretrain_cli.cli import main; rc = main(sys.argv[1:]); "
            "print(next(x for x in open('/proc/self/status') if x.startswith('VmHWM')).split()[1]); sys.exit(rc)")
    argv = [sys.executable, "-c", code, "preprocess", "--input_path", str(src), "--output_prefix", str(out),
            "--tokenizer", str(tok_dir), "--log_interval", "0"]
    t = time.perf_counter()
    p = subprocess.run(argv, stdout=subprocess.PIPE, text=True, check=True)
    return int(p.stdout.split()[-1]) / 1024, time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--chars", type=float, nargs="+", default=[5, 20], help="document sizes, M characters")
    ap.add_argument("--text", nargs="+", default=["words", "cjk", "json"], choices=["words", "cjk", "json"])
    ap.add_argument("--whole", action="store_true", help="also encode each document whole (no cut)")
    ap.add_argument("--vocab_size", type=int, default=4000)
    a = ap.parse_args()

    from pretrain_cli.data.tokenizer import DEFAULT_SPECIALS, Tokenizer, _roles_for
    from pretrain_cli.data.tokenizer_training import train_bpe

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        sample = [make_text(k, 2000, seed=s) for k in ("words", "cjk", "json") for s in range(100)]
        Tokenizer(train_bpe(sample, a.vocab_size, DEFAULT_SPECIALS), str(tmp / "tok"), _roles_for(DEFAULT_SPECIALS),
                  "").save(tmp / "tok")
        (tmp / "base.jsonl").write_text(json.dumps({"text": make_text("words", 1000)}) + "\n")
        base, _ = peak_rss(tmp / "base.jsonl", tmp / "out" / "base", tmp / "tok", False)
        print(f"baseline (a 1,000-character document): peak RSS {base:,.0f} MiB; B/char below is above it")
        for kind in a.text:
            for m in a.chars:
                n = int(m * 1e6)
                src = tmp / f"{kind}.jsonl"
                src.write_text(json.dumps({"text": make_text(kind, n, seed=1)}) + "\n")
                for whole in (False, True) if a.whole else (False,):
                    mib, s = peak_rss(src, tmp / "out" / f"{kind}{n}{whole}", tmp / "tok", whole)
                    print(f"{kind:<5} {m:g} M chars, {'whole ' if whole else 'pieces'}: peak RSS {mib:,.0f} MiB "
                          f"({(mib - base) * 2**20 / n:.0f} B/char), {s:.1f} s", flush=True)
                src.unlink()


if __name__ == "__main__":
    main()
