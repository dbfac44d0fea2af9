"""The only module that maps our parameters to HF/PaddleNLP checkpoint names and layouts (and back).

Our parameter names already equal HF's, so HF ⇄ ours is a transpose of every 2-D Linear
weight (Paddle `[in, out]`, HF `[out, in]`) plus dropping/ignoring `lm_head.weight` when tied.
PaddleNLP checkpoints use `llama.`/`qwen2.` instead of `model.` and keep Paddle's `[in, out]`; its Qwen3
keeps `model.` and Paddle's layout, recognised by the Linear weights' shapes (`detect_layout`).
Never a RoPE permutation: both sides use the rotate-half layout.
"""
from __future__ import annotations

import glob
import json
import os

import numpy as np

from pretrain_cli import atomic
from pretrain_cli.errors import UserError
from pretrain_cli.models.config import ModelConfig
from pretrain_cli.models.families import FAMILIES

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
DEFAULT_MAX_SHARD_BYTES = 5 * 1024**3
PADDLENLP_PREFIXES = tuple(f.paddlenlp_prefix for f in FAMILIES.values() if f.paddlenlp_prefix)
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)  # old HF Llama checkpoints store this buffer
_QKV_BIASES = tuple(f"self_attn.{p}_proj.bias" for p in "qkv")
# a MoE router's auxiliary-loss-free balancing bias (fp32, `models.moe`): in our checkpoints always; in an HF
# export only for families whose HF model has it (`Family.hf_router_bias`); a source without it starts it at 0
ROUTER_BIAS = "mlp.gate.e_score_correction_bias"


def linear_weight_names(model) -> set[str]:
    """Structured names of Linear weights: the tensors whose HF layout is transposed."""
    import paddle.nn as nn

    return {f"{name}.weight" for name, layer in model.named_sublayers() if isinstance(layer, nn.Linear)}


def hf_params(model) -> list[tuple[str, object, bool]]:
    """(name, parameter, transposed in HF layout?) in model order. The parameters carry HF's names, so the name
    is the HF tensor name too; the checkpoint module keys optimizer state by it, so it survives a rebuild."""
    linear = linear_weight_names(model)
    return [(name, p, name in linear) for name, p in model.named_parameters()]


def load_hf_state_dict(model, tensors: dict, source: str = "checkpoint") -> None:
    """Copy HF-named, HF-layout tensors (numpy or Paddle) into `model`, checking names and shapes."""
    import paddle

    expected = {name: (p, transpose) for name, p, transpose in hf_params(model)}
    tied = model.lm_head is None
    tensors = {k: v for k, v in tensors.items()
               if not k.endswith(_IGNORED_SUFFIXES) and not (tied and k == "lm_head.weight")}
    missing = sorted(n for n in set(expected) - set(tensors) if not n.endswith(ROUTER_BIAS))  # absent: stays 0
    unexpected = sorted(n for n in set(tensors) - set(expected) if not n.endswith(ROUTER_BIAS))  # balancing off
    if missing:
        raise UserError(f"{source}: tensor {missing[0]!r} is missing ({len(missing)} missing in total); "
                        f"the checkpoint does not match config.json")
    if unexpected:
        raise UserError(f"{source}: unexpected tensor {unexpected[0]!r} ({len(unexpected)} unexpected in "
                        f"total); the checkpoint does not match config.json")
    for hf_name, (p, transpose) in expected.items():
        if hf_name not in tensors:  # a router bias the source has not
            continue
        want = list(reversed(p.shape)) if transpose else list(p.shape)
        t = tensors[hf_name]
        kind = str(t.dtype).split(".")[-1]
        if not any(f in kind for f in ("float", "bfloat")):
            raise UserError(f"{source}: tensor {hf_name!r} has dtype {kind}, weights must be floating point; "
                            f"the file is not a model checkpoint (or is damaged)")
        found = list(t.shape)
        if found != want:
            raise UserError(f"{source}: tensor {hf_name!r} has shape {found} but config.json implies {want}; "
                            f"use the config.json that belongs to these weights")
        if not isinstance(t, paddle.Tensor):
            t = paddle.to_tensor(np.ascontiguousarray(t))
        if transpose:
            t = paddle.transpose(t, [1, 0])  # [in, out]
        p.set_value(t.astype(p.dtype))


