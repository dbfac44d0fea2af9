"""Refusals of a model whose weights are read (continue_training, eval, generate) never advise changing the
architecture those weights were trained with: a sliding window (said whether the run's sequences reach it, as
transformers applies it), another activation, quantized weights, a tokenizer larger than the weights' vocabulary.
A new model (no weights) keeps the advice that builds it differently."""
import json

import numpy as np
import pytest

from pretrain_cli.config.parser import parse_config
from pretrain_cli.errors import UserError
from pretrain_cli.models import config_checks
from pretrain_cli.models.config import ModelConfig
from pretrain_cli.orchestration import opened

QWEN2 = dict(model_type="qwen2", vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=4,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
SWA = {**QWEN2, "use_sliding_window": True, "sliding_window": 16, "max_window_layers": 1}


def test_a_new_model_is_still_told_to_turn_the_window_off():
    with pytest.raises(UserError, match="use_sliding_window=true is not supported; set it to false"):
        ModelConfig.from_dict(SWA)


def test_pretrained_weights_are_told_whether_the_runs_sequences_reach_the_window():
    """The old line said "set it to false" to weights trained with the window."""
    with pytest.raises(UserError) as e:
        ModelConfig.from_dict(SWA, "hub/swa/config.json", pretrained=True, length=64)
    said = str(e.value)
    assert "not supported for this pretrained model" in said and "set it to false" not in said
    assert "layers 1-3 of 4 attend to the last 16 tokens, and sequences of 64 tokens reach past that window" in said
    assert "use sequences of at most 16 tokens, or a model without a sliding window" in said
    with pytest.raises(UserError) as e:
        ModelConfig.from_dict(SWA, "hub/swa/config.json", pretrained=True, length=16)
    assert "sequences of 16 tokens never reach that window" in str(e.value)
    assert "at this length the model is the same with use_sliding_window: false" in str(e.value)


@pytest.mark.parametrize("model_type", ["qwen2", "qwen3", "qwen2_moe", "qwen3_moe"])
def test_the_windowed_layers_are_those_transformers_builds(model_type):
    """`_window_layers` reads a config.json as the installed transformers' configuration class does (which layers
    have the window: Qwen2/Qwen3 from max_window_layers on, Qwen2-MoE the even ones below it, Qwen3-MoE all)."""
    import transformers

    cls = {"qwen2": transformers.Qwen2Config, "qwen3": transformers.Qwen3Config,
           "qwen2_moe": transformers.Qwen2MoeConfig, "qwen3_moe": transformers.Qwen3MoeConfig}[model_type]
    for first in (0, 1, 3, 6):
        d = {"model_type": model_type, "num_hidden_layers": 6, "use_sliding_window": True, "sliding_window": 16,
             "max_window_layers": first}
        theirs = cls(**{k: v for k, v in d.items() if k != "model_type"})
        types = getattr(theirs, "layer_types", None) or ["sliding_attention"] * 6  # (Qwen3-MoE: every layer)
        assert config_checks._window_layers(d) == (16, [i for i, t in enumerate(types) if t == "sliding_attention"])
        written = {**d, "layer_types": types}  # transformers 5 writes the list: it decides
        if model_type != "qwen3_moe":
            assert config_checks._window_layers(written)[1] == config_checks._window_layers(d)[1]


def test_transformers_qwen2_is_the_same_model_until_a_sequence_passes_the_window():
    """What the refusal claims, checked on transformers' own Qwen2: with the window on every layer, logits over
    16 tokens equal those of full attention; from 17 tokens on they differ."""
    import torch
    import transformers

    torch.manual_seed(0)
    kw = dict(vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=64)
    full = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**kw)).eval()
    swa = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**kw, use_sliding_window=True, sliding_window=16,
                                                                 max_window_layers=0)).eval()
    swa.load_state_dict(full.state_dict())
    ids = torch.from_numpy(np.random.default_rng(0).integers(0, 96, (1, 24)))
    with torch.no_grad():
        a, b = full(ids).logits, swa(ids).logits
    assert torch.allclose(a[:, :16], b[:, :16], atol=1e-6)
    assert not torch.allclose(a[:, 16:], b[:, 16:], atol=1e-3)


def test_another_activation_is_not_advised_to_pretrained_weights():
    gelu = {**QWEN2, "hidden_act": "gelu"}
    with pytest.raises(UserError, match='hidden_act \'gelu\' is not supported; use "silu"'):
        ModelConfig.from_dict(gelu)
    with pytest.raises(UserError) as e:
        ModelConfig.from_dict(gelu, pretrained=True)
    assert "not supported for this pretrained model: its MLP was trained with gelu" in str(e.value)
    assert 'use a model whose hidden_act is "silu"' in str(e.value)


def test_quantized_weights_are_refused_and_fp8_blocks_read():
    gptq = {**QWEN2, "quantization_config": {"quant_method": "gptq", "bits": 4, "group_size": 128}}
    with pytest.raises(UserError) as e:  # the old code took it silently
        ModelConfig.from_dict(gptq, "hub/q/config.json", pretrained=True)
    assert str(e.value).startswith("hub/q/config.json: quantization_config (quant_method 'gptq') says the weights "
                                   "are quantized") and "use the unquantized model" in str(e.value)
    assert "quantization_config" not in ModelConfig.from_dict(gptq).to_hf_dict()  # a new model: its shape alone
    fp8 = {**QWEN2, "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}}
    assert ModelConfig.from_dict(fp8, pretrained=True).hidden_size == 32  # dequantized on load


class _Tokenizer:
    vocab_size = 1010


def test_a_larger_tokenizer_is_not_answered_with_vocab_size_under_continue_training(monkeypatch, tmp_path):
    """The old line advised --vocab_size 1010, which continue_training then refused ("drop one of them")."""
    from pretrain_cli.config import presets
    from pretrain_cli.data import tokenizer

    monkeypatch.setattr(presets, "resolve_tokenizer_dir", lambda *a: tmp_path)
    monkeypatch.setattr(tokenizer, "load_tokenizer", lambda d: _Tokenizer())
    cfg = ModelConfig(**{**QWEN2, "vocab_size": 1000})
    with pytest.raises(UserError) as e:
        opened.open_tokenizer(parse_config(None, ["--continue_training", "1"]), cfg)
    said = str(e.value)
    assert "--vocab_size" not in said and "model.resize_token_embeddings(1010)" in said
    assert "a tokenizer of at most 1000 tokens" in said
    with pytest.raises(UserError, match="build the model to the tokenizer's size with --vocab_size 1010"):
        opened.open_tokenizer(parse_config(None, []), cfg)


def test_check_of_a_pretrained_directory_judges_it_as_pretrained(tmp_path):
    """`build_model_config` (check, train, plan) passes continue_training and max_seq_length on."""
    d = tmp_path / "swa"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(SWA))
    for flag, said in (("1", "sequences of 8 tokens never reach"), ("0", "set it to false")):
        args = parse_config(None, ["--model_name_or_path", str(d), "--continue_training", flag,
                                   "--max_seq_length", "8"])
        with pytest.raises(UserError, match=said):
            opened.build_model_config(args)
