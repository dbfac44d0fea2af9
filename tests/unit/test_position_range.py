"""A config.json's `max_position_embeddings` left out means transformers' default of its configuration class
(Qwen3MoeConfig 32768, LlamaConfig 2048, ...), and a new model is raised to a longer max_seq_length whether the key
is written or left out (`orchestration.opened.build_model_config`); pretrained weights keep their range and train
past it with a note."""
import json

import pytest

from pretrain_cli.config.parser import parse_config
from pretrain_cli.models.config import ModelConfig
from pretrain_cli.models.families import FAMILIES
from pretrain_cli.orchestration.opened import build_model_config

TINY = {"model_type": "qwen3_moe", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 48,
        "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16,
        "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 16}


def _built(tmp_path, config: dict, seq: int, *flags: str):
    (tmp_path / "config.json").write_text(json.dumps(config))
    args = parse_config(None, ["--model_name_or_path", str(tmp_path), "--max_seq_length", str(seq), *flags])
    _, cfg = build_model_config(args)
    return cfg, list(args.rewritten)


def test_left_out_is_transformers_default(tmp_path):
    """It was 2048 for every family: max_seq_length 4096 on the tiny Qwen3-MoE stopped with 'exceeds the model's
    max_position_embeddings (2048)', where transformers reads that config.json as 32768."""
    cfg, notes = _built(tmp_path, TINY, 4096)
    assert cfg.max_position_embeddings == 32768 and notes == []


def test_a_new_model_is_raised_whether_the_key_is_written_or_left_out(tmp_path):
    llama = {k: v for k, v in TINY.items() if not k.startswith(("num_experts", "moe_"))} | {"model_type": "llama"}
    cfg, notes = _built(tmp_path, llama, 4096)  # LlamaConfig's default: 2048
    assert cfg.max_position_embeddings == 4096
    assert notes == ["max_position_embeddings: raised from 2048 (transformers' default: config.json leaves it out) to "
                     "max_seq_length 4096 for the new model, whose positions are the ones it trains on (as in "
                     "PaddleNLP)"]
    cfg, notes = _built(tmp_path, {**llama, "max_position_embeddings": 256}, 4096)
    assert cfg.max_position_embeddings == 4096 and notes[0].startswith("max_position_embeddings: raised from 256 to")
    cfg, notes = _built(tmp_path, llama, 4096, "--continue_training", "1")  # pretrained weights: their range
    assert cfg.max_position_embeddings == 2048  # (the default's), and a note
    assert notes == ["max_seq_length: 4096 is past the model's max_position_embeddings (2048): positions 2048-4095 "
                     "take RoPE angles computed as transformers computes them (RoPE has no position table), angles a "
                     "model pretrained to 2048 has not seen; this run trains on them, and the config.json it saves "
                     "keeps max_position_embeddings 2048, as PaddleNLP's continue_training does"]


def _left_out(model_type: str) -> dict:
    """A config.json of the family that leaves `max_position_embeddings` out: its micro preset's, else the tiny
    Qwen3-MoE's without experts (Qwen3 has no micro preset)."""
    from pretrain_cli.config.presets import resolve_model_dir

    if model_type == "qwen3":
        config = {k: v for k, v in TINY.items() if not k.startswith(("num_experts", "moe_"))}
        config["model_type"] = "qwen3"
    else:
        name = {"llama": "micro-llama", "qwen2": "micro-qwen2", "qwen2_moe": "micro-qwen2-moe",
                "qwen3_moe": "micro-qwen3-moe", "deepseek_v2": "micro-deepseek-v2",
                "deepseek_v3": "micro-deepseek-v3"}[model_type]
        config = json.loads((resolve_model_dir(name) / "config.json").read_text())
    config.pop("max_position_embeddings", None)
    return config


@pytest.mark.parametrize("model_type", sorted(FAMILIES))
def test_the_default_a_note_names_is_the_one_the_model_gets(tmp_path, model_type):
    """The raise's note reads the family's default where `ModelConfig.from_dict` fills it (`Family.with_defaults`):
    the number it says it raised from is the range the same config.json builds without the raise."""
    config = _left_out(model_type)
    built = ModelConfig.from_dict(config).max_position_embeddings
    cfg, notes = _built(tmp_path, config, 1 << 20)
    assert cfg.max_position_embeddings == 1 << 20
    assert notes[0].startswith(f"max_position_embeddings: raised from {built} (transformers' default: config.json "
                               f"leaves it out) to max_seq_length {1 << 20} ")
    assert _built(tmp_path, config, 16)[0].max_position_embeddings == built  # not raised: the family's default
