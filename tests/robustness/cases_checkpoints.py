"""Bad inputs (cases.py) that need Paddle: a damaged checkpoint-9 of the reference run, read by a resume
(`resume_from_checkpoint`) and by `eval --model` (c_), or by a resume only (r_); `PADDLE` maps each case id to its
builder."""
from __future__ import annotations

import json

import numpy as np

from case_run_json import cfg


def _resume(d, **extra):
    cfg(d, **{"resume_from_checkpoint": "ckpt", "output_dir": "out", **extra})
    return ["train", "run.json"]


def _eval(d):
    return ["eval", "--model", "ckpt", "--data", "data/c", "--max_seq_length", "32", "--max_batches", "1"]


def _tensors(d):
    from safetensors.numpy import load_file

    return dict(load_file(str(d / "ckpt" / "model.safetensors")))


def _save(d, tensors, name="model.safetensors"):
    from safetensors.numpy import save_file

    p = d / "ckpt" / name
    p.unlink()
    save_file(tensors, str(p), metadata={"format": "pt"})


def c_missing_shard(d):
    t = _tensors(d)
    names = sorted(t)
    half = {n: t[n] for n in names[: len(names) // 2]}
    _save(d, half)
    (d / "ckpt" / "model.safetensors").rename(d / "ckpt" / "model-00001-of-00002.safetensors")
    wm = {n: ("model-00001-of-00002.safetensors" if n in half else "model-00002-of-00002.safetensors") for n in names}
    (d / "ckpt" / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": wm}))
    return ["model-00002-of-00002.safetensors", "missing"]
def c_shape_mismatch(d):
    t = _tensors(d)
    t["model.norm.weight"] = np.ones(7, np.float32)
    _save(d, t)
    return ["model.norm.weight", "shape [7]"]
def c_wrong_dtype(d):
    t = _tensors(d)
    t["model.norm.weight"] = np.ones(t["model.norm.weight"].shape, np.int32)
    _save(d, t)
    return ["model.norm.weight", "int32"]
def c_truncated_weights(d):
    p = d / "ckpt" / "model.safetensors"
    p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])
    return ["model.safetensors", "resume from another checkpoint"]
def c_garbage_header(d):
    (d / "ckpt" / "model.safetensors").write_bytes(b"\xff" * 64)
    return ["model.safetensors"]
def c_missing_tensor(d):
    t = _tensors(d)
    del t["model.layers.1.mlp.up_proj.weight"]
    _save(d, t)
    return ["model.layers.1.mlp.up_proj.weight", "missing"]
def c_bad_index_json(d):
    (d / "ckpt" / "model.safetensors.index.json").write_text("{not json")
    return ["model.safetensors.index.json"]
def c_other_architecture(d):
    c = json.loads((d / "ckpt" / "config.json").read_text())
    c.update(hidden_size=128, intermediate_size=256)
    (d / "ckpt" / "config.json").write_text(json.dumps(c))
    return ["hidden_size"]
def c_other_family(d):
    c = json.loads((d / "ckpt" / "config.json").read_text())
    c.update(model_type="llama", architectures=["LlamaForCausalLM"])
    (d / "ckpt" / "config.json").write_text(json.dumps(c))
    return ["llama"]


def r_no_trainer_state(d):
    (d / "ckpt" / "trainer_state.json").unlink()
    return _resume(d), ["ckpt", "no trainer_state.json"]
def r_bad_trainer_state(d):
    (d / "ckpt" / "trainer_state.json").write_text('{"global_step": "nine"}')
    return _resume(d), ["trainer_state.json", "global_step"]
def r_missing_optimizer(d):
    (d / "ckpt" / "optimizer.safetensors").unlink()
    return _resume(d), ["optimizer.safetensors"]
def r_truncated_optimizer(d):
    p = d / "ckpt" / "optimizer.safetensors"
    p.write_bytes(p.read_bytes()[:1000])
    return _resume(d), ["resume_from_checkpoint", "optimizer.safetensors has 1000 bytes, the index says"]
def r_other_seq_len(d):
    return _resume(d, max_seq_length=64), ["max_seq_length=32", "64"]
def r_flipped_byte(d):
    p = d / "ckpt" / "model.safetensors"
    data = bytearray(p.read_bytes())
    data[len(data) // 2] ^= 1
    p.write_bytes(bytes(data))
    return _resume(d), ["resume_from_checkpoint", "model.safetensors does not match its checksum"]
def r_not_a_dir(d):
    return _resume(d, resume_from_checkpoint="ckpt/config.json"), ["resume_from_checkpoint", "not a directory"]


PADDLE = {}
for _name, _fn in list(globals().items()):
    if _name.startswith("c_") and callable(_fn):
        def _mk_resume(fn):
            return lambda d: (_resume(d), fn(d))
        def _mk_eval(fn):
            return lambda d: (_eval(d), fn(d))
        PADDLE["resume_" + _name[2:]] = _mk_resume(_fn)
        # a named checkpoint is verified against its index before anything loads (storage.intact): a weights file
        # rewritten since the save no longer has the size (or checksum) the index lists (the rewrite drops the
        # record of its pieces the save put in its header: shorter)
        RESUME_EXPECT_OVERRIDE = {"missing_shard": "model.safetensors is missing", "shape_mismatch": "the index says",
                                  "wrong_dtype": "the index says",
                                  "truncated_weights": "the index says",
                                  "garbage_header": "the index says", "missing_tensor": "the index says"}
        if _name[2:] in RESUME_EXPECT_OVERRIDE:
            PADDLE["resume_" + _name[2:]] = (lambda fn, exp: (lambda d: (_resume(d), (fn(d), exp)[1])))(
                _fn, ["resume_from_checkpoint", "model.safetensors", RESUME_EXPECT_OVERRIDE[_name[2:]]])
        PADDLE["eval_" + _name[2:]] = _mk_eval(_fn)
        # eval reads a checkpoint of ours as a resume does (`training.weight_source.load_weights`): its files are
        # checked against its index first, so a rewritten weights file is named by its size
        EVAL_EXPECT_OVERRIDE = {"other_architecture": ["ckpt", "shape"], "other_family": ["ckpt", "unexpected tensor"],
                                **{k: ["model.safetensors", v] for k, v in RESUME_EXPECT_OVERRIDE.items()}}
        if _name[2:] in EVAL_EXPECT_OVERRIDE:
            PADDLE["eval_" + _name[2:]] = (lambda fn, exp: (lambda d: (_eval(d), (fn(d), exp)[1])))(
                _fn, EVAL_EXPECT_OVERRIDE[_name[2:]])
    elif _name.startswith("r_") and callable(_fn):
        PADDLE["resume_" + _name[2:]] = _fn
