"""Which files of a model directory are weights (`weight_files`: `model_files.has_weights`, the refusal below, prepare's
"weights not loaded" note, the guard of an output_dir no run wrote; `train-tokenizer`'s output_dir guard keeps its own
list, model.safetensors and its index, as data/ may not import models/), and those in formats not read here
(safetensors only): PyTorch's pickles, GGUF, TensorFlow's and Flax's, PaddleNLP's `.pdparams`. A directory
holding those and no safetensors is a trained model all the same, which run as a config.json alone would be a
random init: a command that would use it refuses, naming the files and the conversion that works for them
(transformers 5 loads only some of these formats)."""
from __future__ import annotations

import fnmatch
import os
import re
from pathlib import Path

from pretrain_cli.counts import first_few
from pretrain_cli.errors import UserError
from pretrain_cli.storage.intact import PADDLENLP_MARKS

# weight files of other formats (PyTorch's pickles, GGUF, TensorFlow's, Flax's, PaddleNLP's): never read here
UNREAD_WEIGHTS = ("pytorch_model*.bin", "model*.bin", "*.pt", "*.pth", "*.ckpt", "*.gguf", "*.h5", "*.msgpack",
                  "*.pdparams")
# what a trainer writes beside its weights, never weights: PaddleNLP's marks, transformers' Trainer's and
# accelerate's optimizer, scheduler, sampler, loss-scaler and RNG states, our optimizer.safetensors and PaddleNLP's
# unified checkpoint's optimizer and master_weights safetensors
NOT_WEIGHTS = PADDLENLP_MARKS + ("optimizer*", "scheduler*", "sampler*", "scaler*", "rng_state*", "random_states*",
                                 "master_weights*")
# a PEFT (LoRA) adapter's files: deltas for a base model, no model of their own (`refuse_unread` says so)
PEFT_ADAPTER = ("adapter_model*", "adapter_config.json")


def weight_files(model_dir) -> tuple[list[str], list[str]]:
    """(read, unread): the names of `model_dir`'s safetensors weights (and their index), and of its weights in
    formats not read (`UNREAD_WEIGHTS`); neither holds a trainer's states (`NOT_WEIGHTS`: an optimizer.safetensors
    is no model), nor a PEFT adapter's (`PEFT_ADAPTER`). A `.bin` beside a same-named `.idx` is a token file, not
    weights."""
    d = str(model_dir)
    if not os.path.isdir(d):
        return [], []
    names = sorted(n for n in os.listdir(d) if os.path.isfile(os.path.join(d, n)))
    index = "model.safetensors.index.json"  # (model_files.INDEX_FILE: model_files imports this module)
    names = [n for n in names if not any(fnmatch.fnmatch(n, p) for p in NOT_WEIGHTS + PEFT_ADAPTER)]
    read = [n for n in names if n.endswith(".safetensors") or n == index]
    unread = [n for n in names if any(fnmatch.fnmatch(n, p) for p in UNREAD_WEIGHTS)
              and not (n.endswith(".bin") and n[:-4] + ".idx" in names)]
    return read, unread


# transformers' names of PyTorch weights with a variant (save_pretrained(variant=...): pytorch_model.fp16.bin, its
# shards pytorch_model.fp16-00001-of-00002.bin), which from_pretrained loads only when given the same variant
_VARIANT = re.compile(r"pytorch_model\.([A-Za-z0-9_]+)(-\d+-of-\d+)?\.bin")
# formats transformers 5 has no loader for (it removed TensorFlow and Flax loading; *.pt/*.pth/*.ckpt are a
# script's own pickles: Meta's consolidated.00.pth, Lightning's checkpoints), by their ending
_NO_LOADER = {".h5": "TensorFlow (.h5)", ".msgpack": "Flax (.msgpack)", ".pt": "a PyTorch pickle (.pt)",
              ".pth": "a PyTorch pickle (.pth)", ".ckpt": "a checkpoint pickle (.ckpt)",
              ".bin": "a PyTorch pickle under a name transformers does not load (.bin)"}


def unread_weights(model_dir) -> list[str]:
    """The names of the weight files of `model_dir` that are not read, when it holds no safetensors weights
    (beside safetensors they are copies: transformers' hub repositories often carry both); else []."""
    read, unread = weight_files(model_dir)
    return [] if read else unread


