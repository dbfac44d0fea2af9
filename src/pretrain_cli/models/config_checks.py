"""The checks a `ModelConfig` must pass before the model code builds it (`ModelConfig.validate`): each a one-line
UserError naming config.json's key and what to do. Kept apart from the fields and their HF round trip, which
`config.py` owns; the families' own rules (MoE, multi-head latent attention, DeepSeek's routing) grow here. How the
positions are read and judged at a length (PaddleNLP's RoPE keys, a sliding window) is `position_checks`'s. `cfg`
here is a `models.config.ModelConfig`, not annotated: config.py imports this module, so naming the class would be a
circle (tests/unit/test_layers.py counts every import, a TYPE_CHECKING one too)."""
from __future__ import annotations

import difflib
import json
import math

from pretrain_cli.errors import UserError
from pretrain_cli.models.families import MODEL_TYPES as SUPPORTED_MODEL_TYPES
from pretrain_cli.models.families import family

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "yarn")
# names of one key: any of them in config.json means the key is there
SAME_KEY = (("num_experts", "n_routed_experts", "num_local_experts"), ("num_nextn_predict_layers", "num_mtp_layers"),
            ("torch_dtype", "dtype"))


# every key transformers' PretrainedConfig itself defines, in transformers 4 (its __init__: the generation settings
# it kept, the tokenizer's ids) and 5 (`PretrainedConfig().to_dict()`), and the special-token ids model configs add:
# a config.json of any model may carry them, and none is a typo of a key a family reads (`sep_token_id` is no
# misspelt `pad_token_id`). tests/unit/test_config_json_keys.py checks the list against the installed transformers.
PRETRAINED_CONFIG_KEYS = frozenset((
    "_name_or_path", "_commit_hash", "_attn_implementation_autoset", "transformers_version", "model_type",
    "architectures", "return_dict", "output_hidden_states", "output_attentions", "torchscript", "torch_dtype", "dtype",
    "use_bfloat16", "tf_legacy_loss", "pruned_heads", "tie_word_embeddings", "chunk_size_feed_forward",
    "is_encoder_decoder", "is_decoder", "cross_attention_hidden_size", "add_cross_attention", "tie_encoder_decoder",
    "finetuning_task", "id2label", "label2id", "num_labels", "tokenizer_class", "prefix", "task_specific_params",
    "problem_type", "gradient_checkpointing", "use_cache",
    "bos_token_id", "eos_token_id", "pad_token_id", "sep_token_id", "cls_token_id", "mask_token_id", "unk_token_id",
    "eos_token_ids", "decoder_start_token_id", "forced_bos_token_id", "forced_eos_token_id",
    # the generation settings transformers 4 kept on the config and transformers 5 takes off it on load
    "max_length", "min_length", "do_sample", "early_stopping", "num_beams", "num_beam_groups", "diversity_penalty",
    "temperature", "top_k", "top_p", "typical_p", "repetition_penalty", "encoder_repetition_penalty", "length_penalty",
    "no_repeat_ngram_size", "encoder_no_repeat_ngram_size", "bad_words_ids", "num_return_sequences", "output_scores",
    "return_dict_in_generate", "remove_invalid_values", "exponential_decay_length_penalty", "suppress_tokens",
    "begin_suppress_tokens", "epsilon_cutoff", "eta_cutoff", "num_assistant_tokens", "num_assistant_tokens_schedule",
    "assistant_confidence_threshold", "assistant_lookbehind", "target_lookbehind"))
# PaddleNLP's own RoPE keys (its LlamaConfig's), which config.json files PaddleNLP saved may carry for any model:
# `rope_scaling_factor` is no misspelt `routed_scaling_factor`, DeepSeek-V3's `num_nextn_predict_lambda` (the MTP
# loss's weight, `config.moe.mtp_weight`) no misspelt `num_nextn_predict_layers`
PADDLENLP_CONFIG_KEYS = frozenset(("rope_scaling_factor", "rope_scaling_type", "num_nextn_predict_lambda"))


