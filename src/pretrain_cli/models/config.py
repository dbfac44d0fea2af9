"""Architecture-only model configuration, read from and written to an HF `config.json`.

Field names are HF's so a `config.json` round-trips without a mapping table, and
kernel/parallel flags never land here (see `pretrain_cli.run_config`). No Paddle import:
`check`, `plan` and `flops` use this module without paying for one.
"""
from __future__ import annotations

import functools
import os
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from pretrain_cli.errors import UserError
from pretrain_cli.json_mistakes import loads
from pretrain_cli.models import config_checks, position_checks
from pretrain_cli.models.families import MODEL_TYPES as SUPPORTED_MODEL_TYPES
from pretrain_cli.models.families import family

# the Mixture-of-Experts keys, written to config.json only for the MoE families
MOE_KEYS = ("num_experts", "num_experts_per_tok", "moe_intermediate_size", "shared_expert_intermediate_size",
            "norm_topk_prob", "decoder_sparse_step", "mlp_only_layers", "router_aux_loss_coef",
            "output_router_logits")
# DeepSeek's MoE keys (`models.deepseek_moe`), written only for deepseek_v2/v3 (which keys of another family a
# family does not read: `config_checks.OTHER_FAMILIES_KEYS`, the one table of them)
DEEPSEEK_MOE_KEYS = ("n_shared_experts", "first_k_dense_replace", "n_group", "topk_group", "routed_scaling_factor",
                     "topk_method")
# what `from_dict` takes from a config.json and keeps out of `extra`: qk_head_dim, transformers derives it under
# MLA (and writes it); quantization_config, FP8 weights are dequantized on load (`training.weight_source`, block by
# block), so what this config describes is never FP8
DERIVED_KEYS = ("dtype", "architectures", "qk_head_dim", "quantization_config")


