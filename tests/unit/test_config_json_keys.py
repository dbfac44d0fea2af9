"""What a model's config.json says and what check says of it. A misspelt key (`num_expert`) passed silently, leaving
the key it meant to transformers' default (Qwen3-MoE's 128 experts for the file's 16: an 8x larger model); a size
config.json leaves out was used without a word, and no resolved line said the experts' width; DeepSeek-V3's model
line counted 4 layers where its experts line counted the MTP layer in '4 of 5'."""
import json

import pytest

from data_helpers import write_tokens
from pretrain_cli import cli
from pretrain_cli.config.presets import PRESET_DIR, preset_names
from pretrain_cli.errors import UserError
from pretrain_cli.models.config import ModelConfig
from pretrain_cli.orchestration.prepare import prepare
from pretrain_cli.run_config import Target

# as the Hub publishes them (Qwen/Qwen3-30B-A3B, deepseek-ai/DeepSeek-V3): keys not read here stay accepted
QWEN3_30B = {
    "architectures": ["Qwen3MoeForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 151643, "decoder_sparse_step": 1, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
    "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 6144, "max_position_embeddings": 40960,
    "max_window_layers": 48, "mlp_only_layers": [], "model_type": "qwen3_moe", "moe_intermediate_size": 768,
    "norm_topk_prob": True, "num_attention_heads": 32, "num_experts": 128, "num_experts_per_tok": 8,
    "num_hidden_layers": 48, "num_key_value_heads": 4, "output_router_logits": False, "rms_norm_eps": 1e-06,
    "rope_scaling": None, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.001, "sliding_window": None,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "transformers_version": "4.51.0", "use_cache": True,
    "use_sliding_window": False, "vocab_size": 151936}
DEEPSEEK_V3 = {
    "architectures": ["DeepseekV3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "auto_map": {"AutoConfig": "configuration_deepseek.DeepseekV3Config",
                 "AutoModel": "modeling_deepseek.DeepseekV3Model",
                 "AutoModelForCausalLM": "modeling_deepseek.DeepseekV3ForCausalLM"},
    "aux_loss_alpha": 0.001, "bos_token_id": 0, "eos_token_id": 1, "ep_size": 1, "first_k_dense_replace": 3,
    "hidden_act": "silu", "hidden_size": 7168, "initializer_range": 0.02, "intermediate_size": 18432,
    "kv_lora_rank": 512, "max_position_embeddings": 163840, "model_type": "deepseek_v3", "moe_intermediate_size": 2048,
    "moe_layer_freq": 1, "n_group": 8, "n_routed_experts": 256, "n_shared_experts": 1, "norm_topk_prob": True,
    "num_attention_heads": 128, "num_experts_per_tok": 8, "num_hidden_layers": 61, "num_key_value_heads": 128,
    "num_nextn_predict_layers": 1, "pretraining_tp": 1, "q_lora_rank": 1536, "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64, "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3",
                                                    "quant_method": "fp8", "weight_block_size": [128, 128]},
    "rms_norm_eps": 1e-06, "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0,
                                            "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096,
                                            "type": "yarn"},
    "rope_theta": 10000, "routed_scaling_factor": 2.5, "scoring_func": "sigmoid", "seq_aux": True,
    "tie_word_embeddings": False, "topk_group": 4, "topk_method": "noaux_tc", "torch_dtype": "bfloat16",
    "transformers_version": "4.33.1", "use_cache": True, "v_head_dim": 128, "vocab_size": 129280}


def _renamed(d: dict, key: str, to: str) -> dict:
    return {(to if k == key else k): v for k, v in d.items()}


def test_published_configs_and_every_preset_are_read():
    """HF's files carry keys not read here (transformers_version, max_window_layers, scoring_func, auto_map ...):
    none is a near miss of a key they leave out."""
    assert ModelConfig.from_dict(QWEN3_30B).num_experts == 128
    assert ModelConfig.from_dict(DEEPSEEK_V3).num_experts == 256
    for name in preset_names():
        assert ModelConfig.from_file(str(PRESET_DIR / name)).model_type