def misspelt_key(d: dict, model_type: str, read: frozenset, source: str = "config.json") -> None:
    """A key the family does not read that is a near miss of one it reads and `d` leaves out: a typo, which would
    leave that key to transformers' default (`num_expert` gave Qwen3-MoE's 128 experts, not the file's 16). HF's
    config.json files carry many keys not read here (transformers_version, attention_dropout, DeepSeek's
    scoring_func ...): only the near misses of a key left out are refused, and never a key transformers' or
    PaddleNLP's base configs define (`PRETRAINED_CONFIG_KEYS`, `PADDLENLP_CONFIG_KEYS`)."""
    present = set(d) | {name for names in SAME_KEY if set(names) & set(d) for name in names}
    missing = sorted(read - present)
    known = read | PRETRAINED_CONFIG_KEYS | PADDLENLP_CONFIG_KEYS
    for key in d:
        near = difflib.get_close_matches(key, missing, n=1, cutoff=0.8) if key not in known else []
        if near:
            name = next((names[0] for names in SAME_KEY if near[0] in names), near[0])  # the default's name
            default = dict(family(model_type).defaults).get(name)
            fallback = "a default" if default is None else f"transformers' default ({json.dumps(default)})"
            raise UserError(f"{source}: {key} is not a key {model_type} reads; did you mean {near[0]}? (config.json "
                            f"has no {near[0]}, so {fallback} would be used): rename {key} to {near[0]}")


# quantization_config's methods whose weights are read: DeepSeek-V3's block FP8 (`storage.fp8`, dequantized on load)
READ_QUANTIZATION = ("fp8",)


def quantized(quantization_config, source: str) -> None:
    """Pretrained weights quantized by GPTQ, AWQ, bitsandbytes ... are packed integers with scales (`qweight`,
    `qzeros`), not the fp tensors a model here is built from: refused in one line, before any tensor is read."""
    if not isinstance(quantization_config, dict):
        return
    method = quantization_config.get("quant_method")
    if method in READ_QUANTIZATION:
        return
    raise UserError(f"{source}: quantization_config (quant_method {method!r}) says the weights are quantized "
                    f"(packed integers with scales, not plain fp tensors), which is not read here; use the "
                    f"unquantized model (the one it was quantized from, in bf16 or fp32 safetensors)")


