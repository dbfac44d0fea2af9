"""HF/PaddleNLP safetensors round trips, sharding, atomic writes and mismatch errors."""
import json
import os

import numpy as np
import pytest

from pretrain_cli import runtime

paddle = runtime.import_paddle()

from safetensors import safe_open  # noqa: E402
from safetensors.numpy import load_file as np_load, save_file as np_save  # noqa: E402

from pretrain_cli.models import convert, model_files  # noqa: E402
from pretrain_cli.errors import UserError  # noqa: E402
from pretrain_cli.models import build_model  # noqa: E402
from pretrain_cli.models.config import ModelConfig  # noqa: E402
from pretrain_cli.training.weight_source import load_for_inference, load_weights  # noqa: E402
from state_helpers import hf_state_dict  # noqa: E402


def cfg_for(model_type="qwen2", tied=True):
    return ModelConfig(model_type=model_type, vocab_size=51, hidden_size=16, intermediate_size=24,
                       num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                       max_position_embeddings=32, tie_word_embeddings=tied, bos_token_id=1, eos_token_id=2)


def _params(m):
    return {n: p.numpy().copy() for n, p in m.named_parameters()}


def _fresh(cfg, seed):
    paddle.seed(seed)
    return build_model(cfg)


@pytest.mark.parametrize("model_type,tied", [("qwen2", True), ("llama", False), ("qwen3", True)])
def test_save_hf_then_load_is_exact(tmp_path, model_type, tied):
    cfg = cfg_for(model_type, tied)
    src = _fresh(cfg, 1)
    convert.save_hf(src, cfg, str(tmp_path))
    assert sorted(os.listdir(tmp_path)) == ["config.json", "generation_config.json", "model.safetensors"]
    with safe_open(str(tmp_path / "model.safetensors"), framework="np") as f:
        assert f.metadata() == {"format": "pt"}
        keys = set(f.keys())
        assert f.get_tensor("model.layers.0.self_attn.k_proj.weight").shape == (8, 16)  # HF [out, in]
    assert ("lm_head.weight" in keys) == (not tied)
    conf = json.loads((tmp_path / "config.json").read_text())
    assert conf["model_type"] == model_type and conf["torch_dtype"] == "float32" and conf["architectures"]
    assert json.loads((tmp_path / "generation_config.json").read_text())["eos_token_id"] == 2
    dst = _fresh(cfg, 2)
    assert load_weights(dst, str(tmp_path), use="continue_training") == "hf"
    a, b = _params(src), _params(dst)
    assert all(np.array_equal(a[k], b[k]) for k in a)
    cfg2 = ModelConfig.from_file(str(tmp_path))
    model, source = load_for_inference(tmp_path, cfg2, 0)
    assert cfg2 == cfg and source == "trained weights" and np.array_equal(_params(model)["model.norm.weight"], a["model.norm.weight"])


def test_bf16_save_and_sharding(tmp_path):
    cfg = cfg_for("llama", tied=False)
    src = _fresh(cfg, 1)
    files = convert.save_hf(src, cfg, str(tmp_path), dtype="bfloat16", max_shard_bytes=2000)
    assert len(files) > 1 and all((tmp_path / f).exists() for f in files)
    index = json.loads((tmp_path / model_files.INDEX_FILE).read_text())
    assert set(index["weight_map"].values()) == set(files)
    assert json.loads((tmp_path / "config.json").read_text())["torch_dtype"] == "bfloat16"
    dst = _fresh(cfg, 2)
    load_weights(dst, str(tmp_path), use="continue_training")
    a, b = _params(src), _params(dst)
    for k in a:
        np.testing.assert_allclose(a[k], b[k], rtol=1e-2, atol=1e-3)
    # a later unsharded save removes the stale shards and the index
    convert.save_hf(src, cfg, str(tmp_path))
    assert sorted(p for p in os.listdir(tmp_path) if "safetensors" in p) == ["model.safetensors"]
    assert not [p for p in os.listdir(tmp_path) if ".tmp" in p]


def test_paddlenlp_layout_is_detected(tmp_path):
    cfg = cfg_for("qwen2", tied=False)
    src = _fresh(cfg, 1)
    pnlp = {n.replace("model.", "qwen2.", 1): v for n, v in _params(src).items()}  # [in, out] kept
    np_save(pnlp, str(tmp_path / "model.safetensors"))
    dst = _fresh(cfg, 2)
    assert load_weights(dst, str(tmp_path), use="continue_training") == "paddlenlp"
    a, b = _params(src), _params(dst)
    assert all(np.array_equal(a[k], b[k]) for k in a)


