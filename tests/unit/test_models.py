"""Model construction, init, config validation, recompute and loss on tiny CPU configs."""
import gc
import math

import numpy as np
import pytest

from pretrain_cli import runtime

paddle = runtime.import_paddle()

from pretrain_cli.errors import UserError  # noqa: E402
from pretrain_cli.ops.loss import causal_lm_loss_sum, mean_loss  # noqa: E402
from pretrain_cli.models import build_model, past_positions  # noqa: E402
from pretrain_cli.models.config import ModelConfig  # noqa: E402
from pretrain_cli.models.rope_scaling import rope_inv_freq  # noqa: E402
from pretrain_cli.models.recompute import apply_recompute  # noqa: E402
from pretrain_cli.run_config import Recompute  # noqa: E402


def tiny(model_type="qwen2", **kw):
    base = dict(model_type=model_type, vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=True)
    base.update(kw)
    return ModelConfig(**base)


def _params(m):
    return {n: p.numpy().copy() for n, p in m.named_parameters()}


def test_forward_shape_and_names():
    m = build_model(tiny())
    logits = m(paddle.randint(0, 97, [2, 7]))
    assert logits.shape == [2, 7, 97]
    names = set(_params(m))
    assert "model.layers.1.self_attn.q_proj.bias" in names and "lm_head.weight" not in names
    assert "model.layers.0.self_attn.o_proj.bias" not in names  # qwen2: no o bias
    m2 = build_model(tiny("llama", tie_word_embeddings=False))
    names2 = set(_params(m2))
    assert "lm_head.weight" in names2 and not any(n.endswith(".bias") for n in names2)
    m3 = build_model(tiny("llama", attention_bias=True))
    assert "model.layers.0.self_attn.o_proj.bias" in set(_params(m3))


def test_qwen3_has_per_head_qk_norms_an_explicit_head_dim_and_no_biases():
    cfg = tiny("qwen3", head_dim=12)  # 4 heads x 12 = 48 != hidden 32
    m = build_model(cfg)
    p = _params(m)
    assert p["model.layers.0.self_attn.q_norm.weight"].shape == (12,) and (p["model.layers.1.self_attn.k_norm.weight"] == 1).all()
    assert p["model.layers.0.self_attn.q_proj.weight"].shape == (32, 48)  # Paddle [in, out]
    assert not any(n.endswith(".bias") for n in p)
    assert m(paddle.randint(0, 97, [2, 5])).shape == [2, 5, 97]
    assert any(n.endswith("o_proj.bias") for n in _params(build_model(tiny("qwen3", attention_bias=True))))
    d = cfg.to_hf_dict()
    assert d["architectures"] == ["Qwen3ForCausalLM"] and d["head_dim"] == 12 and "mlp_bias" not in d
    assert ModelConfig.from_dict(d) == cfg


def test_sliding_window_layer_types_are_refused_full_attention_ones_accepted():
    d = tiny("qwen3").to_hf_dict()
    with pytest.raises(UserError, match="only full_attention layers"):
        ModelConfig.from_dict({**d, "layer_types": ["full_attention", "sliding_attention"]})
    with pytest.raises(UserError, match="use_sliding_window=true"):
        ModelConfig.from_dict({**d, "use_sliding_window": True})
    cfg = ModelConfig.from_dict({**d, "layer_types": ["full_attention"] * 2})
    assert "layer_types" not in cfg.to_hf_dict()  # derivable, so a num_hidden_layers override stays consistent


def test_same_seed_same_weights_different_seed_differs():
    paddle.seed(7)
    a = _params(build_model(tiny()))
    paddle.seed(7)
    b = _params(build_model(tiny()))
    paddle.seed(8)
    c = _params(build_model(tiny()))
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert not np.array_equal(a["model.embed_tokens.weight"], c["model.embed_tokens.weight"])


def test_init_follows_paddlenlp():
    cfg = tiny(hidden_size=128, intermediate_size=256, num_hidden_layers=8, tie_word_embeddings=False)
    paddle.seed(0)
    p = _params(build_model(cfg))
    assert abs(p["model.embed_tokens.weight"].std() - 0.02) < 1e-3
    assert abs(p["model.layers.0.self_attn.q_proj.weight"].std() - 0.02) < 1e-3
    scaled = 0.02 / math.sqrt(2 * 8)
    assert abs(p["model.layers.3.self_attn.o_proj.weight"].std() - scaled) < 2e-4
    assert abs(p["model.layers.3.mlp.down_proj.weight"].std() - scaled) < 2e-4
    assert abs(p["lm_head.weight"].std() - 0.02) < 1e-3
    assert not p["model.layers.0.self_attn.k_proj.bias"].any()
    assert (p["model.norm.weight"] == 1).all() and (p["model.layers.0.input_layernorm.weight"] == 1).all()


