"""`pretrain-cli export CHECKPOINT OUT_DIR`: any checkpoint (or a run's final directory) → a Hugging Face directory.

A `checkpoint-N` written under tensor parallelism, a pipeline or ZeRO-3 is a set of per-rank pieces that
transformers cannot load; this assembles each tensor from its pieces (`training.export.export_checkpoint`, the
same writer as the final export), casts it to `--dtype` and streams it into transformers' shards, so memory holds
one tensor at a time. PaddleNLP users know the step as its merge tools; torchtitan ships a converter.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pretrain_cli.errors import UserError

DTYPES = ("bfloat16", "float16", "float32")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("checkpoint", help="a run's checkpoint-N (any layout) or its final output_dir")
    parser.add_argument("out_dir", help="the Hugging Face directory to create (must not exist, or be empty)")
    parser.add_argument("--dtype", default="float32", choices=DTYPES,
                        help="dtype of the exported weights and config.json's torch_dtype (default: %(default)s)")
    parser.add_argument("--max_shard_size_gib", type=float, default=5.0,
                        help="above this many GiB the weights are sharded with model.safetensors.index.json, "
                             "as transformers shards (default: %(default)s)")


def main(ns: argparse.Namespace) -> int:
    src, out = Path(ns.checkpoint).resolve(), Path(ns.out_dir).resolve()
    import math

    if not (math.isfinite(ns.max_shard_size_gib) and 2**-20 <= ns.max_shard_size_gib <= 2**20):
        raise UserError(f"--max_shard_size_gib: must be a number of GiB from 2^-20 (1 KiB) to 2^20, got "
                        f"{ns.max_shard_size_gib}")
    if out == src or src in out.parents:
        raise UserError(f"{ns.out_dir}: inside the checkpoint {ns.checkpoint}; choose a directory outside it")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UserError(f"{ns.out_dir}: exists and is not empty; choose a new directory or remove it")
    from pretrain_cli.training.export import export_checkpoint

    files, step, note = export_checkpoint(src, out, ns.dtype, int(ns.max_shard_size_gib * 1024**3))
    if note:
        print(note, file=sys.stderr)
    at = f" (step {step})" if step is not None else ""
    tok = "" if (out / "tokenizer.json").is_file() else "; no tokenizer files (the run had none)"
    print(f"exported {src}{at} to {out}: {len(files)} safetensors file(s), {ns.dtype}{tok}", file=sys.stderr)
    return 0