def _convert(d: str, files: list[str], point: str) -> str:
    """The rest of the refusal: the one-liner that works for `files` (written to a new directory: an HF cache
    snapshot's files are links into its shared blob store), or which format has no loader. PyTorch's files load
    only beside a config.json (a GGUF file carries its own config), so without one that is what is asked for."""
    out = d.rstrip("/") + "-safetensors"
    gguf = [f for f in files if f.endswith(".gguf")]
    if gguf:
        return (f"; each .gguf file is one quantization of the model: choose one ({len(gguf)} here) and convert "
                f"it with transformers, which dequantizes it (`pip install gguf` first): python -c \"from "
                f"transformers import AutoModelForCausalLM as M, AutoTokenizer as T; d, f, o = {d!r}, 'CHOSEN.gguf', "
                f"{out!r}; M.from_pretrained(d, gguf_file=f).save_pretrained(o); T.from_pretrained(d, gguf_file=f)."
                f"save_pretrained(o)\" with f the file's name, and point {point} at {out}")
    loadable = [f for f in files if f.startswith("pytorch_model") and f.endswith(".bin")]
    if loadable and not os.path.isfile(os.path.join(d, "config.json")):  # from_pretrained needs one
        return (f"; transformers loads them only beside their model's config.json, which {d} lacks: put that "
                f"config.json there, then run this again for the conversion")
    if not loadable:
        kind = _NO_LOADER.get(Path(files[0]).suffix, "a format")
        return (f"; {files[0]} is {kind}, which transformers 5 has no loader for: convert it with the tool that "
                f"wrote it to safetensors in an HF model directory, and point {point} there")
    variants = sorted({m.group(1) for f in loadable if (m := _VARIANT.fullmatch(f))})
    if len(variants) > 1 and all(_VARIANT.fullmatch(f) for f in loadable):
        return (f"; they are {len(variants)} variants ({', '.join(variants)}): convert one with transformers' "
                f"from_pretrained(d, variant=...).save_pretrained(a new directory), and point {point} there")
    variant = f", variant={variants[0]!r}" if variants and all(_VARIANT.fullmatch(f) for f in loadable) else ""
    return (f"; convert them once with transformers into a new directory: python -c \"from transformers import "
            f"AutoModelForCausalLM as M, AutoTokenizer as T; d, o = {d!r}, {out!r}; M.from_pretrained(d{variant})."
            f"save_pretrained(o); T.from_pretrained(d).save_pretrained(o)\", and point {point} at {out}")


def refuse_unread(model_dir, key: str | None = None) -> None:
    """One line naming the unread weight files of `model_dir` (`key`: the argument that named it, if any) and how
    to make them readable, or a PEFT adapter's files where it holds no weights (a LoRA adapter is no model: read as
    one it was "no config.json" or a missing lm_head.weight); nothing when it holds neither."""
    files = unread_weights(model_dir)
    d, where = str(model_dir), f"{key}: " if key else ""
    if not files:
        adapter = [] if weight_files(model_dir)[0] else sorted(
            n for n in os.listdir(d) if any(fnmatch.fnmatch(n, p) for p in PEFT_ADAPTER)) if os.path.isdir(d) else []
        if adapter:
            raise UserError(f"{where}{d} holds {', '.join(adapter)}: a PEFT adapter, not a model; merge it into its "
                            f"base first (`PeftModel.from_pretrained(base, {d!r}).merge_and_unload()."
                            f"save_pretrained(out)`) and point {key or 'the model argument'} at out")
        return
    named = first_few(files)
    if all(f.endswith(".pdparams") for f in files):
        raise UserError(f"{where}{d} holds {named}, PaddleNLP .pdparams (pickle), which is not read; save it as "
                        f"safetensors (PaddleNLP `unified_checkpoint: true`, or "
                        f"`model.save_pretrained(dir, safe_serialization=True)`)")
    point = key or "the model argument"
    raise UserError(f"{where}{d} holds weights in {named}, which pretrain-cli does not read (safetensors only), and "
                    f"no *.safetensors{_convert(d, files, point)}")


def random_init_note(name: str, preset: bool, seed: int) -> str:
    """What `eval` and `generate` say once, before their result, when `--model` holds no weights at all: its
    numbers are a random init's (seeded as `train` seeds a new model: the run's `seed`, 42 unless --seed says)."""
    what = "a preset: architecture only" if preset else "a config.json alone"
    return f"note: --model {name} holds no weights ({what}): it runs at random init (seed {seed}), not a trained model"
