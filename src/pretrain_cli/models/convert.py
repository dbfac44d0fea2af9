"""The only module that maps our parameters to HF/PaddleNLP checkpoint names and layouts (and back).

Our parameter names already equal HF's, so HF ⇄ ours is a transpose of every 2-D Linear
weight (Paddle `[in, out]`, HF `[out, in]`) plus dropping/ignoring `lm_head.weight` when tied.
PaddleNLP checkpoints use `llama.`/`qwen2.` instead of `model.` and keep Paddle's `[in, out]`; its Qwen3
keeps `model.` and Paddle's layout, recognised by the Linear weights' shapes (`detect_layout`).
Never a RoPE permutation: both sides use the rotate-half layout.

`name_map` is the one map from a source's stored tensors to a model's parameters, and the one place their
names, shapes and dtypes are checked; `training.weight_source` reads every source through it.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, replace

import numpy as np

from pretrain_cli import atomic
from pretrain_cli.errors import UserError
from pretrain_cli.models.config import ModelConfig
from pretrain_cli.models.families import FAMILIES
from pretrain_cli.models.model_files import INDEX_FILE, SINGLE_FILE, find_weights, hf_weight_names
from pretrain_cli.storage import fp8

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


def is_mtp(name: str, cfg: ModelConfig) -> bool:
    """Whether HF tensor `name` belongs to a multi-token prediction module (`model.layers.{L + k}.`, `models.mtp`)."""
    m = re.match(r"model\.layers\.(\d+)\.", name)
    return m is not None and int(m.group(1)) >= cfg.num_hidden_layers


def is_mtp_shared_copy(name: str, cfg: ModelConfig) -> bool:
    """The copies of the embedding and the head that published checkpoints store under each MTP module: the
    model shares the main ones (`models.mtp.SHARED`), so these are not read."""
    from pretrain_cli.models.mtp import SHARED

    return is_mtp(name, cfg) and name.endswith(SHARED)


# ---------------------------------------------------------------- the name map
FLOAT_CODES = ("F32", "BF16", "F16", "F64", "F8_E4M3")  # safetensors dtypes a weight may be stored in


@dataclass(frozen=True)
class NameMap:
    """Where each parameter of a model lies in a source's tensors (`name_map`): `names` {ours: (stored name,
    stored transposed)}; `zeros`, the MoE router biases the source has not (they start at 0); `layout`, "hf" or
    "paddlenlp". A parameter in neither (a multi-token prediction module transformers did not save) is not in
    the source."""

    names: dict
    zeros: frozenset
    layout: str


def as_hf(name: str) -> str:
    """A stored tensor's HF name: PaddleNLP's family prefix (`llama.`, `qwen2.`) becomes `model.`; any other
    name (HF's, ours, PaddleNLP's Qwen3, which keeps `model.`) is its own."""
    for prefix in PADDLENLP_PREFIXES:
        if name.startswith(prefix):
            return "model." + name[len(prefix):]
    return name


def name_map(stored: dict, model, where, what: str = "checkpoint", is_zero=None, absent_mtp: bool = False) -> NameMap:
    """The one map from a source's tensors to `model`'s parameters, checked before any tensor is read: every
    parameter present, floating point and of the shape config.json implies, no tensor the model has not.

    `stored` {name: {"shape", "dtype" (safetensors code)}} (the weights of a checkpoint index, or of whole files);
    `where` the file or directory errors name; `is_zero(name)`, whether a stored tensor is all zeros (PaddleNLP's
    Qwen3 may save all-zero q/k/v biases the model has not: exactly no bias); `absent_mtp`, whether multi-token
    prediction modules may be absent (a pretrained directory: transformers drops them when it saves)."""
    cfg, tied = model.config, model.lm_head is None
    layout = detect_layout({n: tuple(t["shape"]) for n, t in stored.items()}, model)
    by_hf = {as_hf(n) if layout == "paddlenlp" else n: n for n in stored}
    keep_mtp = not absent_mtp or any(is_mtp(h, cfg) for h in by_hf)
    linear = linear_weight_names(model)
    params = {n: p for n, p in model.named_parameters() if keep_mtp or not is_mtp(n, cfg)}
    names, zeros = {}, set()
    for ours in params:
        if ours in by_hf:
            names[ours] = (by_hf[ours], ours in linear and layout == "hf")
        elif ours.endswith(ROUTER_BIAS):  # balancing off in the source's run: it starts at 0
            zeros.add(ours)
    missing = sorted(set(params) - set(names) - zeros)
    if missing:
        refuse_fused(where, stored)
        raise UserError(f"{where}: tensor {missing[0]!r} is missing ({len(missing)} missing in total); the {what} "
                        f"does not match config.json")
    known = {name for name, _ in names.values()}
    known |= {n for n in stored if n.endswith(fp8.SCALE_SUFFIX) and n[:-len(fp8.SCALE_SUFFIX)] in known}
    extra = sorted(n for n in stored if n not in known and not _ignored(as_hf(n), cfg, tied)
                   and 0 not in stored[n]["shape"]  # no elements, no weights: transformers' DeepSeek saves a
                   # zero-width `shared_experts` MLP when n_shared_experts is 0, where ours has none
                   and not (as_hf(n).endswith(_QKV_BIASES) and is_zero is not None and is_zero(n)))
    if extra:
        raise UserError(f"{where}: unexpected tensor {extra[0]!r} ({len(extra)} unexpected in total); the {what} "
                        f"does not match config.json")
    for ours, (name, transpose) in names.items():
        code, found = stored[name]["dtype"], list(stored[name]["shape"])
        want = list(reversed(params[ours].shape)) if transpose else list(params[ours].shape)
        if code not in FLOAT_CODES:
            raise UserError(f"{where}: tensor {name!r} has dtype {code}, weights must be floating point; the "
                            f"{what} is not a model's weights (or is damaged)")
        if found != want:
            raise UserError(f"{where}: tensor {name!r} has shape {found} but config.json implies {want}; use the "
                            f"config.json that belongs to these weights")
    return NameMap(names, frozenset(zeros), layout)


# PaddleNLP's fused projections, which a run with fuse_attention_qkv / fuse_attention_ffn: true saves: q, k and v
# (interleaved by KV head group) or gate and up in one tensor, a layout of its own that is not read here
PADDLENLP_FUSED = ("self_attn.qkv_proj.weight", "mlp.gate_up_fused_proj.weight")


def refuse_fused(where, names) -> None:
    """One line for a source holding PaddleNLP's fused projections, naming the way PaddleNLP itself unfuses them
    (its from_pretrained splits them when config.json says unfused); else the missing q/k/v or gate/up tensors
    would be the error, which does not say why."""
    fused = sorted(n for n in names if n.endswith(PADDLENLP_FUSED))
    if fused:
        raise UserError(f"{where}: holds PaddleNLP's fused {fused[0]!r} ({len(fused)} fused in total: saved with "
                        f"fuse_attention_qkv or fuse_attention_ffn true), which is not read; in PaddleNLP load it "
                        f"with both false (from_pretrained splits them) and save it with "
                        f"`model.save_pretrained(dir, safe_serialization=True)`")


def readable_weights(src_dir) -> list[str]:
    """`find_weights`, and the fused projections `name_map` would refuse, found from the files' headers alone
    (what `check` reads of a pretrained directory for `continue_training`). A shard the index names but the
    directory lacks, one cut short or with a damaged header is one line ending as `shard_files.advice_for` says
    for continuing from that directory: a model directory (a download stopped halfway) is downloaded again; a
    run's checkpoint-N or final directory is incomplete (or damaged), and another of its run's is named."""
    from pretrain_cli.storage.shard_files import File, advice_for

    files, names = find_weights(src_dir, "continue_training"), []
    listed_in = INDEX_FILE if os.path.isfile(os.path.join(src_dir, INDEX_FILE)) else None  # else each was found
    advice = advice_for(src_dir, "continue_training")
    for path in files:
        file = File(path, "safetensors header", advice, listed_in).require_data()
        names.extend(file.tensors)
    refuse_fused(src_dir, names)
    return files


def _ignored(hf: str, cfg: ModelConfig, tied: bool) -> bool:
    """A stored tensor (by its HF name) the model has no parameter for and need not read: old HF Llama's RoPE
    buffer, a router bias (balancing off here), the copies of the embedding and head under each MTP module, the
    tied head's copy."""
    return (hf.endswith(_IGNORED_SUFFIXES + (ROUTER_BIAS,)) or is_mtp_shared_copy(hf, cfg)
            or (tied and hf == "lm_head.weight"))


