"""What the final export does with weights an earlier model left in output_dir (`convert.write_hf_dir` removes those
under transformers' names, `final_model.leftover_weights` says so and names the others): a run started over there
(overwrite_output_dir) on an older run's sharded model, or a downloaded one carrying a pytorch_model.bin, left those
beside its own, unsaid, and from_pretrained could read them; files under other names are the user's."""
import logging
import shutil
from types import SimpleNamespace as NS

import numpy as np
import pytest

from pretrain_cli import runtime

paddle = runtime.import_paddle()

import torch  # noqa: E402
import transformers  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

from pretrain_cli.models import build_model, convert  # noqa: E402
from pretrain_cli.models.config import ModelConfig  # noqa: E402
from pretrain_cli.training import export, final_model  # noqa: E402
from pretrain_cli.training.weight_source import load_weights  # noqa: E402
from state_helpers import hf_state_dict  # noqa: E402

CFG = ModelConfig(model_type="qwen2", vocab_size=51, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32, tie_word_embeddings=True,
                  bos_token_id=1, eos_token_id=2)


def _model(seed):
    paddle.seed(seed)
    return build_model(CFG)


def _earlier_model(out):
    """A model of other weights in out as an older run and a hub download leave it: transformers' shards and their
    index, the same weights as pytorch_model.bin, and a consolidated.safetensors (a name no HF directory uses)."""
    convert.save_hf(_model(1), CFG, str(out), max_shard_bytes=12000)
    old = {}
    for shard in sorted(out.glob("model-*-of-*.safetensors")):
        old.update(load_file(str(shard)))
    torch.save(old, out / "pytorch_model.bin")
    shutil.copy(out / "model-00001-of-00002.safetensors", out / "consolidated.safetensors")
    return old


def test_the_final_export_leaves_only_its_own_weights_under_transformers_names(tmp_path, caplog):
    out = tmp_path / "out"
    old = _earlier_model(out)
    assert sorted(p.name for p in out.glob("model*")) == ["model-00001-of-00002.safetensors",
                                                         "model-00002-of-00002.safetensors",
                                                         "model.safetensors.index.json"]
    new = _model(2)
    run = NS(loop=NS(do_train=True), output=NS(output_dir=str(out), export_dtype="float32"), moe=NS(capacity_factor=0))
    with caplog.at_level(logging.INFO, logger="pretrain_cli"):
        export.write_final(run, CFG, new, None, {}, {"global_step": 3}, {"train_loss": 1.0})
    want = {n: t.numpy() for n, t in hf_state_dict(new).items()}
    assert not all(np.array_equal(old[n].numpy(), want[n]) for n in want)  # the earlier model is another one
    # transformers reads exactly the new weights, and finds no PyTorch-format copy of the earlier model to read
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32)
    got = {n: t.detach().numpy() for n, t in hf.state_dict().items()}
    assert all(np.array_equal(got[n], want[n]) for n in want)
    with pytest.raises(OSError, match="pytorch_model.bin"):  # (before: the earlier model, read without a word)
        transformers.AutoModelForCausalLM.from_pretrained(str(out), use_safetensors=False)
    # our loader (eval --model, continue_training) reads exactly the new weights too
    mine = _model(3)
    load_weights(mine, str(out), use="continue_training")
    assert all(np.array_equal(p.numpy(), n.numpy()) for p, n in zip(mine.parameters(), new.parameters()))
    weights = sorted(p.name for p in out.iterdir() if p.suffix in (".safetensors", ".bin") or "index" in p.name)
    assert weights == ["consolidated.safetensors", "model.safetensors"]
    said = [r.getMessage() for r in caplog.records if "final export:" in r.getMessage()]
    assert said[1:3] == [
        f"final export: removed model-00001-of-00002.safetensors, model-00002-of-00002.safetensors, "
        f"model.safetensors.index.json, pytorch_model.bin from {out}: an earlier model's weights under transformers' "
        "names, which loaders would read in place of this run's",
        f"final export: {out} also holds consolidated.safetensors: weights under names no export of ours writes, left "
        "as they are (from_pretrained and eval --model read this run's, not them); remove them if nothing needs "
        "them"], said


def test_only_transformers_names_are_replaced_and_the_rest_is_named(tmp_path, caplog):
    """transformers' names, variants included (`_add_variant` puts `.fp16` before the last dot: the indexes'
    before `.json`), are the earlier model's; a user's files under names like them are not (all of these went,
    unsaid, when every `model*.safetensors*` went)."""
    out = tmp_path / "out"
    out.mkdir()
    theirs = ["model.safetensors", "model.fp16.safetensors", "model.fp16-00001-of-00002.safetensors",
              "model.safetensors.index.fp16.json", "pytorch_model.fp16-00002-of-00002.bin",
              "pytorch_model.bin.index.fp16.json", "pytorch_model-00001-of-00003.bin"]
    users = ["model.safetensors.bak", "model_ema.safetensors", "model-base.safetensors", "models.safetensors.txt",
             "model-1-of-2.safetensors", "notes.md", "pytorch_model.idx", "pytorch_model.bin"]  # (.bin + .idx: tokens)
    for name in theirs + users:
        (out / name).write_bytes(b"earlier bytes")
    run = NS(loop=NS(do_train=True), output=NS(output_dir=str(out), export_dtype="float32"), moe=NS(capacity_factor=0))
    with caplog.at_level(logging.INFO, logger="pretrain_cli"):
        export.write_final(run, CFG, _model(2), None, {}, {"global_step": 3}, {"train_loss": 1.0})
    assert [n for n in users if not (out / n).is_file()] == []
    assert all((out / n).read_bytes() == b"earlier bytes" for n in users)
    assert sorted(p.name for p in out.iterdir()) == sorted([*users, "model.safetensors", "config.json", "args.json",
                                                            "generation_config.json", *final_model.FINAL_FILES[:4]])
    said = [r.getMessage() for r in caplog.records if "final export:" in r.getMessage()]
    assert said[1:3] == [
        f"final export: removed {', '.join(sorted(set(theirs) - {'model.safetensors'}))} from {out}: an earlier "
        "model's weights under transformers' names, which loaders would read in place of this run's",
        f"final export: {out} also holds model-1-of-2.safetensors, model-base.safetensors, model_ema.safetensors: "
        "weights under names no export of ours writes, left as they are (from_pretrained and eval --model read this "
        "run's, not them); remove them if nothing needs them"], said
    got = transformers.AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).state_dict()
    assert all(np.array_equal(got[n].detach().numpy(), t.numpy()) for n, t in hf_state_dict(_model(2)).items())