def validate(cfg, source: str = "config.json", pretrained: bool = False) -> None:
    """One-line UserErrors for architectures the model code cannot build (`pretrained`: weights are read, so no
    line advises another architecture for them)."""
    if cfg.model_type not in SUPPORTED_MODEL_TYPES:
        raise UserError(f"{source}: model_type {cfg.model_type!r} is not supported; "
                        f"use one of {', '.join(SUPPORTED_MODEL_TYPES)}")
    for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                 "num_attention_heads", "num_key_value_heads", "max_position_embeddings"):
        v = getattr(cfg, name)
        if not isinstance(v, int) or v <= 0:
            raise UserError(f"{source}: {name} must be a positive integer, got {v!r}")
    if cfg.num_attention_heads % cfg.num_key_value_heads:
        raise UserError(f"{source}: num_attention_heads ({cfg.num_attention_heads}) is not divisible by "
                        f"num_key_value_heads ({cfg.num_key_value_heads}); pick kv heads that divide it")
    if cfg.mla:
        _validate_mla(cfg, source)
    derived = cfg.hidden_size // cfg.num_attention_heads
    if not cfg.mla and cfg.hidden_size % cfg.num_attention_heads and cfg.head_dim == derived:
        raise UserError(f"{source}: hidden_size ({cfg.hidden_size}) is not divisible by "
                        f"num_attention_heads ({cfg.num_attention_heads}); change one or set head_dim")
    if not isinstance(cfg.head_dim, int) or cfg.head_dim <= 0:
        raise UserError(f"{source}: head_dim must be a positive integer, got {cfg.head_dim!r}")
    if cfg.head_dim % 2:
        raise UserError(f"{source}: head_dim ({cfg.head_dim}) must be even for RoPE")
    layers = cfg.num_hidden_layers + cfg.num_nextn_predict_layers
    if family(cfg.model_type).moe and not (cfg.mla and cfg.first_k_dense_replace >= layers):
        _validate_moe(cfg, source, pretrained)  # (a DeepSeek config whose layers are all dense needs no MoE keys)
        if cfg.mla:
            _validate_deepseek_moe(cfg, source)
    if cfg.hidden_act != "silu" and pretrained:
        raise UserError(f"{source}: hidden_act {cfg.hidden_act!r} is not supported for this pretrained model: its MLP "
                        f"was trained with {cfg.hidden_act}, and the MLP here is SwiGLU (silu) only; use a model "
                        f"whose hidden_act is \"silu\"")
    if cfg.hidden_act != "silu":
        raise UserError(f"{source}: hidden_act {cfg.hidden_act!r} is not supported; use \"silu\"")
    if cfg.rope_scaling is not None:
        rt = cfg.rope_scaling.get("rope_type")
        if rt not in SUPPORTED_ROPE_TYPES:
            raise UserError(f"{source}: rope_scaling.rope_type {rt!r} is not supported; "
                            f"use one of {', '.join(SUPPORTED_ROPE_TYPES)}")
        need = {"linear": ("factor",),
                "llama3": ("factor", "low_freq_factor", "high_freq_factor")}.get(rt, ())
        missing = [k for k in need if k not in cfg.rope_scaling]
        if missing:
            raise UserError(f"{source}: rope_scaling ({rt}) is missing {', '.join(missing)}")
        if rt == "yarn" and "factor" not in cfg.rope_scaling \
                and "original_max_position_embeddings" not in cfg.rope_scaling:
            raise UserError(f"{source}: rope_scaling (yarn) needs factor or original_max_position_embeddings")
        if cfg.mla and rt != "default" and cfg.rope_scaling.get("mscale_all_dim") \
                and not isinstance(cfg.rope_scaling.get("factor"), (int, float)):
            # MLA's softmax scale reads it (`rope_scaling.mla_softmax_scale`), in transformers too
            raise UserError(f"{source}: rope_scaling.mscale_all_dim under multi-head latent attention needs a "
                            f"numeric rope_scaling.factor; add factor")

def _validate_mla(cfg, source: str) -> None:
    """The MLA widths must be positive integers (the RoPE part even); `q_lora_rank` may be null (one q_proj)."""
    for name in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim") + (
            ("q_lora_rank",) if cfg.q_lora_rank is not None else ()):
        v = getattr(cfg, name)
        if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
            raise UserError(f"{source}: {name} must be a positive integer, got {v!r}")
    n = cfg.num_nextn_predict_layers
    if not isinstance(n, int) or isinstance(n, bool) or n < 0 or (n and cfg.model_type != "deepseek_v3"):
        raise UserError(f"{source}: num_nextn_predict_layers must be a non-negative integer (DeepSeek-V3 only), "
                        f"got {n!r}")
    if cfg.num_key_value_heads != cfg.num_attention_heads:
        raise UserError(f"{source}: num_key_value_heads ({cfg.num_key_value_heads}) must equal "
                        f"num_attention_heads ({cfg.num_attention_heads}) under multi-head latent attention "
                        f"(every head expands its own keys from the latent); set them equal")


