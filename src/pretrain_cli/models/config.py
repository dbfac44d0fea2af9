"""Architecture-only model configuration, read from and written to an HF `config.json`.

Field names are HF's so a `config.json` round-trips without a mapping table, and
kernel/parallel flags never land here (see `pretrain_cli.run_config`). No Paddle import:
`check`, `plan` and `flops` use this module without paying for one.
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from pretrain_cli.errors import UserError
from pretrain_cli.models.families import MODEL_TYPES as SUPPORTED_MODEL_TYPES
from pretrain_cli.models.families import family

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "yarn")


@dataclass
class ModelConfig:
    """A decoder-only Llama/Qwen2/Qwen3/DeepSeek architecture; `head_dim` defaults to hidden / heads (DeepSeek's is
    `qk_rope_head_dim`, as transformers sets it: the width RoPE rotates)."""

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
    # multi-head latent attention (DeepSeek-V2/V3; `families.Family.attention == "mla"`): None elsewhere
    q_lora_rank: int | None = None  # None: one q_proj (DeepSeek-V2-Lite); else q_a_proj → q_a_layernorm → q_b_proj
    kv_lora_rank: int | None = None
    qk_nope_head_dim: int | None = None
    qk_rope_head_dim: int | None = None
    v_head_dim: int | None = None
    rope_interleave: bool | None = None  # DeepSeek's RoPE pairs adjacent dims (V2 always; V3 unless false)
    num_nextn_predict_layers: int = 0  # DeepSeek-V3's multi-token prediction modules (`models.mtp`); 1 if absent
    extra: dict = field(default_factory=dict, repr=False, compare=False)  # unknown HF keys, kept for round-trips

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
    def from_dict(cls, d: dict[str, Any], source: str = "config.json") -> "ModelConfig":
        """Accept both transformers 4 (`rope_theta`/`rope_scaling`) and 5 (`rope_parameters`)."""
        d = dict(d)
        model_type = d.get("model_type")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise UserError(
                f"{source}: model_type {model_type!r} is not supported; "
                f"use one of {', '.join(SUPPORTED_MODEL_TYPES)}"
            )
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
        if d.get("use_sliding_window"):
            raise UserError(f"{source}: use_sliding_window=true is not supported; set it to false")
        layer_types = d.get("layer_types")
        if layer_types is not None:  # transformers 5 (Qwen2/Qwen3): one attention kind per layer
            if not isinstance(layer_types, list) or any(t != "full_attention" for t in layer_types):
                raise UserError(f"{source}: layer_types {layer_types!r}: only full_attention layers are supported "
                                f"(no sliding window); remove layer_types or set every entry to \"full_attention\"")
            del d["layer_types"]  # all full attention, the default (and a layer-count override stays consistent)
        if d.get("head_dim") is None:
            d.pop("head_dim", None)
        if family(model_type).attention == "mla":
            d.pop("head_dim", None)  # transformers derives it (= qk_rope_head_dim); so do we
            d.setdefault("q_lora_rank", 1536)  # transformers' default when the key is absent (null: one q_proj)
            if model_type == "deepseek_v3" and d.get("num_nextn_predict_layers") is None:
                d["num_nextn_predict_layers"] = d.get("num_mtp_layers", 1)  # DeepseekV3Config's default (alias)
            d.pop("num_mtp_layers", None)
        names = {f.name for f in fields(cls)} - {"extra"}
        known = {k: v for k, v in d.items() if k in names}
        # qk_head_dim: transformers derives it under MLA; quantization_config: FP8 weights are dequantized on load
        # (`convert.dequantize_fp8`), so what this config describes is never FP8
        derived_keys = ("dtype", "architectures", "qk_head_dim", "quantization_config")
        extra = {k: v for k, v in d.items() if k not in names and k not in derived_keys}
        if d.get("rope_theta") is None:
            known.pop("rope_theta", None)
        try:
            cfg = cls(**known, extra=extra)
        except TypeError as e:  # pragma: no cover - defensive
            raise UserError(f"{source}: {e}") from None
        cfg.validate(source)
        return cfg

    @classmethod
    def from_file(cls, path: str) -> "ModelConfig":
        """`path` is a `config.json` or a directory holding one."""
        if os.path.isdir(path):
            path = os.path.join(path, "config.json")
        if not os.path.isfile(path):
            raise UserError(f"{path}: not found; pass a directory with an HF config.json or a preset name")
        try:
            with open(path, encoding="utf-8") as f:
                d = json.load(f)
        except json.JSONDecodeError as e:
            raise UserError(f"{path}: invalid JSON ({e})") from None
        return cls.from_dict(d, source=path)

    def to_hf_dict(self, dtype: str | None = None) -> dict[str, Any]:
        """A `config.json` that `transformers.AutoConfig` reads back to the same architecture."""
        d = asdict(self)
        extra = d.pop("extra")
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
        if self.model_type == "qwen3":  # attention_bias is Qwen3's; its MLP never has a bias
            del out["mlp_bias"]
        if not self.mla:  # the MLA keys mean nothing to the GQA families
            for name in ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
                         "rope_interleave"):
                del out[name]
        if self.model_type != "deepseek_v3":  # multi-token prediction is DeepSeek-V3's key
            del out["num_nextn_predict_layers"]
        if self.model_type == "deepseek_v2":  # V2's RoPE is always interleaved: no key for it
            del out["rope_interleave"]
        out.setdefault("use_cache", True)
        return out

    # ------------------------------------------------------------------ checks
    def validate(self, source: str = "config.json") -> None:
        """One-line UserErrors for architectures the model code cannot build."""
        if self.model_type not in SUPPORTED_MODEL_TYPES:
            raise UserError(
                f"{source}: model_type {self.model_type!r} is not supported; "
                f"use one of {', '.join(SUPPORTED_MODEL_TYPES)}"
            )
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                     "num_attention_heads", "num_key_value_heads", "max_position_embeddings"):
            v = getattr(self, name)
            if not isinstance(v, int) or v <= 0:
                raise UserError(f"{source}: {name} must be a positive integer, got {v!r}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise UserError(
                f"{source}: num_attention_heads ({self.num_attention_heads}) is not divisible by "
                f"num_key_value_heads ({self.num_key_value_heads}); pick kv heads that divide it"
            )
        if self.mla:
            self._validate_mla(source)
        derived = self.hidden_size // self.num_attention_heads
        if not self.mla and self.hidden_size % self.num_attention_heads and self.head_dim == derived:
            raise UserError(
                f"{source}: hidden_size ({self.hidden_size}) is not divisible by "
                f"num_attention_heads ({self.num_attention_heads}); change one or set head_dim"
            )
        if not isinstance(self.head_dim, int) or self.head_dim <= 0:
            raise UserError(f"{source}: head_dim must be a positive integer, got {self.head_dim!r}")
        if self.head_dim % 2:
            raise UserError(f"{source}: head_dim ({self.head_dim}) must be even for RoPE")
        if self.hidden_act != "silu":
            raise UserError(f"{source}: hidden_act {self.hidden_act!r} is not supported; use \"silu\"")
        if self.rope_scaling is not None:
            rt = self.rope_scaling.get("rope_type")
            if rt not in SUPPORTED_ROPE_TYPES:
                raise UserError(
                    f"{source}: rope_scaling.rope_type {rt!r} is not supported; "
                    f"use one of {', '.join(SUPPORTED_ROPE_TYPES)}"
                )
            need = {"linear": ("factor",),
                    "llama3": ("factor", "low_freq_factor", "high_freq_factor")}.get(rt, ())
            missing = [k for k in need if k not in self.rope_scaling]
            if missing:
                raise UserError(f"{source}: rope_scaling ({rt}) is missing {', '.join(missing)}")
            if rt == "yarn" and "factor" not in self.rope_scaling \
                    and "original_max_position_embeddings" not in self.rope_scaling:
                raise UserError(f"{source}: rope_scaling (yarn) needs factor or original_max_position_embeddings")

    def _validate_mla(self, source: str) -> None:
        """The MLA widths must be positive integers (the RoPE part even); `q_lora_rank` may be null (one q_proj)."""
        for name in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim") + (
                ("q_lora_rank",) if self.q_lora_rank is not None else ()):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise UserError(f"{source}: {name} must be a positive integer, got {v!r}")
        n = self.num_nextn_predict_layers
        if not isinstance(n, int) or isinstance(n, bool) or n < 0 or (n and self.model_type != "deepseek_v3"):
            raise UserError(f"{source}: num_nextn_predict_layers must be a non-negative integer (DeepSeek-V3 only), "
                            f"got {n!r}")
        if self.num_key_value_heads != self.num_attention_heads:
            raise UserError(f"{source}: num_key_value_heads ({self.num_key_value_heads}) must equal "
                            f"num_attention_heads ({self.num_attention_heads}) under multi-head latent attention "
                            f"(every head expands its own keys from the latent); set them equal")

    @property
    def n_rep(self) -> int:
        """Query heads per KV head (GQA group size)."""
        return self.num_attention_heads // self.num_key_value_heads


def check_seq_len(cfg: ModelConfig, max_seq_length: int, source: str = "max_seq_length") -> None:
    """Training past the position range RoPE was sized for silently degrades quality."""
    if max_seq_length > cfg.max_position_embeddings:
        raise UserError(
            f"{source}: {max_seq_length} exceeds the model's max_position_embeddings "
            f"({cfg.max_position_embeddings}); lower max_seq_length or raise max_position_embeddings "
            f"in config.json"
        )
