"""How long a checkpoint save stalls training: `async_save: true` against the synchronous save, same run.

Why: a synchronous save holds the step for the whole write (safetensors + fsync of weights and AdamW
moments); the asynchronous one only for the gather and the copy to host memory, the write then runs in
a background thread. This trains the same model on the same data twice through the CLI (one process,
CPU), saving every `--save_steps`, and reads the `checkpoint` records of each run's metrics.jsonl
(`stall_seconds`: from entering the save to training going on). Target: async ≤ 20 % of sync.

    python benchmarks/async_save.py [--hidden 512] [--layers 8] [--steps 12] [--save_steps 4] [--json]

The checkpoint at the last step is left out of the comparison: the end of training waits for its write
either way.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np


def model_config(hidden: int, layers: int, vocab: int) -> dict:
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": vocab,
            "hidden_size": hidden, "intermediate_size": hidden * 8 // 3 // 64 * 64 or 64,
            "num_hidden_layers": layers, "num_attention_heads": max(hidden // 64, 1),
            "num_key_value_heads": max(hidden // 128, 1), "max_position_embeddings": 2048,
            "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": False, "hidden_act": "silu",
            "torch_dtype": "float32"}


def write_corpus(prefix: Path, vocab: int, n_tokens: int = 200_000, seed: int = 0) -> None:
    from pretrain_cli.data.indexed_writer import IndexedDatasetWriter

    rng = np.random.default_rng(seed)
    w = IndexedDatasetWriter(str(prefix))
    done = 0
    while done < n_tokens:
        n = int(rng.integers(50, 500))
        w.add_item(rng.integers(3, vocab, size=n).astype(np.uint16))
        w.end_document()
        done += n
    w.finalize()


def run(root: Path, name: str, async_save: bool, a) -> dict:
    out = root / name
    cfg = {"model_name_or_path": str(root / "model"), "input_dir": str(root / "data"), "output_dir": str(out),
           "device": "cpu", "do_train": True, "split": "100,0,0", "max_seq_length": a.seq,
           "per_device_train_batch_size": a.batch, "learning_rate": 1e-4, "max_steps": a.steps,
           "save_steps": a.save_steps, "logging_steps": a.steps, "report_to": ["none"], "disable_tqdm": True,
           "overwrite_output_dir": True, "async_save": async_save}
    path = root / f"{name}.json"
    path.write_text(json.dumps(cfg))
    p = subprocess.run([sys.executable, "-m", "pretrain_cli", "train", str(path)], capture_output=True, text=True,
                       env=dict(os.environ))
    if p.returncode != 0:
        sys.exit(f"{name} run failed:\n{p.stderr[-3000:]}")
    recs = [json.loads(x) for x in (out / "metrics.jsonl").open()]
    stalls = {r["step"]: r["stall_seconds"] for r in recs if r["kind"] == "checkpoint"}
    waited = {r["step"]: r.get("waited_seconds", 0.0) for r in recs if r["kind"] == "checkpoint"}
    results = json.loads((out / "train_results.json").read_text())
    size = sum(f.stat().st_size for f in (out / f"checkpoint-{a.steps}").iterdir())
    return {"stalls": stalls, "waited": waited, "train_runtime": results["train_runtime"],
            "checkpoint_mib": round(size / 2**20, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=16384)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--save_steps", type=int, default=4)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "model").mkdir()
        (root / "model" / "config.json").write_text(json.dumps(model_config(a.hidden, a.layers, a.vocab)))
        write_corpus(root / "data" / "c", a.vocab)
        sync, asyn = run(root, "sync", False, a), run(root, "async", True, a)
    mid = [s for s in sync["stalls"] if s != a.steps]  # the last save is waited for in both runs
    mean = lambda d: sum(d[s] for s in mid) / max(len(mid), 1)  # noqa: E731
    report = {"checkpoint_mib": sync["checkpoint_mib"], "saves_compared": mid,
              "sync_stall_s": {str(k): v for k, v in sync["stalls"].items()},
              "async_stall_s": {str(k): v for k, v in asyn["stalls"].items()},
              "mean_sync_stall_s": round(mean(sync["stalls"]), 4), "mean_async_stall_s": round(mean(asyn["stalls"]), 4),
              "sync_train_runtime_s": sync["train_runtime"], "async_train_runtime_s": asyn["train_runtime"]}
    report["async_over_sync"] = round(report["mean_async_stall_s"] / max(report["mean_sync_stall_s"], 1e-9), 4)
    if a.json:
        print(json.dumps(report, indent=1))
        return
    print(f"checkpoint size {report['checkpoint_mib']} MiB; saves compared at steps {mid}")
    for step in sorted(sync["stalls"]):
        print(f"  checkpoint-{step}: sync stall {sync['stalls'][step]:.3f} s, async stall "
              f"{asyn['stalls'].get(step, float('nan')):.3f} s (of it waiting for the previous write: "
              f"{asyn['waited'].get(step, 0.0):.3f} s)")
    print(f"mean stall: sync {report['mean_sync_stall_s']:.3f} s, async {report['mean_async_stall_s']:.3f} s, "
          f"ratio {report['async_over_sync']:.3f} (target <= 0.20)")
    print(f"train_runtime: sync {sync['train_runtime']:.2f} s, async {asyn['train_runtime']:.2f} s")


if __name__ == "__main__":
    main()