@pytest.mark.parametrize("kw,words", [
    (dict(num_attention_heads=4, num_key_value_heads=3), ["num_attention_heads (4)", "num_key_value_heads (3)"]),
    (dict(hidden_size=30, num_attention_heads=4), ["hidden_size (30)", "not divisible"]),
    (dict(model_type="gpt2"), ["gpt2", "llama, qwen2"]),
])
def test_validate_errors_are_one_line(kw, words):
    with pytest.raises(UserError) as e:
        tiny(**kw).validate()
    msg = str(e.value)
    assert "\n" not in msg and all(w in msg for w in words)


def test_from_dict_unknown_model_type_and_positions_past_the_range():
    """Samples past max_position_embeddings are a note, not a refusal (RoPE has no table to run out of): it names
    the positions, and the rope_scaling they are rotated under."""
    with pytest.raises(UserError, match="use one of llama, qwen2"):
        ModelConfig.from_dict({"model_type": "mistral"})
    assert past_positions(tiny(), 64) is None
    assert past_positions(tiny(), 65) == (
        "max_seq_length: 65 is past the model's max_position_embeddings (64): position 64 takes RoPE angles "
        "computed as transformers computes them (RoPE has no position table), angles a model pretrained to 64 has "
        "not seen")
    scaled = tiny(rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                "original_max_position_embeddings": 16})
    assert ", under rope_scaling llama3 (factor 8.0, original_max_position_embeddings 16) as config.json sets it: " \
           "its frequencies do not change with the length, angles" in past_positions(scaled, 100, "--max_seq_length")


def test_hf_dict_round_trip_and_rope_formats():
    cfg = tiny("llama", rope_theta=5e5, rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                      "high_freq_factor": 4.0,
                                                      "original_max_position_embeddings": 16})
    d = cfg.to_hf_dict()
    assert d["architectures"] == ["LlamaForCausalLM"] and d["torch_dtype"] == "float32"
    assert ModelConfig.from_dict(d) == cfg
    v5 = {k: v for k, v in d.items() if k not in ("rope_theta", "rope_scaling")}
    v5["rope_parameters"] = {"rope_theta": 5e5, **cfg.rope_scaling}
    assert ModelConfig.from_dict(v5).rope_scaling == cfg.rope_scaling
    assert ModelConfig.from_dict(v5).rope_theta == 5e5
    plain = ModelConfig.from_dict({**tiny().to_hf_dict(), "rope_scaling": None,
                                   "rope_parameters": {"rope_type": "default", "rope_theta": 1e6}})
    assert plain.rope_scaling is None and plain.rope_theta == 1e6


def test_llama3_rope_scaling_changes_only_low_frequencies():
    base = tiny("llama", hidden_size=64, num_attention_heads=2, num_key_value_heads=1, rope_theta=5e5)
    scaled = tiny("llama", hidden_size=64, num_attention_heads=2, num_key_value_heads=1, rope_theta=5e5,
                  rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                "high_freq_factor": 4.0, "original_max_position_embeddings": 64})
    a, b = rope_inv_freq(base), rope_inv_freq(scaled)
    assert a[0] == b[0]  # highest frequency untouched
    np.testing.assert_allclose(b[-1], a[-1] / 8, rtol=1e-6)  # lowest frequency divided by factor


def test_causal_lm_loss_ignores_minus_100_and_averages_counted_tokens():
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((2, 3, 5)).astype("float32")
    labels = np.array([[1, -100, 4], [0, 2, -100]])
    got = float(mean_loss(*causal_lm_loss_sum(paddle.to_tensor(logits), paddle.to_tensor(labels))))
    lse = np.log(np.exp(logits).sum(-1))
    picks = [lse[b, t] - logits[b, t, labels[b, t]] for b in range(2) for t in range(3) if labels[b, t] != -100]
    assert abs(got - np.mean(picks)) < 1e-5
    none = mean_loss(*causal_lm_loss_sum(paddle.to_tensor(logits), paddle.full([2, 3], -100, dtype="int64")))
    assert float(none) == 0.0