@dataclass
class ModelConfig:
    """A decoder-only Llama/Qwen2/Qwen3, Qwen2-MoE/Qwen3-MoE or DeepSeek-V2/V3 architecture; `head_dim` defaults to
    hidden / heads (DeepSeek's is `qk_rope_head_dim`, as transformers sets it: the width RoPE rotates)."""

    model_type: str = "llama"
    vocab_size: int = 32000
    hidden_size: int = 4096
    intermediate_size: int = 11008
    num_hidden_layers: int = 32
    num_attention_heads: int = 32
    num_key_value_heads: int | None = None
    head_dim: int | None = None
    max_position_embeddings: int = 2048
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None
    initializer_range: float = 0.02
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # llama, qwen3: bias on q/k/v/o; qwen2 always has q/k/v bias
    mlp_bias: bool = False
    hidden_act: str = "silu"
    bos_token_id: int | None = None
    eos_token_id: int | list | None = None
    pad_token_id: int | None = None
    torch_dtype: str = "float32"
    # ---- Mixture-of-Experts (families with `moe`: qwen3_moe, qwen2_moe); HF's key names and meanings.
    # A layer is sparse when `is_sparse_layer(idx)`: not in `mlp_only_layers` and (idx + 1) % decoder_sparse_step
    # == 0 (transformers' Qwen2MoeDecoderLayer / Qwen3MoeDecoderLayer); a dense layer's MLP is `intermediate_size`.
    num_experts: int = 0  # routed experts per sparse layer; 0 on dense families
    num_experts_per_tok: int = 0  # top-k
    moe_intermediate_size: int = 0  # each routed expert's SwiGLU width
    shared_expert_intermediate_size: int = 0  # Qwen2-MoE's always-on expert (0: none)
    norm_topk_prob: bool = False  # renormalise the top-k probabilities to sum to 1
    decoder_sparse_step: int = 1
    mlp_only_layers: list = field(default_factory=list)
    router_aux_loss_coef: float = 0.001  # HF adds coef * load_balancing_loss only when output_router_logits
    output_router_logits: bool = False
    # ---- DeepSeek-V2/V3's MoE (`models.deepseek_moe`): `num_experts` is their `n_routed_experts`; layers from
    # `first_k_dense_replace` on are sparse; `n_shared_experts` always-on experts of `moe_intermediate_size` each
    n_shared_experts: int = 0
    first_k_dense_replace: int = 0
    n_group: int | None = None  # experts are ranked within `n_group` groups, only `topk_group` groups kept
    topk_group: int | None = None
    routed_scaling_factor: float = 1.0  # the combine weights are multiplied by it
    topk_method: str | None = None  # DeepSeek-V2: "greedy" or "group_limited_greedy"; V3 is "noaux_tc"
    # multi-head latent attention (DeepSeek-V2/V3; `families.Family.attention == "mla"`): None elsewhere
    q_lora_rank: int | None = None  # None: one q_proj (DeepSeek-V2-Lite); else q_a_proj → q_a_layernorm → q_b_proj
    kv_lora_rank: int | None = None
    qk_nope_head_dim: int | None = None
    qk_rope_head_dim: int | None = None
    v_head_dim: int | None = None
    rope_interleave: bool | None = None  # DeepSeek's RoPE pairs adjacent dims (V2 always; V3 unless false)
    num_nextn_predict_layers: int = 0  # DeepSeek-V3's multi-token prediction modules (`models.mtp`); 1 if absent
    extra: dict = field(default_factory=dict, repr=False, compare=False)  # unknown HF keys, kept for round-trips
    # the model directory's generation_config.json (sampling defaults, an eos list), kept for the directories a run
    # writes; its token ids follow the fields above (`write_generation`)
    generation: dict = field(default_factory=dict, repr=False, compare=False)
    # the `Family.defaults` keys config.json left out, which took transformers' value (check's experts line names them)
    defaulted: tuple = field(default=(), repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.num_key_value_heads is None:
            self.num_key_value_heads = self.num_attention_heads
        if self.mla:
            self._mla_defaults()
            self.head_dim = self.qk_rope_head_dim
        if self.head_dim is None and self.num_attention_heads:
            self.head_dim = self.hidden_size // self.num_attention_heads

    @property
    def mla(self) -> bool:
        """Whether attention is multi-head latent attention (the family says so)."""
        return self.model_type in SUPPORTED_MODEL_TYPES and family(self.model_type).attention == "mla"

    def _mla_defaults(self) -> None:
        """transformers' defaults for the MLA keys a config.json leaves out (DeepseekV2Config / DeepseekV3Config)."""
        for name, default in (("kv_lora_rank", 512), ("qk_nope_head_dim", 128), ("qk_rope_head_dim", 64),
                              ("v_head_dim", 128)):
            if getattr(self, name) is None:
                setattr(self, name, default)
        if self.rope_interleave is None:
            self.rope_interleave = True

    @property
    def qk_head_dim(self) -> int:
        """Width of one query/key head: `qk_nope_head_dim + qk_rope_head_dim` under MLA, else `head_dim`."""
        return self.qk_nope_head_dim + self.qk_rope_head_dim if self.mla else self.head_dim

    # ------------------------------------------------------------------ HF dict I/O
    @classmethod
    def from_dict(cls, d: dict[str, Any], source: str = "config.json", pretrained: bool = False) -> "ModelConfig":
        """Accept both transformers 4 (`rope_theta`/`rope_scaling`) and 5 (`rope_parameters`). `pretrained`: the
        directory's weights are read (continue_training, eval, generate), so a refusal never advises changing the
        architecture they were trained with; a sliding window they were trained with is judged by the command that
        knows its length and the key setting it (`position_checks.window_note`)."""
        d = dict(d)
        model_type = d.get("model_type")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise UserError(
                f"{source}: model_type {model_type!r} is not supported; "
                f"use one of {', '.join(SUPPORTED_MODEL_TYPES)}"
            )
        position_checks.paddlenlp_rope(d, source)  # (PaddleNLP's rope_scaling_type and alibi, before rope_scaling)
        rope_params = d.pop("rope_parameters", None) or {}
        if "rope_theta" in rope_params:  # transformers 5 gives rope_parameters precedence
            d["rope_theta"] = rope_params["rope_theta"]
        scaling = d.get("rope_scaling") or None
        if scaling is None and rope_params.get("rope_type", "default") != "default":
            scaling = {k: v for k, v in rope_params.items() if k != "rope_theta"}
        if scaling is not None:
            scaling = dict(scaling)
            scaling.setdefault("rope_type", scaling.pop("type", "default"))
            if scaling["rope_type"] == "default":
                scaling = None
        d["rope_scaling"] = scaling
        if "dtype" in d and "torch_dtype" not in d:
            d["torch_dtype"] = d["dtype"]
        position_checks.sliding_window(d, source, pretrained, None)  # (a new model's refusal; the length: window_note)
        if pretrained:
            config_checks.quantized(d.get("quantization_config"), source)
        layer_types = d.get("layer_types")
        windowed = pretrained and d.get("use_sliding_window")  # its layer_types kept, for window_note to judge
        if windowed and layer_types is not None and (not isinstance(layer_types, list) or any(
                t not in ("full_attention", "sliding_attention") for t in layer_types)):
            raise UserError(f"{source}: layer_types {layer_types!r}: only full_attention and sliding_attention layers "
                            f"are built here; these weights were trained with another kind of attention")
        if layer_types is not None and not windowed:
            # transformers 5 (Qwen2/Qwen3): one attention kind per layer
            if not isinstance(layer_types, list) or any(t != "full_attention" for t in layer_types):
                raise UserError(f"{source}: layer_types {layer_types!r}: only full_attention layers are supported "
                                f"(no sliding window); remove layer_types or set every entry to \"full_attention\"")
            del d["layer_types"]  # all full attention, the default (and a layer-count override stays consistent)
        if d.get("head_dim") is None:
            d.pop("head_dim", None)
        config_checks.misspelt_key(d, model_type, read_keys(model_type), source)
        fam = family(model_type)
        unread = config_checks.other_families_keys(d, model_type, source, pretrained)  # (kept in extra)
        if fam.attention == "mla":
            d.pop("head_dim", None)  # transformers derives it (= qk_rope_head_dim); so do we
            d.setdefault("q_lora_rank", 1536)  # transformers' default when the key is absent (null: one q_proj)
            if model_type == "deepseek_v3" and d.get("num_nextn_predict_layers") is None:
                d["num_nextn_predict_layers"] = d.get("num_mtp_layers", 1)  # DeepseekV3Config's default (alias)
            d.pop("num_mtp_layers", None)
            for alias in ("n_routed_experts", "num_local_experts"):  # transformers' names of num_experts
                if d.get(alias) is not None:
                    d["num_experts"] = d[alias]
                d.pop(alias, None)
        if fam.moe and "num_local_experts" in d:  # transformers 5 writes Qwen3-MoE's num_experts under this name
            d.setdefault("num_experts", d["num_local_experts"])
            del d["num_local_experts"]
        defaulted = tuple(key for key, _ in fam.defaults if d.get(key) is None)
        d = fam.with_defaults(d)  # what transformers' config class assumes for a key left out
        if fam.moe and d.get("mlp_only_layers") is None:
            d["mlp_only_layers"] = []
        names = {f.name for f in fields(cls)} - {"extra", "generation", "defaulted"}
        known = {k: v for k, v in d.items() if k in names}
        extra = {**unread, **{k: v for k, v in d.items() if k not in names and k not in DERIVED_KEYS}}
        if d.get("rope_theta") is None:
            known.pop("rope_theta", None)
        try:
            cfg = cls(**known, extra=extra, defaulted=defaulted)
        except TypeError as e:  # pragma: no cover - defensive
            raise UserError(f"{source}: {e}") from None
        cfg.validate(source, pretrained)
        return cfg

    @classmethod
    def from_file(cls, path: str, pretrained: bool = False) -> "ModelConfig":
        """`path` is a `config.json` or a directory holding one (`pretrained`: as `from_dict`'s)."""
        if os.path.isdir(path):
            path = os.path.join(path, "config.json")
        if not os.path.isfile(path):
            raise UserError(f"{path}: not found; pass a directory with an HF config.json or a preset name")
        try:  # (utf-8, not utf-8-sig, as transformers reads it: `explain` names a byte-order mark)
            with open(path, "rb") as f:
                d = loads(f.read(), path, "a model config is one object of keys")
        except OSError as e:
            raise UserError(f"{path}: not a readable JSON model config ({e})") from None
        if not isinstance(d, dict):
            raise UserError(f"{path}: must hold a JSON object")
        cfg = cls.from_dict(d, source=path, pretrained=pretrained)
        cfg.generation = read_generation(os.path.dirname(path))
        return cfg

    def to_hf_dict(self, dtype: str | None = None) -> dict[str, Any]:
        """A `config.json` that `transformers.AutoConfig` reads back to the same architecture."""
        d = asdict(self)
        extra = d.pop("extra")
        d.pop("generation")
        d.pop("defaulted")
        out = {
            "architectures": [family(self.model_type).architecture],
            **{k: v for k, v in extra.items() if k not in ("architectures", "torch_dtype", "dtype")},
            **d,
        }
        out["torch_dtype"] = out["dtype"] = dtype or self.torch_dtype
        if out["rope_scaling"] is None:
            del out["rope_scaling"]
        if self.model_type == "qwen2":  # Qwen2 has fixed biases; these keys mean nothing there
            del out["attention_bias"], out["mlp_bias"]
        if self.model_type in ("qwen3", "qwen3_moe"):  # attention_bias is Qwen3's; its MLP never has a bias
            del out["mlp_bias"]
        if self.model_type == "qwen2_moe":  # q/k/v bias is its `qwen2_moe` key (kept in extra); o/MLP have none
            del out["attention_bias"], out["mlp_bias"]
        if not family(self.model_type).moe:  # a dense config.json stays exactly as before
            for key in MOE_KEYS:
                del out[key]
        if not self.mla:  # the MLA and DeepSeek-MoE keys mean nothing to the other families
            for name in ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
                         "rope_interleave") + DEEPSEEK_MOE_KEYS:
                del out[name]
        else:
            out["n_routed_experts"] = out.pop("num_experts")  # DeepSeek's name (transformers reads both)
        if self.model_type != "deepseek_v3":  # multi-token prediction is DeepSeek-V3's key
            del out["num_nextn_predict_layers"]
        if self.model_type == "deepseek_v2":  # V2's RoPE is always interleaved: no key for it
            del out["rope_interleave"]
        unread = config_checks.OTHER_FAMILIES_KEYS.get(self.model_type, {})  # another family's MoE keys: never the
        for name in unread:  # field of that name (its default), the file's value kept in extra, as it was
            out.pop(name, None)
        out.update({k: v for k, v in extra.items() if k in unread})
        out.setdefault("use_cache", True)
        return out

    # ------------------------------------------------------------------ checks
    def validate(self, source: str = "config.json", pretrained: bool = False) -> None:
        """One-line UserErrors for architectures the model code cannot build (`models.config_checks`)."""
        config_checks.validate(self, source, pretrained)

    def is_sparse_layer(self, idx: int) -> bool:
        """Whether decoder layer `idx` (0-based) holds the MoE block (transformers' rules: Qwen2-/Qwen3-MoE by
        `mlp_only_layers` / `decoder_sparse_step`, DeepSeek from `first_k_dense_replace` on; an MTP module's layer,
        `num_hidden_layers + k`, by the same rule)."""
        return (family(self.model_type).moe and self.num_experts > 0 and idx not in self.mlp_only_layers
                and (idx + 1) % self.decoder_sparse_step == 0 and idx >= self.first_k_dense_replace)

    @property
    def sparse_layers(self) -> list[int]:
        """`is_sparse_layer`'s rule over the decoder layers at once (`plan --fit` asks this of every candidate it
        resolves, tens of thousands on a 94-layer model: one call per layer was most of the search's time; so the
        rule runs once per distinct set of the fields it reads). The decoder layers only, for per-layer and
        per-stage arithmetic; whether the model has experts is `expert_layers`' question."""
        return list(_sparse_layers(self.model_type, self.num_experts, tuple(self.mlp_only_layers),
                                   self.decoder_sparse_step, self.first_k_dense_replace, self.num_hidden_layers))

    @property
    def expert_layers(self) -> list[int]:
        """Every layer that holds experts: `sparse_layers`, then the MTP modules' layers (`num_hidden_layers + k`)
        that `is_sparse_layer` makes sparse, as the model builds them (PaddleNLP's MTP layer is a decoder layer of
        that index; DeepSeek-V3's published layer 61 is sparse). Every "does the model have experts" decision asks
        this: with `first_k_dense_replace == num_hidden_layers` only the MTP layer is sparse, and its experts still
        take the balance loss, the bias update, the tp / ep checks and the MoE refusals."""
        first = self.num_hidden_layers
        mtp = range(first, first + int(self.num_nextn_predict_layers or 0))
        return self.sparse_layers + [i for i in mtp if self.is_sparse_layer(i)]

    @property
    def n_rep(self) -> int:
        """Query heads per KV head (GQA group size)."""
        return self.num_attention_heads // self.num_key_value_heads