def _validate_deepseek_moe(cfg, source: str) -> None:
    """The family's routing method (V3's `noaux_tc`, V2's two); group-limited routing needs whole groups of
    experts and enough experts in the kept groups."""
    methods = ("noaux_tc",) if cfg.model_type == "deepseek_v3" else ("greedy", "group_limited_greedy")
    if cfg.topk_method not in methods:  # transformers' V3 router ignores the key, its V2 router has 2 methods
        raise UserError(f"{source}: topk_method {cfg.topk_method!r} is not supported for {cfg.model_type}; "
                        f"use {' or '.join(methods)}")
    if cfg.topk_method == "greedy":
        return
    groups, kept = cfg.n_group, cfg.topk_group
    if not isinstance(groups, int) or not isinstance(kept, int) or groups <= 0 or not 0 < kept <= groups \
            or cfg.num_experts % groups:
        raise UserError(f"{source}: n_group ({groups!r}{_unset(cfg, 'n_group')}) must divide the "
                        f"{cfg.num_experts} routed experts and topk_group ({kept!r}{_unset(cfg, 'topk_group')}) "
                        f"lie in 1..n_group; {_set_them(cfg)} (n_group 1, topk_group 1: no group limit)"
                        + (" or use topk_method greedy" if "greedy" in methods else ""))
    if cfg.num_experts_per_tok > kept * (cfg.num_experts // groups):
        raise UserError(f"{source}: num_experts_per_tok ({cfg.num_experts_per_tok}) exceeds the experts of the "
                        f"{kept} kept groups; raise topk_group")


def _unset(cfg, key: str) -> str:
    """Why a routing number the user never wrote is in the refusal: transformers' default for a key config.json
    leaves out (`ModelConfig.defaulted`), which a small model's experts rarely fit."""
    return f": transformers' {cfg.model_type} default, as config.json does not set {key}" if key in cfg.defaulted \
        else ""


def _set_them(cfg) -> str:
    """The fix names the keys to write, the defaulted ones first (setting them is what the file lacks)."""
    left = [k for k in ("n_group", "topk_group") if k in cfg.defaulted]
    return f"set {' and '.join(left)} in config.json" if left else "fix them"


def _validate_moe(cfg, source: str, pretrained: bool) -> None:
    for name in ("num_experts", "num_experts_per_tok", "moe_intermediate_size", "decoder_sparse_step"):
        v = getattr(cfg, name)
        if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
            raise UserError(f"{source}: {name} must be a positive integer, got {v!r}")
    if cfg.num_experts_per_tok > cfg.num_experts:
        raise UserError(f"{source}: num_experts_per_tok ({cfg.num_experts_per_tok}) exceeds num_experts "
                        f"({cfg.num_experts}); route each token to at most num_experts experts")
    v = cfg.shared_expert_intermediate_size
    if family(cfg.model_type).shared_expert and (not isinstance(v, int) or v <= 0):
        raise UserError(f"{source}: shared_expert_intermediate_size must be a positive integer, got {v!r}")
    if not isinstance(cfg.mlp_only_layers, list) or any(
            not isinstance(i, int) or isinstance(i, bool) for i in cfg.mlp_only_layers):
        raise UserError(f"{source}: mlp_only_layers must be a list of layer indices, got "
                        f"{cfg.mlp_only_layers!r}")
    last = cfg.num_hidden_layers - 1
    outside = [i for i in cfg.mlp_only_layers if not 0 <= i <= last]
    if outside and not pretrained:  # (transformers ignores it too: weights trained so are read as they are)
        raise UserError(f"{source}: mlp_only_layers names layer {outside[0]}, which a model of num_hidden_layers "
                        f"{cfg.num_hidden_layers} does not have (transformers ignores it); name layers 0-{last}")
    if not isinstance(cfg.norm_topk_prob, bool):  # a string is truthy: "false" renormalised as true would
        raise UserError(f"{source}: norm_topk_prob must be true or false, got {json.dumps(cfg.norm_topk_prob)}")
    if cfg.mla:  # DeepSeek's balance weight: the hub's key, else PaddleFormers' (`config.moe.aux_coefficient`)
        set_ = {k: cfg.extra[k] for k in ("aux_loss_alpha", "router_aux_loss_coef") if cfg.extra.get(k) is not None}
        for key, value in set_.items():
            _balance_weight(value, key, source)
        if len(set(set_.values())) > 1 and not pretrained:
            raise UserError(f"{source}: aux_loss_alpha ({set_['aux_loss_alpha']}) and router_aux_loss_coef "
                            f"({set_['router_aux_loss_coef']}) both set the balance loss's weight (the hub's and "
                            f"PaddleFormers' name of it); keep one")
    else:
        _balance_weight(cfg.router_aux_loss_coef, "router_aux_loss_coef", source)


def _balance_weight(value, key: str, source: str) -> None:
    """config.json's balance loss weight, checked as the argument file's `router_aux_loss_coef` is: "abc" was a
    traceback when the run took it, -1 (a loss rewarding imbalance) and NaN a weight."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise UserError(f"{source}: {key} must be a finite number >= 0, got {json.dumps(value)}; it is the balance "
                        f"loss's weight: fix it (the published models have 0.001)")


# The one table of the MoE keys of the other families that transformers' class for each family does not read: per
# family, each key's (the values that change nothing, or None: none refused; what the family has instead).
# `other_families_keys` takes them out of the fields into `ModelConfig.extra` and `ModelConfig.to_hf_dict` writes
# them back as they were (never the field of that name), so the model built, counted, checkpointed and exported is
# the one transformers' class reads from the same file.
_SPARSE = "its layers from first_k_dense_replace on are all sparse: remove it and set first_k_dense_replace"
_DEEPSEEK_INSTEAD = {
    "decoder_sparse_step": ((None, 1), _SPARSE), "mlp_only_layers": ((None, []), _SPARSE),
    "moe_layer_freq": ((None, 1), _SPARSE),  # DeepSeek's own code's and PaddleFormers', not transformers' class's
    "shared_expert_intermediate_size": ((None, 0), "its shared experts are n_shared_experts of moe_intermediate_size "
                                                   "each: remove it and set n_shared_experts"),
    "router_aux_loss_coef": (None, ""),  # PaddleFormers' name of its balance weight: read, never refused
}
_NO_SHARED = ("qwen3_moe has no shared expert, in transformers' Qwen3MoeForCausalLM as here: remove it, or use "
              "model_type qwen2_moe (one gated shared expert of shared_expert_intermediate_size)")
_TOP_K = "its router keeps the top num_experts_per_tok of a softmax over every expert"


def _qwen_instead(shared: str) -> dict:
    """DeepSeek's MoE keys in a Qwen2-/Qwen3-MoE file: transformers' Qwen classes read none of them."""
    return {
        "first_k_dense_replace": ((None, 0), "its dense layers are the ones mlp_only_layers names (or "
                                             "decoder_sparse_step skips): remove it and list them in mlp_only_layers"),
        "n_shared_experts": ((None, 0), shared),
        "topk_method": ((None, "greedy"), f"{_TOP_K} (DeepSeek's greedy): remove it; the argument file's "
                                          f"moe_router_bias_update_rate turns a balancing bias on"),
        "n_group": ((None, 1), f"{_TOP_K}, in no groups: remove it"),
        "topk_group": ((None, 1), f"{_TOP_K}, in no groups: remove it"),
        "routed_scaling_factor": ((None, 1), "its combine weights are the router's probabilities, unscaled "
                                             "(norm_topk_prob renormalises them): remove it"),
    }


OTHER_FAMILIES_KEYS = {
    "qwen3_moe": {"shared_expert_intermediate_size": ((None, 0), _NO_SHARED), **_qwen_instead(_NO_SHARED)},
    "qwen2_moe": _qwen_instead("its shared expert is one gated expert of shared_expert_intermediate_size: remove "
                               "it and set that width"),
    "deepseek_v2": _DEEPSEEK_INSTEAD,
    "deepseek_v3": _DEEPSEEK_INSTEAD,
}


def other_families_keys(d: dict, model_type: str, source: str, pretrained: bool) -> dict:
    """Takes out of `d` (for `ModelConfig.extra`) the MoE keys of `OTHER_FAMILIES_KEYS`, which shaped the model
    here (a DeepSeek `decoder_sparse_step` made other layers sparse than the export's transformers class does, a
    Qwen3-MoE `shared_expert_intermediate_size` made check count a shared expert never built, a Qwen file's
    `first_k_dense_replace` made its first layers dense) where transformers ignores them. A new model's file setting
    one to a value that would change something is refused, naming the family's own key; pretrained weights'
    config.json is read as transformers reads it (and so is every checkpoint's and final directory's: their
    config.json describes weights, and holds the keys a run from pretrained weights was given)."""
    taken = {key: d.pop(key) for key in OTHER_FAMILIES_KEYS.get(model_type, {}) if key in d}
    for key, (inert, instead) in OTHER_FAMILIES_KEYS.get(model_type, {}).items():
        if key in taken and not pretrained and inert is not None and taken[key] not in inert:
            raise UserError(f"{source}: {key} is not a key {model_type} reads ({instead})")
    return taken