def test_paddlenlp_qwen3_layout_is_recognised_by_its_shapes(tmp_path):
    """PaddleNLP's Qwen3 keeps HF's `model.` names but Paddle's [in, out] layout: the non-square Linear weights'
    shapes say which, and the weights load exactly (tied and untied)."""
    for tied in (True, False):
        cfg = cfg_for("qwen3", tied=tied)
        src = _fresh(cfg, 1)
        np_save(_params(src), str(tmp_path / "model.safetensors"))  # [in, out], model.* names
        dst = _fresh(cfg, 2)
        assert load_weights(dst, str(tmp_path), use="continue_training") == "paddlenlp"
        a, b = _params(src), _params(dst)
        assert all(np.array_equal(a[k], b[k]) for k in a)
        convert.save_hf(src, cfg, str(tmp_path))  # the HF layout of the same weights is still read as HF
        assert load_weights(_fresh(cfg, 3), str(tmp_path), use="continue_training") == "hf"


def test_a_file_mixing_both_layouts_stops_with_a_shape_error(tmp_path):
    cfg = cfg_for("qwen3")
    tensors = _params(_fresh(cfg, 1))  # [in, out]
    name = "model.layers.0.mlp.gate_proj.weight"
    tensors[name] = np.ascontiguousarray(tensors[name].T)  # this one in HF's [out, in]
    np_save(tensors, str(tmp_path / "model.safetensors"))
    with pytest.raises(UserError, match="has shape"):
        load_weights(_fresh(cfg, 2), str(tmp_path), use="continue_training")


def test_shape_mismatch_names_tensor_and_shapes(tmp_path):
    cfg = cfg_for("qwen2")
    convert.save_hf(_fresh(cfg, 1), cfg, str(tmp_path))
    bigger = cfg_for("qwen2")
    bigger.intermediate_size = 32
    with pytest.raises(UserError) as e:
        load_weights(_fresh(bigger, 1), str(tmp_path), use="continue_training")
    msg = str(e.value)
    assert "\n" not in msg
    assert "model.layers.0.mlp.gate_proj.weight" in msg and "[24, 16]" in msg and "[32, 16]" in msg


def test_missing_and_unexpected_tensors(tmp_path):
    cfg = cfg_for("llama", tied=False)
    convert.save_hf(_fresh(cfg, 1), cfg, str(tmp_path))
    tensors = np_load(str(tmp_path / "model.safetensors"))
    del tensors["model.norm.weight"]
    np_save(tensors, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(UserError, match="'model.norm.weight' is missing"):
        load_weights(_fresh(cfg, 1), str(tmp_path), use="continue_training")
    tensors["model.norm.weight"] = np.ones(16, "float32")
    tensors["model.layers.9.mlp.up_proj.weight"] = np.ones((24, 16), "float32")
    np_save(tensors, str(tmp_path / "model.safetensors"))
    with pytest.raises(UserError, match="unexpected tensor 'model.layers.9.mlp.up_proj.weight'"):
        load_weights(_fresh(cfg, 1), str(tmp_path), use="continue_training")


def test_tied_checkpoint_with_extra_lm_head_is_accepted(tmp_path):
    cfg = cfg_for("qwen2", tied=True)
    src = _fresh(cfg, 1)
    tensors = {k: v.numpy() for k, v in hf_state_dict(src).items()}
    tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"] + 1.0  # HF may store the tied copy; ignored
    np_save(tensors, str(tmp_path / "model.safetensors"))
    dst = _fresh(cfg, 2)
    assert load_weights(dst, str(tmp_path), use="continue_training") == "hf"
    got = {k: v.numpy() for k, v in hf_state_dict(dst).items()}
    assert "lm_head.weight" not in got and dst.lm_head is None
    for name, value in got.items():
        np.testing.assert_array_equal(value, tensors[name], err_msg=name)


def test_no_weights_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="no model.safetensors"):
        model_files.find_weights(str(tmp_path))
    # a trainer's states are no weights: the fallback read every *.safetensors, these as a model's
    for name in ("optimizer.safetensors", "master_weights-00001-of-00001.safetensors"):
        (tmp_path / name).write_bytes(b"")
    with pytest.raises(UserError, match="no model.safetensors"):
        model_files.find_weights(str(tmp_path))
    (tmp_path / "consolidated.safetensors").write_bytes(b"")  # weights, but not the model's name: refused, named
    with pytest.raises(UserError, match=r"holds weights only under names not read as a model \(consolidated"):
        model_files.find_weights(str(tmp_path))


def test_hf_params_marks_linear_weights():
    model = _fresh(cfg_for("qwen2"), 0)
    named = {name: (p, tr) for name, p, tr in convert.hf_params(model)}
    assert list(named) == [n for n, _ in model.named_parameters()]  # model order, HF's names
    assert named["model.layers.0.self_attn.q_proj.weight"][1] is True
    assert named["model.layers.0.self_attn.q_proj.bias"][1] is False
    assert named["model.embed_tokens.weight"][1] is False
