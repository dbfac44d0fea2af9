"""Shared helpers for the robustness suite: tiny assets, CLI runs, tree snapshots.

Everything here is numpy/tokenizers only (no Paddle), so building the assets costs well under
a second; only the tests that train or evaluate pay for Paddle's import.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
FAULT_DIR = HERE / "fault_inject"

WORDS = ("alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho "
         "sigma tau upsilon phi chi psi omega the quick brown fox jumps over lazy dog").split()
TOK_VOCAB = 300  # micro-qwen2 has vocab_size 512

# The training run every fault test repeats: micro-qwen2, seq 32, 10 steps, a checkpoint every 3
# steps (3, 6, 9) and at the last step (10), two kept, so step 9's save also rotates checkpoint-3 away.
RUN_CONFIG = {
    "model_name_or_path": "micro-qwen2", "tokenizer_name_or_path": "tok", "input_dir": "data",
    "output_dir": "out", "device": "cpu", "split": "98,2,0", "max_seq_length": 32,
    "per_device_train_batch_size": 2, "gradient_accumulation_steps": 2, "learning_rate": 0.003,
    "warmup_steps": 2, "max_steps": 10, "logging_steps": 5, "save_steps": 3, "save_total_limit": 2,
    "do_train": True, "do_eval": False, "seed": 7, "dataloader_num_workers": 0, "disable_tqdm": True,
}


def texts(n: int, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, size=int(rng.integers(5, 60)))) + "." for _ in range(n)]


def write_jsonl(path: Path, docs) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for t in docs:
            f.write(json.dumps({"text": t}) + "\n")
    return path


def make_tokenizer(directory: Path, vocab_size: int = TOK_VOCAB, specials=None, pad_to: int | None = None) -> Path:
    """A tiny byte-level BPE; `pad_to` adds filler tokens until the vocabulary has that many ids."""
    from pretrain_cli.data.tokenizer import DEFAULT_SPECIALS, Tokenizer, _roles_for
    from pretrain_cli.data.tokenizer_training import train_bpe

    specials = list(DEFAULT_SPECIALS if specials is None else specials)
    tok = train_bpe(texts(200), vocab_size, specials, min_frequency=1)
    if pad_to is not None and tok.get_vocab_size() < pad_to:
        tok.add_tokens([f"<extra_{i}>" for i in range(pad_to - tok.get_vocab_size())])
    Tokenizer(tok, str(directory), _roles_for(specials), "").save(directory)
    return directory


def build_assets(root: Path) -> Path:
    """root/{tok, corpus.jsonl, data/c.{bin,idx,json}, run.json}: a valid run, built in-process."""
    from pretrain_cli import cli

    root.mkdir(parents=True, exist_ok=True)
    make_tokenizer(root / "tok")
    write_jsonl(root / "corpus.jsonl", texts(400))
    rc = cli.main(["preprocess", "--input_path", str(root / "corpus.jsonl"), "--output_prefix",
                   str(root / "data" / "c"), "--tokenizer", str(root / "tok"), "--append_eos"])
    assert rc == 0
    (root / "run.json").write_text(json.dumps(RUN_CONFIG, indent=1))
    return root


def clone(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, symlinks=True)
    return dst


def run_cli(argv, cwd, env=None, timeout=300, faults: str | None = None) -> subprocess.CompletedProcess:
    """`python -m pretrain_cli ARGV` in `cwd`, forked from a process that has imported Paddle
    (tests/forkserver.py). `faults` sets PCLI_FAULT and runs the injector first."""
    import forkserver

    full = dict(os.environ)
    full.pop("PCLI_FAULT", None)
    full.update(env or {})
    if faults:
        full["PCLI_FAULT"] = faults
    return forkserver.run(["-m", "pretrain_cli", *map(str, argv)], cwd=cwd, env=full, timeout=timeout,
                          inject=str(FAULT_DIR / "sitecustomize.py") if faults else None)


def snapshot(root: Path) -> dict:
    """relative path -> (kind, size, sha1) of every file, directory and symlink under root."""
    out = {}
    root = Path(root)
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            rel = str(p.relative_to(root))
            if p.is_symlink():
                out[rel] = ("link", os.readlink(p))
            elif p.is_dir():
                out[rel] = ("dir",)
            else:
                out[rel] = ("file", p.stat().st_size, hashlib.sha1(p.read_bytes()).hexdigest())
    return out


def diff(before: dict, after: dict) -> list[str]:
    changes = [f"new {k}" for k in sorted(set(after) - set(before))]
    changes += [f"removed {k}" for k in sorted(set(before) - set(after))]
    changes += [f"modified {k}" for k in sorted(set(before) & set(after)) if before[k] != after[k]]
    return changes


def check_one_line_error(rc: int, stdout: str, stderr: str, expect, code: int = 2) -> str:
    """Assert the CLI's error contract; returns the error line. `expect`: substrings the line must hold."""
    assert "Traceback" not in stderr and "Traceback" not in stdout, f"traceback:\n{stderr[-3000:]}"
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert rc == code, f"exit code {rc}, expected {code}; stderr:\n{stderr[-2000:]}"
    assert len(lines) == 1, f"expected exactly one stderr line, got {len(lines)}:\n{stderr[-2000:]}"
    line = lines[0]
    assert line.startswith("error: "), line
    for s in ([expect] if isinstance(expect, str) else expect):
        assert s in line, f"{s!r} not in {line!r}"
    return line


def safetensors_bytes_equal(a: Path, b: Path) -> bool:
    return a.read_bytes() == b.read_bytes()


def with_checkpoint(d: Path, reference: Path) -> Path:
    """Copy the reference run's complete checkpoint-9 into case directory `d` as `ckpt/`."""
    shutil.copytree(reference / "out" / "checkpoint-9", d / "ckpt")
    return d