@functools.lru_cache(maxsize=None)
def read_keys(model_type: str) -> frozenset:
    """The config.json keys `model_type`'s config is read from: those a config.json of the family is written with
    (`to_hf_dict`, the ones every file gets aside), transformers' other names for them, the keys `from_dict`
    derives or judges (`DERIVED_KEYS`, `layer_types`, `use_sliding_window`) and the window's own keys
    (`sliding_window`, `max_window_layers`: unused while `use_sliding_window` is false, and a file may carry them
    without it). A key outside them that is a near miss of one of them is a typo (`config_checks.misspelt_key`)."""
    written = set(ModelConfig(model_type=model_type).to_hf_dict()) - {"architectures", "torch_dtype", "dtype",
                                                                       "use_cache"}
    return frozenset(written | {"rope_scaling", "rope_parameters", "torch_dtype", "layer_types", "use_sliding_window",
                                "sliding_window", "max_window_layers"}
                     | (set(DERIVED_KEYS) - {"architectures"})  # (a list of class names, no setting of the model)
                     | ({"num_experts", "num_local_experts"} if family(model_type).moe else set())
                     | ({"num_mtp_layers"} if "num_nextn_predict_layers" in written else set())
                     | ({"qkv_bias"} if model_type == "qwen2_moe" else set()))