# ---------------------------------------------------------------- files
def find_weights(src_dir) -> list[str]:
    """The safetensors files of a model directory; UserError naming the directory if there are none."""
    src_dir = str(src_dir)
    index = os.path.join(src_dir, INDEX_FILE)
    if os.path.isfile(index):
        try:
            with open(index, encoding="utf-8") as f:
                weight_map = json.load(f).get("weight_map")
        except (OSError, ValueError, AttributeError) as e:
            raise UserError(f"{index}: unreadable shard index ({e}); re-create it or point to another "
                            f"checkpoint") from None
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) and v and os.path.basename(v) == v
                                                       for v in weight_map.values()):
            raise UserError(f"{index}: `weight_map` must map tensor names to shard file names in this directory; "
                            f"re-create it or point to another checkpoint")
        files = sorted(set(weight_map.values()))
        return [os.path.join(src_dir, f) for f in files]
    single = os.path.join(src_dir, SINGLE_FILE)
    if os.path.isfile(single):
        return [single]
    found = sorted(glob.glob(os.path.join(src_dir, "*.safetensors")))
    if found:
        return found
    if glob.glob(os.path.join(src_dir, "*.pdparams")):  # PaddleNLP without unified_checkpoint: pickle, never read
        raise UserError(f"{src_dir}: holds PaddleNLP .pdparams (pickle), which is not read; save it as safetensors "
                        f"(PaddleNLP `unified_checkpoint: true`, or "
                        f"`model.save_pretrained(dir, safe_serialization=True)`)")
    raise UserError(f"{src_dir}: no {SINGLE_FILE} or {INDEX_FILE}; point to a directory with HF safetensors")


def read_safetensors(src_dir: str) -> dict:
    """All tensors of a (possibly sharded) checkpoint as Paddle tensors (lazy mmap; bf16 fine). A checkpoint
    whose weights are pieces (written under tensor parallelism or ZeRO-3, `checkpoint.index.json`) is
    assembled tensor by tensor from its pieces."""
    from safetensors.paddle import load_file

    from pretrain_cli.storage import checkpoint_index

    index = checkpoint_index.load(src_dir)
    if index is not None and not index["weights_whole"]:
        reader = checkpoint_index.Reader(src_dir, index)
        try:
            return {n: _to_paddle(reader.read(n), reader.info(n)["dtype"]) for n in reader.names("weights")}
        finally:
            reader.close()
    tensors = {}
    for path in find_weights(src_dir):
        if not os.path.isfile(path):
            raise UserError(f"{path}: shard listed in {INDEX_FILE} is missing; copy it back or point to another "
                            f"checkpoint")
        try:
            tensors.update(load_file(path))
        except Exception as e:  # safetensors raises SafetensorError / OSError for damaged or truncated files
            reason = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise UserError(f"{path}: not a readable safetensors file ({reason}); it is damaged or truncated: "
                            f"re-create it, or resume from another checkpoint") from None
    return tensors


def _all_zero(t) -> bool:
    return not np.asarray(t.numpy() if hasattr(t, "numpy") else t).any()


def _to_paddle(arr: np.ndarray, code: str):
    import paddle

    t = paddle.to_tensor(arr)
    return t.view(paddle.bfloat16) if code == "BF16" else t


def _from_paddlenlp(tensors: dict, model) -> dict:
    """PaddleNLP names/layout → HF names/layout, so one loader checks everything."""
    linear = linear_weight_names(model)
    params = dict(model.named_parameters())
    out = {}
    for k, v in tensors.items():
        for prefix in PADDLENLP_PREFIXES:
            if k.startswith(prefix):
                k = "model." + k[len(prefix):]
                break
        if k.endswith(_QKV_BIASES) and k not in params and _all_zero(v):
            continue  # PaddleNLP's Qwen3 attention (a Qwen2 one) may save all-zero q/k/v biases: no bias, exactly
        if k in linear and len(v.shape) == 2:
            v = v.transpose([1, 0])  # [out, in]
        out[k] = v
    return out


def detect_layout(tensors: dict, model=None) -> str:
    """"paddlenlp" if any name carries PaddleNLP's family prefix, or (`model` given) if every non-square Linear
    weight in the file has Paddle's `[in, out]` shape: PaddleNLP's Qwen3 keeps HF's `model.` names, so only the
    shapes tell it apart. Else "hf" (a file whose shapes fit neither fails in the loader, naming the tensor)."""
    if any(k.startswith(PADDLENLP_PREFIXES) for k in tensors):
        return "paddlenlp"
    if model is None:
        return "hf"
    params = dict(model.named_parameters())
    votes = set()
    for name in linear_weight_names(model):
        ours, theirs = tuple(params[name].shape), tuple(tensors[name].shape) if name in tensors else None
        if theirs is None or len(ours) != 2 or ours[0] == ours[1]:
            continue  # absent, or square: both layouts have the same shape
        votes.add("paddlenlp" if theirs == ours else "hf" if theirs == ours[::-1] else "neither")
    return "paddlenlp" if votes == {"paddlenlp"} else "hf"


def load_weights(model, src_dir: str) -> str:
    """Load HF or PaddleNLP safetensors from `src_dir` into `model`; returns the detected layout."""
    tensors = read_safetensors(src_dir)
    layout = detect_layout(tensors, model)
    if layout == "paddlenlp":
        tensors = _from_paddlenlp(tensors, model)
    load_hf_state_dict(model, tensors, source=src_dir)
    return layout


