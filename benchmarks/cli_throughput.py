"""`--through-cli`: the real `pretrain-cli train` on a token file of the benchmark's shape.

Why: the harness times `Trainer.train_step` alone; a user's run also reads token files, logs, writes
metrics.jsonl and VisualDL scalars, draws a progress bar and checks for saves and signals. This runs
`train` in a fresh process with the config's model (its `config.json` in a local directory) and flat
arguments, logging every step, and reads each step's `interval_runtime` from metrics.jsonl: the whole
loop between two log lines. The first `--warmup` steps are dropped, as in the harness.

Measured as the harness measures its worker, so the two compare: the same threads (`--threads` reaches the
run as PRETRAIN_CLI_THREADS; without it both take the product's default, the cores), and each step's process
CPU seconds beside its wall time (`interval_cpu_seconds`, added to the log record by the hook in TIMED_TRAIN):
with `--threads 1` that is the step's work whatever else runs on the shared machine, where the wall time of
two runs minutes apart is not (docs/PERFORMANCE.md §4, Zen 1: 0.74-0.85x by wall clock under load, the same
CPU seconds per step in one process and 0.985x as separate processes).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from step_timing import median, summary


# `pretrain-cli train ...` (cli.main, as the console script runs it), each log record also carrying the process
# CPU seconds since the previous one: wraps Throughput.interval, which the trainer calls once per log line.
TIMED_TRAIN = """
import sys, time
from pretrain_cli.cli import main
from pretrain_cli.training.metrics import Throughput
_interval, _last = Throughput.interval, [time.process_time()]
def interval(self):
    out, now = _interval(self), time.process_time()
    out["interval_cpu_seconds"], _last[0] = round(now - _last[0], 4), now
    return out
Throughput.interval = interval
raise SystemExit(main(sys.argv[1:]))
"""


def train_env(threads: int | None) -> dict:
    """The `train` process's environment: the harness worker's threads (`--threads`, else the product's default)."""
    env = dict(os.environ)
    for key in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "PRETRAIN_CLI_THREADS"):
        env.pop(key, None)
    if threads:
        env["PRETRAIN_CLI_THREADS"] = str(threads)
    return env


def steady_steps(records: list[dict], warmup: int) -> tuple[list[float], list[float], list[float]]:
    """metrics.jsonl's train records after `warmup` steps → (wall seconds, CPU seconds, losses) per step."""
    train = [r for r in records if r.get("kind") == "train" and r["step"] > warmup]
    return ([r["interval_runtime"] for r in train], [r["interval_cpu_seconds"] for r in train],
            [r["loss"] for r in train])


def write_token_file(prefix: Path, vocab: int, tokens: int, doc_len: int = 4096, seed: int = 0) -> None:
    """Random token ids in documents of `doc_len`, through the product's own writer (no tokenizer needed)."""
    import numpy as np

    from pretrain_cli.data.indexed import dtype_for_vocab
    from pretrain_cli.data.indexed_writer import IndexedDatasetWriter

    rng = np.random.default_rng(seed)
    flat = rng.integers(0, vocab, tokens, dtype=np.int64).astype(dtype_for_vocab(vocab))
    lengths = [doc_len] * (tokens // doc_len) + ([tokens % doc_len] if tokens % doc_len else [])
    with IndexedDatasetWriter(prefix, dtype=dtype_for_vocab(vocab)) as w:
        w.add_documents(flat, lengths)
        w.finalize()


def write_run(tmp: Path, cfg: dict, steps: int, overrides: dict) -> Path:
    """Model directory, token file and argument file for a `train` run of the benchmark's shape under `tmp`."""
    ar = cfg["arguments"]
    seq, bs = ar["max_seq_length"], ar["per_device_train_batch_size"]
    (tmp / "model").mkdir(parents=True)
    (tmp / "model" / "config.json").write_text(json.dumps(cfg["model"]))
    write_token_file(tmp / "data" / "corpus", cfg["model"]["vocab_size"], (steps + 4) * bs * (seq + 1) * 2)
    args = dict(ar, model_name_or_path=str(tmp / "model"), input_dir=str(tmp / "data"), output_dir=str(tmp / "out"),
                device="cpu", do_train=True, split="100,0,0", max_steps=steps, logging_steps=1,
                save_steps=10 * steps, disable_tqdm=False)
    args.update(overrides)
    (tmp / "cfg.json").write_text(json.dumps(args))
    return tmp / "cfg.json"


def overrides_of(a) -> dict:
    """The harness options that change OUR run, as argument-file keys."""
    out = {"to_static": True} if a.to_static else {}
    if a.cpu_ops == "off":
        out["cpu_fused_ops"] = False
    out.update(json.loads(a.set_json or "{}"))
    return out


def run_train(cfg: dict, a) -> dict:
    """One `train` run of `a.cli_steps` steps; returns the harness's summary of its steady-state steps."""
    ar = cfg["arguments"]
    tmp = Path(tempfile.mkdtemp(prefix="through_cli_"))
    try:
        cfg_path = write_run(tmp, cfg, a.cli_steps, overrides_of(a))
        proc = subprocess.run([sys.executable, "-c", TIMED_TRAIN, "train", str(cfg_path)], env=train_env(a.threads),
                              capture_output=True, text=True, timeout=3600)
        if proc.returncode != 0:
            raise SystemExit(f"pretrain-cli train failed (rc {proc.returncode}):\n{proc.stdout[-2000:]}"
                             f"{proc.stderr[-3000:]}")
        records = [json.loads(line) for line in (tmp / "out" / "metrics.jsonl").read_text().splitlines()]
        times, cpu, losses = steady_steps(records, a.warmup)
        tokens = ar["per_device_train_batch_size"] * ar["max_seq_length"]
        out = summary(times, tokens)
        out.update({"cpu_s_median": round(median(cpu), 4), "tokens_per_cpu_s": round(tokens / median(cpu), 1)})
        out.update({"framework": "cli", "steps_measured": len(times), "losses": losses,
                    "flops_per_token": 0.0, "matmul_peak_gflops": 0.0})
        return out
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