@pytest.mark.parametrize("d, typo, meant, default", [
    (QWEN3_30B, "num_expert", "num_experts", "(128)"),
    (QWEN3_30B, "moe_intermediate", "moe_intermediate_size", "(768)"),
    (QWEN3_30B, "num_expert_per_tok", "num_experts_per_tok", "(8)"),
    (DEEPSEEK_V3, "n_routed_expert", "n_routed_experts", "(256)"),
    (DEEPSEEK_V3, "first_k_dense_replac", "first_k_dense_replace", "(3)"),
    (DEEPSEEK_V3, "n_shared_expert", "n_shared_experts", "(1)"),
])
def test_a_misspelt_key_is_refused_naming_the_key_it_means(d, typo, meant, default):
    with pytest.raises(UserError) as e:
        ModelConfig.from_dict(_renamed(d, meant, typo), source="m/config.json")
    msg = str(e.value)
    assert msg.startswith(f"m/config.json: {typo} is not a key {d['model_type']} reads; did you mean {meant}? ")
    assert default in msg and msg.endswith(f"rename {typo} to {meant}") and "\n" not in msg, msg


def _describe(tmp_path, config: dict, **keys) -> str:
    (tmp_path / "model").mkdir(exist_ok=True)
    (tmp_path / "model" / "config.json").write_text(json.dumps(config))
    path = tmp_path / "args.json"
    path.write_text(json.dumps({"model_name_or_path": str(tmp_path / "model"), "output_dir": str(tmp_path / "out"),
                                "input_dir": write_tokens(tmp_path / "data"), "do_train": True, "max_steps": 2,
                                "max_seq_length": 16, "split": "1,1,1", "tokenizer_name_or_path": None,
                                "per_device_train_batch_size": 1, "device": "cpu", **keys}))
    return "\n".join(prepare(str(path), [], Target()).describe())


def _preset(name: str) -> dict:
    return json.loads((PRESET_DIR / name / "config.json").read_text())