def detect_layout(shapes: dict, model=None) -> str:
    """"paddlenlp" if any name carries PaddleNLP's family prefix, or (`model` given) if every non-square Linear
    weight in `shapes` ({stored name: shape}) has Paddle's `[in, out]` shape: PaddleNLP's Qwen3 keeps HF's
    `model.` names, so only the shapes tell it apart. Else "hf" (a file whose shapes fit neither fails in
    `name_map`, naming the tensor)."""
    if any(k.startswith(PADDLENLP_PREFIXES) for k in shapes):
        return "paddlenlp"
    if model is None:
        return "hf"
    params = dict(model.named_parameters())
    votes = set()
    for name in linear_weight_names(model):
        ours, theirs = tuple(params[name].shape), tuple(shapes[name]) if name in shapes else None
        if theirs is None or len(ours) != 2 or ours[0] == ours[1]:
            continue  # absent, or square: both layouts have the same shape
        votes.add("paddlenlp" if theirs == ours else "hf" if theirs == ours[::-1] else "neither")
    return "paddlenlp" if votes == {"paddlenlp"} else "hf"


# ---------------------------------------------------------------- saving
_CODES = {"float32": "F32", "bfloat16": "BF16", "float16": "F16"}


def export_dtype(hf_name: str, cfg: ModelConfig, dtype: str) -> str:
    """The dtype tensor `hf_name` is exported in: `dtype`, except what transformers keeps in fp32 in every dtype
    (`Family.hf_fp32`: DeepSeek's router weight and bias; rounded to bf16 they would route otherwise)."""
    return "float32" if hf_name.endswith(FAMILIES[cfg.model_type].hf_fp32) else dtype


