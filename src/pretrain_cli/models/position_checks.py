"""How a model's positions are read and judged at a length: PaddleNLP's own RoPE keys (`rope_scaling_type`,
`rope_scaling_factor`, `alibi`) read as what PaddleNLP builds, a sliding window of pretrained weights, and the one
judgement of `length`-token sequences that `train`, `eval` and `generate` share (`length_notes`). Apart from
`config_checks`, whose checks of config.json's keys need no length; these are asked again by each command once it
knows its length. `cfg` here is a `models.config.ModelConfig` (not imported: config.py imports this module)."""
from __future__ import annotations

import json

from pretrain_cli.errors import UserError
from pretrain_cli.models.config_checks import SUPPORTED_ROPE_TYPES

# PaddleNLP's rope_scaling_type -> the transformers rope_type that rotates as it does (`rope_scaling.rope_inv_freq`)
PADDLENLP_ROPE_TYPES = {"linear": "linear"}


def paddlenlp_rope(d: dict, source: str = "config.json") -> None:
    """PaddleNLP's own position keys, which transformers ignores, read as what PaddleNLP builds (in place; its
    LlamaAttention._init_rope): an HF `rope_scaling` of rope_type llama3 first, whatever `rope_scaling_type` says;
    else `rope_scaling_type` linear + `rope_scaling_factor` become the HF `rope_scaling` the model honours, so a
    config.json PaddleNLP trained with linear scaling is not trained here unscaled; dynamic_ntk is plain RoPE up to
    max_position_embeddings, kept for `paddlenlp_rope_note` to judge at the run's length; ntk (no RoPE here computes
    its base unasked) and `alibi: true` (PaddleNLP's ALiBi bias on the attention scores) are refused in one line, as
    is a `rope_scaling` that is not an object (both readers take its keys)."""
    if d.get("alibi"):
        raise UserError(f"{source}: alibi: true (PaddleNLP's ALiBi bias added to the attention scores) is not built "
                        f"here, where positions are rotated by RoPE alone; remove alibi (or set it false) to train "
                        f"without the bias, or use a model that was not trained with it")
    for key in ("rope_scaling", "rope_parameters"):
        if d.get(key) is not None and not isinstance(d[key], dict):
            raise UserError(f"{source}: {key} must be an object such as {{\"rope_type\": \"linear\", \"factor\": "
                            f"2.0}}, got {json.dumps(d[key])}; write it so, or remove it for plain RoPE")
    kind = d.get("rope_scaling_type")
    if kind in (None, ""):  # (PaddleNLP ignores the factor then, as transformers and this reader do)
        return
    hf = d.get("rope_scaling") or {k: v for k, v in (d.get("rope_parameters") or {}).items() if k != "rope_theta"}
    if hf.get("rope_type") == "llama3":  # PaddleNLP's _init_rope tests it first (`paddlenlp_rope_note` says so)
        return
    factor = d.get("rope_scaling_factor", 1.0)  # PaddleNLP's LlamaConfig default
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not factor > 0:
        raise UserError(f"{source}: rope_scaling_factor must be a positive number, got {factor!r}")
    if kind == "ntk" and d.get("hidden_size") and d.get("num_attention_heads"):
        dim = d.get("head_dim") or d["hidden_size"] // d["num_attention_heads"]
        theta = float(d.get("rope_theta") or 10000.0) * factor ** (dim / (dim - 2))  # PaddleNLP's NTK base
        raise UserError(f"{source}: rope_scaling_type ntk is not built here; its rotation is the default RoPE's "
                        f"with rope_theta {theta:.10g} (rope_theta x rope_scaling_factor^(head_dim/(head_dim-2))): "
                        f"set rope_theta to it and remove rope_scaling_type")
    if kind != "dynamic_ntk" and kind not in PADDLENLP_ROPE_TYPES:
        raise UserError(f"{source}: rope_scaling_type {kind!r} is not one PaddleNLP's LlamaConfig builds (linear, ntk, "
                        f"dynamic_ntk); use rope_scaling_type linear or an HF rope_scaling of type "
                        f"{', '.join(SUPPORTED_ROPE_TYPES[1:])}, or remove it for plain RoPE")
    hf_type = hf.get("rope_type", hf.get("type", "default"))
    mapped = {"rope_type": PADDLENLP_ROPE_TYPES.get(kind, "default"), "factor": float(factor)}
    if hf_type in (None, "default"):
        if kind in PADDLENLP_ROPE_TYPES:
            d["rope_scaling"] = mapped
    elif hf_type != mapped["rope_type"] or hf.get("factor") != mapped["factor"]:
        raise UserError(f"{source}: rope_scaling_type {kind} (rope_scaling_factor {factor}) and rope_scaling "
                        f"{json.dumps(hf)} disagree (PaddleNLP rotates by the first, transformers by the second); "
                        f"keep the one the weights were trained with and remove the other")