def test_a_typo_is_checks_one_line(tmp_path, capsys):
    """Through `check`: exit 2, one line naming the directory's config.json."""
    cfg = _renamed(_preset("micro-qwen3-moe"), "num_experts", "num_expert")
    with pytest.raises(UserError):
        _describe(tmp_path, cfg)
    assert cli.main(["check", str(tmp_path / "args.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: {tmp_path / 'model' / 'config.json'}: num_expert is not a key qwen3_moe reads; did you "
                   f"mean num_experts? (config.json has no num_experts, so transformers' default (128) would be "
                   f"used): rename num_expert to num_experts"], err


def test_the_experts_line_says_their_width_and_the_defaults_it_took(tmp_path):
    full = _preset("micro-qwen3-moe")
    text = _describe(tmp_path, full)
    assert "  experts: 8 routed + 0 shared, 32 wide each, in 2 of 2 layers, top-2, norm_topk_prob true;" in text, text
    left_out = {k: v for k, v in full.items() if k not in ("moe_intermediate_size", "num_experts_per_tok")}
    text = _describe(tmp_path, left_out)
    assert ("  experts: 8 routed + 0 shared, 768 wide each (transformers' default: config.json has no "
            "moe_intermediate_size), in 2 of 2 layers, top-8 (transformers' default: config.json has no "
            "num_experts_per_tok), norm_topk_prob true;") in text, text
    assert ModelConfig.from_dict({k: v for k, v in full.items() if k != "num_experts"}).defaulted == ("num_experts",)
    qwen2 = _describe(tmp_path, _preset("micro-qwen2-moe"))  # its shared expert has a width of its own
    assert "  experts: 8 routed, 32 wide each, + 1 shared, 64 wide, in 2 of 2 layers, top-2," in qwen2, qwen2


def test_deepseek_v3_counts_its_mtp_layer_in_both_lines(tmp_path):
    text = _describe(tmp_path, _preset("micro-deepseek-v3"))
    assert "(2 layers + 1 MTP (multi-token prediction) layer, hidden 64," in text, text
    assert "  experts: 8 routed + 1 shared, 32 wide each, in 1 of 2 layers + the MTP layer, top-2 of the top 2 of 4 expert groups," in text, text
    dense_only = {**_preset("micro-deepseek-v3"), "first_k_dense_replace": 2}  # only the MTP layer holds experts
    assert "in 0 of 2 layers + the MTP layer," in _describe(tmp_path, dense_only)


def test_every_key_transformers_base_config_defines_is_accepted():
    """A Llama config.json with sep_token_id (and no pad_token_id) was refused 'did you mean pad_token_id?': every
    key transformers' PretrainedConfig itself defines is accepted, the list checked against the installed
    transformers (its to_dict, and the generation settings it takes off a config on load)."""
    import transformers
    from transformers import GenerationConfig

    from pretrain_cli.models.config_checks import PRETRAINED_CONFIG_KEYS

    base = set(transformers.PretrainedConfig().to_dict())
    generation = set(GenerationConfig._get_default_generation_params())
    unlisted = (base | generation) - PRETRAINED_CONFIG_KEYS
    assert base and generation and not unlisted, unlisted
    llama = {k: v for k, v in _preset("micro-llama").items() if k != "pad_token_id"}
    ids = {"sep_token_id": 4, "mask_token_id": 5, "cls_token_id": 6, "unk_token_id": 7, "eos_token_ids": [1, 2],
           "decoder_start_token_id": 0, "forced_bos_token_id": None, "forced_eos_token_id": None}
    for key, value in ids.items():
        assert ModelConfig.from_dict({**llama, key: value}).model_type == "llama", key
    assert ModelConfig.from_dict({**llama, **{k: 0 for k in PRETRAINED_CONFIG_KEYS if k.endswith("_token_id")},
                                  "max_length": 20, "do_sample": False}).model_type == "llama"


def test_deepseek_keys_from_dict_derives_or_paddlenlp_writes_are_accepted():
    """qk_head_dim (transformers derives and writes it) with no head_dim was refused 'did you mean head_dim?';
    PaddleNLP's rope_scaling_factor / rope_scaling_type with no routed_scaling_factor (a 0.9 difflib match) too."""
    ds = {k: v for k, v in DEEPSEEK_V3.items() if k != "routed_scaling_factor"}
    assert ModelConfig.from_dict({**ds, "qk_head_dim": 192}).qk_head_dim == 192
    assert ModelConfig.from_dict({**ds, "rope_scaling_factor": 1.0, "rope_scaling_type": None}).model_type
    no_quant = {k: v for k, v in ds.items() if k != "quantization_config"}
    assert ModelConfig.from_dict({**no_quant, "qk_head_dim": 192}).model_type == "deepseek_v3"
    with pytest.raises(UserError, match="did you mean routed_scaling_factor"):  # a real typo is still one
        ModelConfig.from_dict({**ds, "routed_scaling_facter": 2.5})


@pytest.mark.parametrize("model_type, cls", [("llama", "LlamaConfig"), ("qwen2", "Qwen2Config"),
                                             ("qwen3", "Qwen3Config"), ("qwen2_moe", "Qwen2MoeConfig"),
                                             ("qwen3_moe", "Qwen3MoeConfig"), ("deepseek_v2", "DeepseekV2Config"),
                                             ("deepseek_v3", "DeepseekV3Config")])
def test_every_key_of_the_familys_transformers_config_is_accepted_alone(model_type, cls):
    """A Qwen config.json with sliding_window and no use_sliding_window was refused 'did you mean
    use_sliding_window?': every key the installed transformers' config class for the family writes or takes,
    alone in a file (so every key it is a near miss of is missing), is no typo."""
    import inspect

    import transformers

    from pretrain_cli.models.config import read_keys
    from pretrain_cli.models.config_checks import misspelt_key

    config = getattr(transformers, cls)
    keys = set(config().to_dict()) | set(inspect.signature(config.__init__).parameters) - {"self", "kwargs"}
    assert ("sliding_window" in keys) == model_type.startswith("qwen"), keys
    refused = {}
    for key in sorted(keys):
        try:
            misspelt_key({key: None}, model_type, read_keys(model_type))
        except UserError as e:
            refused[key] = str(e)
    assert not refused, refused
    if model_type == "qwen3_moe":  # Qwen3-30B-A3B's config.json without use_sliding_window
        published = {k: v for k, v in QWEN3_30B.items() if k != "use_sliding_window"}
        assert ModelConfig.from_dict({**published, "sliding_window": 4096}).num_experts == 128