def save_hf(model, cfg: ModelConfig, out_dir: str, dtype: str = "float32",
            max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES) -> list[str]:
    """Write an HF-loadable directory from `model`'s own (whole) parameters, one tensor at a time."""
    def produce(p, transpose, to):
        t = p.detach()
        if str(t.dtype).split(".")[-1] != to:
            t = t.astype(to)
        arr = t.numpy()
        return arr.T if transpose else arr  # laid out a few rows at a time by the writer

    entries = []
    for hf, p, tr in hf_params(model):
        to = export_dtype(hf, cfg, dtype)
        entries.append((hf, _CODES[to], tuple(reversed(p.shape)) if tr else tuple(p.shape),
                        lambda p=p, tr=tr, to=to: produce(p, tr, to)))
    return write_hf_dir(entries, cfg, out_dir, dtype, max_shard_bytes)


def write_hf_dir(entries, cfg: ModelConfig, out_dir: str, dtype: str = "float32",
                 max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES) -> list[str]:
    """An HF directory from `entries` [(HF name, dtype code, HF shape, produce)]: safetensors sharded the way
    transformers shards (`model-0000k-of-0000n.safetensors` + `model.safetensors.index.json` above
    `max_shard_bytes`), written by streaming (`shard_files.write`: one tensor in memory at a time), then
    config.json and generation_config.json. The weights an earlier model left there under transformers' names
    (`hf_weight_names`) are removed, and its config.json first: loaders would read them in place of these, or
    beside them."""
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
    # config.json (wherever there is one, weights beside it or not) and the earlier weights under transformers' names
    # go first (`hf_weight_names`' order), then the shards are written, then the index (where there is one) and
    # config.json, last: a kill at any point leaves the earlier model, no model (loaders fail loudly: weights without
    # config.json, shards without their index, `find_weights`), or this one; never files of both, read by different
    # loaders, nor new weights under an old config.json.
    # A single model.safetensors replaces the earlier one in one rename (`shard_files.write`): that one stays till then.
    earlier = hf_weight_names(out_dir)
    config = ["config.json"] if os.path.isfile(os.path.join(out_dir, "config.json")) else []
    for old in config + [f for f in earlier if not (n == 1 and f == SINGLE_FILE)]:
        os.remove(os.path.join(out_dir, old))
    for fname, shard in zip(files, shards):
        shard_files.write(os.path.join(out_dir, fname), shard, {"format": "pt"})
    if n > 1:
        weight_map = {e[0]: fname for fname, shard in zip(files, shards) for e in shard}
        atomic.write_json(os.path.join(out_dir, INDEX_FILE), {"metadata": {"total_size": total},
                                                              "weight_map": weight_map})
    write_model_config(cfg, out_dir, dtype)
    return files


def as_trained(cfg: ModelConfig, mtp_loss_weight: float) -> ModelConfig:
    """The model config a run writes (each checkpoint's config.json, the final model's): where it carries PaddleNLP's
    `num_nextn_predict_lambda`, the MTP loss weight the run trained with. PaddleNLP's DeepSeek-V3 and a
    continue_training here (`config.moe.mtp_weight`) read the weight there, so the model directory's own (1.0 by
    PaddleNLP's default) had them go on at another weight than the run's (0.3 set as mtp_loss_weight)."""
    lam = cfg.extra.get("num_nextn_predict_lambda")
    if lam is None or lam == mtp_loss_weight:
        return cfg
    return replace(cfg, extra={**cfg.extra, "num_nextn_predict_lambda": mtp_loss_weight})


def write_model_config(cfg: ModelConfig, out_dir: str, dtype: str) -> None:
    """config.json and generation_config.json, as transformers writes them next to the weights."""
    from pretrain_cli.models.config import generation_dict

    atomic.write_json(os.path.join(out_dir, "config.json"), cfg.to_hf_dict(dtype=dtype))
    atomic.write_json(os.path.join(out_dir, "generation_config.json"), generation_dict(cfg))
