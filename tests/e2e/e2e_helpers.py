"""Helpers for the end-to-end tests (importable as a plain module)."""
import json
from pathlib import Path


def write_config(path: Path, corpus: Path, **overrides) -> str:
    cfg = {
        "model_name_or_path": "micro-qwen2",
        "tokenizer_name_or_path": str(corpus / "tokenizer"),
        "input_dir": str(corpus / "data"),
        "output_dir": str(path / "out"),
        "device": "cpu",
        "split": "90,5,5",
        "max_seq_length": 32,
        "per_device_train_batch_size": 4,
        "per_device_eval_batch_size": 4,
        "learning_rate": 0.005,
        "min_learning_rate": 0.0005,
        "warmup_steps": 2,
        "max_steps": 8,
        "logging_steps": 1,
        "save_steps": 4,
        "eval_iters": 2,
        "do_train": True,
        "report_to": ["none"],
        "seed": 7,
        "use_flash_attention": True,
    }
    cfg.update(overrides)
    p = path / "cfg.json"
    p.write_text(json.dumps(cfg))
    return str(p)


def train_losses(out: Path) -> list:
    recs = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in recs if r["kind"] == "train"]