@functools.lru_cache(maxsize=64)
def _sparse_layers(model_type: str, num_experts: int, mlp_only: tuple, step: int, first_k_dense: int,
                   layers: int) -> tuple[int, ...]:
    if not (family(model_type).moe and num_experts > 0):
        return ()
    return tuple(i for i in range(max(first_k_dense, 0), layers) if (i + 1) % step == 0 and i not in mlp_only)


def past_positions(cfg: ModelConfig, max_seq_length: int, source: str = "max_seq_length",
                   trained: int | None = None) -> str | None:
    """The note for samples longer than `max_position_embeddings` (None when they fit), not a refusal: every family
    here rotates by RoPE, which has no position table to run out of, only angles computed for any position id (as
    transformers' Llama, Qwen2/3 and DeepSeek compute them, and as PaddleNLP trains a pretrained model past its
    range). Every supported rope_scaling fixes its frequencies from config.json alone, whatever the length (no
    dynamic NTK), so the positions past the range are rotated as transformers rotates them; the note says the
    model has not seen those angles, and which scaling they are taken under. `trained`: the length the weights'
    own run trained at (its args.json), which may be past the number its config.json keeps: seen, not noted."""
    from pretrain_cli.models.generation import context_window

    limit = cfg.max_position_embeddings
    seen, _ = context_window(limit, trained)
    if not isinstance(max_seq_length, int) or max_seq_length <= seen:
        return None
    sc, scaling = cfg.rope_scaling or {}, ""
    if sc.get("rope_type", "default") != "default":
        keys = ", ".join(f"{k} {sc[k]}" for k in ("factor", "original_max_position_embeddings") if k in sc)
        scaling = (f", under rope_scaling {sc['rope_type']}{f' ({keys})' if keys else ''} as config.json sets it: "
                   f"its frequencies do not change with the length")
    last = max_seq_length - 1
    span = f"position {seen} takes" if last == seen else f"positions {seen}-{last} take"
    ran = f" and the {seen} tokens its run trained on" if seen > limit else ""
    return (f"{source}: {max_seq_length} is past the model's max_position_embeddings ({limit}){ran}: {span} RoPE "
            f"angles computed as transformers computes them (RoPE has no position table){scaling}, angles a model "
            f"{'pretrained' if seen == limit else 'trained'} to {seen} has not seen")


