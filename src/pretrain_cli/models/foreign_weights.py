"""Weight files a model directory may hold that are not read here (safetensors only): PyTorch's pickles
(`pytorch_model.bin` and its shards, `*.pt`, `*.pth`, `*.ckpt`), GGUF, TensorFlow's and Flax's, PaddleNLP's
`.pdparams`. A directory holding those and no safetensors has trained weights all the same: a command that would
use them refuses, naming the files and the conversion, where it would otherwise run the model at random init as it
runs a config.json alone (`eval`, `generate`) or stop at "no model.safetensors" with no way on (`train`, `check`)."""
from __future__ import annotations

import fnmatch
from pathlib import Path

from pretrain_cli.errors import UserError

UNREAD = ("*.bin", "*.pt", "*.pth", "*.ckpt", "*.gguf", "*.h5", "*.msgpack", "*.pdparams")
# what a trainer's directory holds beside its weights, never weights (transformers' Trainer: its arguments,
# optimizer, scheduler, loss scaler and RNG states; PaddleNLP's scheduler state)
NOT_WEIGHTS = ("training_args.bin", "optimizer.pt", "optimizer.bin", "scheduler.pt", "scaler.pt", "rng_state*.pth",
               "scheduler.pdparams")


def unread_weights(model_dir) -> list[str]:
    """The names of the weight files of `model_dir` that are not read, when it holds no safetensors weights
    (beside safetensors they are copies: transformers' hub repositories often carry both); else []."""
    d = Path(model_dir)
    if not d.is_dir() or any(d.glob("*.safetensors")) or (d / "model.safetensors.index.json").is_file():
        return []
    return sorted(p.name for p in d.iterdir() if p.is_file() and any(fnmatch.fnmatch(p.name, u) for u in UNREAD)
                  and not any(fnmatch.fnmatch(p.name, n) for n in NOT_WEIGHTS))


def refuse_unread(model_dir, key: str | None = None) -> None:
    """One line naming the unread weight files of `model_dir` (`key`: the argument that named it, if any) and the
    one conversion that makes them readable; nothing when it holds none."""
    files = unread_weights(model_dir)
    if not files:
        return
    named = ", ".join(files[:3]) + (f" and {len(files) - 3} more" if len(files) > 3 else "")
    d, where = str(model_dir), f"{key}: " if key else ""
    if all(f.endswith(".pdparams") for f in files):
        raise UserError(f"{where}{d} holds {named}, PaddleNLP .pdparams (pickle), which is not read; save it as "
                        f"safetensors (PaddleNLP `unified_checkpoint: true`, or "
                        f"`model.save_pretrained(dir, safe_serialization=True)`)")
    gguf = next((f for f in files if f.endswith(".gguf")), None)
    load = f"from_pretrained(d, gguf_file='{gguf}')" if gguf else "from_pretrained(d)"  # (GGUF: dequantized)
    raise UserError(f"{where}{d} holds weights in {named}, which pretrain-cli does not read (safetensors only), and "
                    f"no *.safetensors; convert them once with transformers: python -c \"from transformers import "
                    f"AutoModelForCausalLM as M; d = '{d}'; M.{load}.save_pretrained(d, safe_serialization=True)\"")


def random_init_note(name: str, preset: bool, seed: int) -> str:
    """What `eval` and `generate` say once, before their result, when `--model` holds no weights at all: its
    numbers are a random init's (seeded as `train` seeds a new model: the run's `seed`, 42 unless --seed says)."""
    what = "a preset: architecture only" if preset else "a config.json alone"
    return f"note: --model {name} holds no weights ({what}): it runs at random init (seed {seed}), not a trained model"