def paddlenlp_rope_note(cfg, source: str, length: int, key: str,
                        pretrained: bool = True) -> str | None:
    """What PaddleNLP's `rope_scaling_type` (kept in `cfg.extra` by `paddlenlp_rope`) means at `length` tokens,
    said: beside an HF llama3 rope_scaling it is ignored, as PaddleNLP's _init_rope ignores it; dynamic_ntk rotates
    as plain RoPE up to max_position_embeddings (LlamaDynamicNTKScalingRotaryEmbedding rescales only past it), which
    a model without weights raises to `length` (as PaddleNLP's run_pretrain and `train` raise a new model's); past
    it, pretrained weights are refused, naming `key` (what sets the length)."""
    kind = cfg.extra.get("rope_scaling_type")
    if kind in (None, ""):
        return None
    said = f"{source}: rope_scaling_type {kind}"
    if (cfg.rope_scaling or {}).get("rope_type") == "llama3":
        return (f"{said} is ignored beside rope_scaling of rope_type llama3, as PaddleNLP's LlamaAttention ignores it "
                f"(its _init_rope takes llama3 first): positions rotate by llama3 scaling, as in transformers")
    if kind != "dynamic_ntk":
        return None
    limit = cfg.max_position_embeddings
    if length <= limit or not pretrained:
        raised = "" if length <= limit else (f", raised to {length} for a model without weights (as `train` and "
                                             f"PaddleNLP's run_pretrain raise a new model's)")
        return (f"{said}: PaddleNLP's dynamic NTK rotates as plain RoPE at lengths up to max_position_embeddings "
                f"{limit}{raised}, and sequences of {length} tokens stay within it, so plain RoPE, which runs here, is "
                f"the same model (config.json keeps the key)")
    raise UserError(f"{said}: sequences of {length} tokens reach past max_position_embeddings {limit}, where "
                    f"PaddleNLP's dynamic NTK grows the rotation's base with the length, which no RoPE here does; "
                    f"lower {key} to at most {limit}, or remove rope_scaling_type for plain RoPE at every length")


def length_notes(cfg, source: str, length: int, key: str, pretrained: bool) -> list[str]:
    """The one judgement of `length`-token sequences (`key` sets the length) that `train`, `eval` and `generate` share:
    pretrained weights' sliding window (`window_note`), then PaddleNLP's rope_scaling_type (`paddlenlp_rope_note`);
    a model without weights is the one `train` builds for `length`. Notes where nothing changes, else a UserError."""
    notes = [window_note(cfg, source, length, key)] if pretrained else []
    return [n for n in (*notes, paddlenlp_rope_note(cfg, source, length, key, pretrained)) if n]


def _window_layers(d: dict) -> tuple[int | None, list[int]]:
    """(window, the layers that have it) of a config.json with `use_sliding_window: true`, as transformers 5's
    configuration classes read it: Qwen2/Qwen3 from layer `max_window_layers` on (or the layers `layer_types` names
    sliding_attention), Qwen2-MoE the even layers below it, Qwen3-MoE every layer; its other families (Llama,
    DeepSeek) have none. A layer with the window masks a key `window` or more positions before its query
    (masking_utils.sliding_window_overlay: kv_idx > q_idx - window), so sequences of up to `window` tokens are
    never masked by it."""
    window, model_type = d.get("sliding_window", 4096), d.get("model_type")
    n, types, first = d.get("num_hidden_layers"), d.get("layer_types"), d.get("max_window_layers", 28)
    if not isinstance(window, int) or not isinstance(n, int) or not isinstance(first, int):
        return None, []
    if model_type in ("qwen2", "qwen3", "qwen2_moe") and isinstance(types, list):
        return window, [i for i, t in enumerate(types) if t == "sliding_attention"]
    layers = {"qwen2": [i for i in range(n) if i >= first], "qwen3": [i for i in range(n) if i >= first],
              "qwen2_moe": [i for i in range(n) if (i + 1) % 2 and i < first], "qwen3_moe": list(range(n))}
    return window, layers.get(model_type, [])


def sliding_window(d: dict, source: str, pretrained: bool, length: int | None,
                   key: str = "max_seq_length") -> str | None:
    """`use_sliding_window: true`: attention here reaches every earlier token. A new model is refused (it is built
    without the window). Pretrained weights keep the architecture they were trained with, so they run where that
    is provably the same model, with the note returned: no layer has a window as transformers reads the file, or
    the run's sequences (`length` tokens; None: judged later, by `window_note`) never reach it. Past the window
    it is another model: refused, naming `key`, what sets the length, to lower. The window's keys stay in
    config.json (`ModelConfig.extra`), so a model saved from these weights keeps them."""
    if not d.get("use_sliding_window"):
        return None
    if not pretrained:
        raise UserError(f"{source}: use_sliding_window=true is not supported; set it to false")
    said = f"{source}: use_sliding_window: true"
    window, layers = _window_layers(d)
    if window is None or not layers:
        return (f"{said}, but as transformers reads this config.json no layer has a window: the model is the "
                f"same with full attention, which runs here")
    span = f"{layers[0]}-{layers[-1]}" if layers == list(range(layers[0], layers[-1] + 1)) and len(layers) > 1 \
        else ", ".join(map(str, layers))
    where = f"layer{'s' * (len(layers) > 1)} {span} of {d.get('num_hidden_layers')} attend to the last {window} tokens"
    if length is None:
        return None
    if length <= window:
        return (f"{said}: {where}, and sequences of {length} tokens never reach that window (transformers "
                f"masks only keys {window} or more positions back), so full attention, which runs here, is the "
                f"same model (config.json keeps the window)")
    raise UserError(f"{said}: {where}, and sequences of {length} tokens reach past that window, where attention "
                    f"here (every earlier token) is another model than the one its weights were trained as; lower "
                    f"{key} to at most {window}")


def window_note(cfg, source: str, length: int, key: str) -> str | None:
    """`sliding_window`'s verdict on pretrained weights already read into `cfg` (the window's keys are in its
    `extra`), at `length`: for a command that knows its length only once the model's config is read."""
    return sliding_window({**cfg.extra, "model_type": cfg.model_type, "num_hidden_layers": cfg.num_hidden_layers},
                          source, True, length, key)