def read_generation(model_dir) -> dict:
    """A model directory's generation_config.json as a dict ({} when it has none), so a run continuing a model
    (Qwen2.5's, Llama-3-Instruct's: sampling defaults, several EOS ids) writes it on; unreadable: one line."""
    path = os.path.join(model_dir, "generation_config.json")
    if not os.path.isfile(path):
        return {}
    try:
        with open(path, "rb") as f:
            gen = loads(f.read(), path, "fix or remove it", fix="fix or remove the file")
    except OSError as e:
        raise UserError(f"{path}: not a readable JSON object ({e}); fix or remove it") from None
    if not isinstance(gen, dict):
        raise UserError(f"{path}: must hold a JSON object; fix or remove it")
    return gen


def generation_dict(cfg: ModelConfig) -> dict:
    """generation_config.json for `cfg`: the one it was read with, its token ids those of config.json (a
    tokenizer's ids replace a preset's: `orchestration.opened.tokenizer_ids`), except an eos list that holds
    config.json's EOS (Llama-3-Instruct's end-of-turn ids), kept; without one, what transformers derives from
    config.json."""
    gen = dict(cfg.generation) or {"_from_model_config": True}
    eos = gen.get("eos_token_id")
    if not (isinstance(eos, list) and (cfg.eos_token_id in eos or eos == cfg.eos_token_id)):
        eos = cfg.eos_token_id
    gen.update(bos_token_id=cfg.bos_token_id, eos_token_id=eos)
    if cfg.pad_token_id is not None:
        gen["pad_token_id"] = cfg.pad_token_id
    return gen
