"""Full-logit, loss and gradient parity with HF transformers (torch, CPU fp32) through convert.py.

The loss is the product's: the fused LM head + loss that training and `eval` run, on both of its paths (the CPU
kernel, and the chunked Paddle-op path), compared per token; the logits are the head's.

Tiny random configs cover GQA, qkv biases, tied and untied heads, rope_theta != 1e4, an odd
vocabulary, llama3 RoPE scaling, and Qwen3's per-head q/k RMSNorm with a head_dim that is not
hidden / heads. Weights are perturbed after HF init so biases and norm weights are not trivially
zero/one.
"""
import numpy as np
import pytest

from pretrain_cli import runtime

paddle = runtime.import_paddle()

import torch  # noqa: E402  (the test extra installs CPU torch; these tests always run)
import transformers  # noqa: E402

from parity_helpers import (HEADS, export_loads_in_transformers, hf_loss_backward, hf_model,  # noqa: E402
                            load, production_loss, token_ids)

from pretrain_cli.models import convert  # noqa: E402
from pretrain_cli.models import build_model  # noqa: E402
from pretrain_cli.models.config import ModelConfig  # noqa: E402
from pretrain_cli.ops import kernels  # noqa: E402

COMMON = dict(vocab_size=251, hidden_size=32, intermediate_size=56, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-6, bos_token_id=1,
              eos_token_id=2)
CASES = {
    "qwen2-tied": ("qwen2", dict(tie_word_embeddings=True, rope_theta=1e6)),
    "qwen2-untied": ("qwen2", dict(tie_word_embeddings=False, rope_theta=5e4)),
    "llama-untied-llama3rope": ("llama", dict(tie_word_embeddings=False, rope_theta=5e5, rope_scaling={
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8})),
    "llama-tied-bias": ("llama", dict(tie_word_embeddings=True, rope_theta=2e4, attention_bias=True,
                                      num_key_value_heads=1)),
    # head_dim 16 with hidden 32 and 4 heads: q/o projections are 32 -> 64 -> 32, not square
    "qwen3-tied": ("qwen3", dict(tie_word_embeddings=True, rope_theta=1e6, head_dim=16)),
    "qwen3-untied-bias": ("qwen3", dict(tie_word_embeddings=False, rope_theta=5e4, head_dim=6, attention_bias=True,
                                        num_key_value_heads=1)),
}
HF_CONFIGS = {"qwen2": "Qwen2Config", "qwen3": "Qwen3Config", "llama": "LlamaConfig"}
SEQ = 24


def _hf_model(model_type, kw, seed=0):
    cls = getattr(transformers, HF_CONFIGS[model_type])
    conf_kw = {**COMMON, **kw}
    scaling = conf_kw.pop("rope_scaling", None)
    theta = conf_kw.pop("rope_theta")
    rope = {"rope_type": "default", "rope_theta": theta} if scaling is None else {**scaling, "rope_theta": theta}
    return hf_model(cls(**conf_kw, rope_parameters=rope), seed)


def _ids(seed=1):
    return token_ids(COMMON["vocab_size"], SEQ, seed)


def _ours_forward_backward(model, ids):
    with paddle.no_grad():
        logits = model(paddle.to_tensor(ids[:, :-1])).numpy()
    loss, per_token = production_loss(model, ids[:, :-1], ids[:, 1:])
    return logits, loss, per_token, {n: p.grad.numpy() for n, p in model.named_parameters()}


@pytest.mark.parametrize("case", list(CASES))
def test_hf_to_ours_logits_loss_grads(case, tmp_path):
    model_type, kw = CASES[case]
    hf = _hf_model(model_type, kw)
    hf.save_pretrained(str(tmp_path), safe_serialization=True)
    ids = _ids()
    h_logits, h_loss, h_per_token, h_params = hf_loss_backward(hf, ids)
    for head, request in HEADS.items():
        ours, cfg = load(tmp_path, kernels.select(request, "cpu"))
        assert cfg.model_type == model_type and cfg.tie_word_embeddings == kw["tie_word_embeddings"]
        assert (cfg.rope_scaling is not None) == ("rope_scaling" in kw)
        assert ours.kernels.linear_cross_entropy_name == head
        o_logits, o_loss, o_per_token, o_grads = _ours_forward_backward(ours, ids)
        assert np.abs(o_logits - h_logits).max() <= 1e-4, head
        assert abs(o_loss - h_loss) <= 1e-5, head
        np.testing.assert_allclose(o_per_token, h_per_token, atol=2e-5, rtol=0, err_msg=head)
        _assert_grads(o_grads, h_params, model_type, kw, head)


def _assert_grads(o_grads, h_params, model_type, kw, head):
    for name in ["model.layers.0.self_attn.q_proj.weight", "model.layers.1.mlp.down_proj.weight",
                 "model.layers.0.self_attn.k_proj.weight", "model.embed_tokens.weight", "model.norm.weight"] + (
            ["model.layers.0.self_attn.v_proj.bias"] if model_type == "qwen2" or kw.get("attention_bias") else []) + (
            ["model.layers.0.self_attn.o_proj.bias"] if kw.get("attention_bias") else []) + (
            ["model.layers.1.self_attn.q_norm.weight", "model.layers.0.self_attn.k_norm.weight"]
            if model_type == "qwen3" else []) + (
            [] if kw["tie_word_embeddings"] else ["lm_head.weight"]):
        g_hf = h_params[name].grad.numpy()
        g = o_grads[name]
        g = g.T if g.ndim == 2 and "embed" not in name else g
        np.testing.assert_allclose(g, g_hf, atol=1e-4, err_msg=f"{head}: {name}")


@pytest.mark.parametrize("case", ["qwen2-tied", "llama-untied-llama3rope", "qwen3-tied", "qwen3-untied-bias"])
def test_ours_to_hf_from_pretrained(case, tmp_path):
    model_type, kw = CASES[case]
    _hf_model(model_type, kw, seed=3).save_pretrained(str(tmp_path / "src"), safe_serialization=True)
    _, _, hf = export_loads_in_transformers(tmp_path / "src", tmp_path / "out", _ids(5))
    assert hf.config.tie_word_embeddings == kw["tie_word_embeddings"]
    assert type(hf).__name__ == {"qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM",
                                 "llama": "LlamaForCausalLM"}[model_type]


def test_random_init_statistics_match_hf_scale():
    """Our from-scratch init matches PaddleNLP (std 0.02, residual scaled); HF uses a flat 0.02."""
    cfg = ModelConfig(model_type="qwen2", **{**COMMON, "hidden_size": 128, "intermediate_size": 256})
    paddle.seed(0)
    p = dict(build_model(cfg).named_parameters())
    assert abs(float(p["model.layers.0.mlp.up_proj.weight"].std()) - 0.02) < 1e-3


def test_every_preset_reads_in_transformers_with_our_parameter_count():
    """Each shipped config.json builds the HF model (on the meta device: no memory), whose unique parameter
    count equals `flops.param_counts` (tied heads counted once)."""
    from pretrain_cli.config.presets import PRESET_DIR, preset_names
    from pretrain_cli.models.flops import param_counts

    for name in preset_names():
        conf = transformers.AutoConfig.from_pretrained(str(PRESET_DIR / name))
        with torch.device("meta"):
            hf = transformers.AutoModelForCausalLM.from_config(conf)
        cfg = ModelConfig.from_file(str(PRESET_DIR / name))
        assert type(hf).__name__ == convert.FAMILIES[cfg.model_type].architecture, name
        assert hf.num_parameters() == param_counts(cfg)["total"], name