def _loss_and_grads(cfg, granularity, ids, **doc):
    paddle.seed(3)
    m = build_model(cfg)
    apply_recompute(m, Recompute(granularity) if granularity else None)
    m.train()
    loss = mean_loss(*causal_lm_loss_sum(m(ids[:, :-1], **doc), ids[:, 1:]))
    loss.backward()
    return float(loss), {n: p.grad.numpy() for n, p in m.named_parameters()}


@pytest.mark.parametrize("granularity", ["full", "full_attn", "core_attn"])
def test_recompute_same_loss_and_gradients(granularity):
    cfg = tiny(tie_word_embeddings=False)
    paddle.seed(0)
    ids = paddle.randint(0, 97, [2, 17])
    loss0, g0 = _loss_and_grads(cfg, None, ids)
    loss1, g1 = _loss_and_grads(cfg, granularity, ids)
    assert loss0 == loss1
    assert set(g0) == set(g1)
    for n in g0:
        assert np.abs(g0[n] - g1[n]).max() <= 1e-7, n


@pytest.mark.parametrize("granularity", ["full", "full_attn", "core_attn"])
def test_recompute_passes_document_inputs_through(granularity):
    cfg = tiny("qwen3", tie_word_embeddings=False)
    paddle.seed(0)
    ids = paddle.randint(0, 97, [2, 17])
    starts = np.zeros((2, 16), np.int64)
    starts[0, 5:], starts[1, 9:] = 5, 9
    doc = {"doc_start": paddle.to_tensor(starts), "position_ids": paddle.to_tensor(np.arange(16) - starts)}
    loss0, g0 = _loss_and_grads(cfg, None, ids, **doc)
    loss1, g1 = _loss_and_grads(cfg, granularity, ids, **doc)
    assert loss0 == loss1 and loss0 != _loss_and_grads(cfg, None, ids)[0]  # the mask changes the loss
    for n in g0:
        assert np.abs(g0[n] - g1[n]).max() <= 1e-7, n


def test_recompute_lowers_peak_memory_and_keeps_names():
    cfg = tiny(hidden_size=128, intermediate_size=256, num_hidden_layers=4, vocab_size=256)
    paddle.seed(0)
    ids = paddle.randint(0, 256, [2, 257])
    core = paddle.base.core
    peaks = {}
    for g in (None, "full", "full_attn", "core_attn"):
        paddle.seed(3)
        m = apply_recompute(build_model(cfg), Recompute(g) if g else None)
        gc.collect()  # a previous model freed by the cycle collector mid-measurement would lower the peak
        core.host_memory_stat_reset_peak_value("Allocated", 0)
        base = core.host_memory_stat_current_value("Allocated", 0)
        mean_loss(*causal_lm_loss_sum(m(ids[:, :-1]), ids[:, 1:])).backward()
        peaks[g] = core.host_memory_stat_peak_value("Allocated", 0) - base
        if g == "full":
            assert "model.layers.0.self_attn.q_proj.weight" in m.state_dict()
        del m
    assert peaks["full"] < peaks["full_attn"] < peaks[None]
    assert peaks["core_attn"] < peaks[None]


def test_recompute_rejects_unknown_granularity():
    with pytest.raises(ValueError):
        apply_recompute(build_model(tiny()), Recompute("everything"))


def test_generation_greedy_matches_argmax_and_sampling_is_seeded():
    from pretrain_cli.models.generation import generate, sample_next

    paddle.seed(0)
    m = build_model(tiny())
    prompt = np.array([[1, 2, 3]])
    out = generate(m, prompt, 4)
    assert out.shape == (1, 7) and out[0, :3].tolist() == [1, 2, 3]
    m.eval()
    first = int(m(paddle.to_tensor(prompt))[0, -1].numpy().argmax())
    assert out[0, 3] == first
    a = generate(m, prompt, 5, temperature=1.0, top_k=10, top_p=0.9, seed=4)
    b = generate(m, prompt, 5, temperature=1.0, top_k=10, top_p=0.9, seed=4)
    assert np.array_equal(a, b)
    logits = np.array([[0.0, 5.0, 4.0, -1.0]])
    rng = np.random.default_rng(0)
    assert {int(sample_next(logits, rng, 1.0, top_k=2)[0]) for _ in range(50)} <= {1, 2}
    assert {int(sample_next(logits, rng, 1.0, top_p=0.5)[0]) for _ in range(50)} == {1}
    eos = generate(m, prompt, 3, eos_token_id=first)
    assert eos.shape == (1, 4)