def has_weights(model_dir) -> bool:
    """Whether a directory holds weights at all (a preset or a bare config.json does not)."""
    model_dir = str(model_dir)
    return os.path.isfile(os.path.join(model_dir, INDEX_FILE)) or bool(glob.glob(os.path.join(model_dir, "*.safetensors")))


def load_for_inference(model_dir, cfg: ModelConfig, seed: int, request=None, device: str | None = None):
    """(model, source) for `eval` and `generate`: the directory's weights, or a seeded random init when
    it has none (a preset). A directory with weights that cannot be read is an error, never a random init.
    `request` on `device`: the kernels (`orchestration.prepare.inference_kernels`; None: `ops.kernels`' defaults)."""
    from pretrain_cli import runtime

    paddle = runtime.import_paddle()
    from pretrain_cli.models import build_model
    from pretrain_cli.ops.kernels import select

    weights = has_weights(model_dir)
    if weights:
        find_weights(model_dir)  # a damaged index fails here, before the model is built
    paddle.seed(seed)
    model = build_model(cfg, select(request, device or paddle.device.get_device()))
    if weights:
        load_weights(model, str(model_dir))
    return model, ("trained weights" if weights else f"random init (seed {seed})")


# ---------------------------------------------------------------- saving
_CODES = {"float32": "F32", "bfloat16": "BF16", "float16": "F16"}


def save_hf(model, cfg: ModelConfig, out_dir: str, dtype: str = "float32",
            max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES) -> list[str]:
    """Write an HF-loadable directory from `model`'s own (whole) parameters, one tensor at a time."""
    def produce(p, transpose):
        t = p.detach()
        if str(t.dtype).split(".")[-1] != dtype:
            t = t.astype(dtype)
        arr = t.numpy()
        return arr.T if transpose else arr  # laid out a few rows at a time by the writer

    entries = [(hf, _CODES[dtype], tuple(reversed(p.shape)) if tr else tuple(p.shape),
                lambda p=p, tr=tr: produce(p, tr)) for hf, p, tr in hf_params(model)]
    return write_hf_dir(entries, cfg, out_dir, dtype, max_shard_bytes)


def write_hf_dir(entries, cfg: ModelConfig, out_dir: str, dtype: str = "float32",
                 max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES) -> list[str]:
    """An HF directory from `entries` [(HF name, dtype code, HF shape, produce)]: safetensors sharded the way
    transformers shards (`model-0000k-of-0000n.safetensors` + `model.safetensors.index.json` above
    `max_shard_bytes`), written by streaming (`shard_files.write`: one tensor in memory at a time), then
    config.json and generation_config.json."""
    from pretrain_cli.storage import shard_files

    os.makedirs(out_dir, exist_ok=True)
    if not FAMILIES[cfg.model_type].hf_router_bias:  # transformers' model of this family has no such tensor
        entries = [e for e in entries if not e[0].endswith(ROUTER_BIAS)]
    size = {"F32": 4, "BF16": 2, "F16": 2}
    shards, cur, cur_bytes, total = [], [], 0, 0
    for e in entries:
        n = int(np.prod(e[2], dtype=np.int64)) * size[e[1]]
        if cur and cur_bytes + n > max_shard_bytes:
            shards.append(cur)
            cur, cur_bytes = [], 0
        cur.append(e)
        cur_bytes += n
        total += n
    shards.append(cur)
    n = len(shards)
    files = [SINGLE_FILE] if n == 1 else [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)]
    for fname, shard in zip(files, shards):
        shard_files.write(os.path.join(out_dir, fname), shard, {"format": "pt"})
    index_path = os.path.join(out_dir, INDEX_FILE)
    if n > 1:
        weight_map = {e[0]: fname for fname, shard in zip(files, shards) for e in shard}
        atomic.write_json(index_path, {"metadata": {"total_size": total}, "weight_map": weight_map})
    # stale weights from an earlier save with different sharding would be picked up by loaders
    for old in glob.glob(os.path.join(out_dir, "model*.safetensors*")):
        if os.path.basename(old) not in files and not (n > 1 and old == index_path):
            os.remove(old)
    write_model_config(cfg, out_dir, dtype)
    return files


def write_model_config(cfg: ModelConfig, out_dir: str, dtype: str) -> None:
    """config.json and generation_config.json, as transformers writes them next to the weights."""
    atomic.write_json(os.path.join(out_dir, "config.json"), cfg.to_hf_dict(dtype=dtype))
    gen = {"_from_model_config": True, "bos_token_id": cfg.bos_token_id, "eos_token_id": cfg.eos_token_id}
    if cfg.pad_token_id is not None:
        gen["pad_token_id"] = cfg.pad_token_id
    atomic.write_json(os.path.join(out_dir, "generation_config.json"), gen)
