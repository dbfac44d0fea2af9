"""Refusals of a model whose weights are read (continue_training, eval, generate) never advise changing the
architecture those weights were trained with: another activation, quantized weights, a tokenizer larger than the
weights' vocabulary (a sliding window: test_sliding_window_weights). A new model (no weights) keeps the advice that
builds it differently."""
import pytest

from pretrain_cli.config.parser import parse_config
from pretrain_cli.errors import UserError
from pretrain_cli.models.config import ModelConfig
from pretrain_cli.orchestration import opened

QWEN2 = dict(model_type="qwen2", vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=4,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)


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
