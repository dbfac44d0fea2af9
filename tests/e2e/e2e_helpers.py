"""Helpers for the end-to-end tests (importable as a plain module)."""
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


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


def bash_commands(doc: Path) -> list[list[str]]:
    """argv of every command in a doc's ```bash blocks (continuations joined, comments dropped): what a reader
    would paste, so the doc tests run exactly that."""
    blocks = re.findall(r"```bash\n(.*?)```", doc.read_text(encoding="utf-8"), re.S)
    return [argv for block in blocks for line in block.replace("\\\n", " ").splitlines()
            if (argv := shlex.split(line, comments=True))]


def demo_root(root: Path, corpus_mb: int, train_args: list[str]) -> Path:
    """`root` laid out as scripts/quickstart.sh leaves the repo (configs/ and scripts/ linked, demo/corpus.jsonl,
    demo/tokenizer, demo/data/pydoc.*), then `train train_args` run in it: the directory the doc tests run a
    guide's commands in."""
    from pretrain_cli.cli import main as cli_main

    for name in ("configs", "scripts"):
        (root / name).symlink_to(REPO / name)
    subprocess.run([sys.executable, str(REPO / "scripts" / "make_demo_corpus.py"), str(root / "demo" / "corpus.jsonl"),
                    "--max_mb", str(corpus_mb)], check=True, capture_output=True)
    cwd = os.getcwd()
    os.chdir(root)
    try:
        assert cli_main(["train-tokenizer", "--input_path", "demo/corpus.jsonl", "--output_dir", "demo/tokenizer",
                         "--vocab_size", "2048"]) == 0
        assert cli_main(["preprocess", "--input_path", "demo/corpus.jsonl", "--output_prefix", "demo/data/pydoc",
                         "--tokenizer", "demo/tokenizer", "--append_eos"]) == 0
        assert cli_main(["train", *train_args]) == 0
    finally:
        os.chdir(cwd)
    return root


def header_only_shards(model_dir: Path, shards: list[str]) -> None:
    """`shards` in `model_dir` holding, a quarter each in turn, the tensors of the model its config.json builds
    (HF names and shapes, from a lazily built model): safetensors headers without data, what `check` reads of a
    downloaded model."""
    from pretrain_cli import runtime
    from pretrain_cli.models import build_model, convert
    from pretrain_cli.models.config import ModelConfig

    with runtime.import_paddle().LazyGuard():
        model = build_model(ModelConfig.from_file(str(model_dir)))
    names = [(n, list(reversed(p.shape)) if t else list(p.shape)) for n, p, t in convert.hf_params(model)]
    for i, f in enumerate(shards):
        head = json.dumps({n: {"dtype": "BF16", "shape": s, "data_offsets": [0, 0]}
                           for n, s in names[i::len(shards)]}).encode()
        (model_dir / f).write_bytes(len(head).to_bytes(8, "little") + head)
