"""Building blocks shared by every family: RMSNorm, RoPE tables, GQA attention (with Qwen3's per-head
q/k RMSNorm when the family has it), SwiGLU MLP.

Every op that has a fused variant goes through `kernels` so the layer code is the same on
CPU and GPU. Init follows PaddleNLP `_init_weights` (ARCHITECTURE.md facts: init): built eagerly, the weights
are drawn from Paddle's global generator in construction order, so `paddle.seed(s)` fixes them; `train` builds
lazily and creates each rank's blocks by the same distributions from `models.init`'s per-tensor rule.
"""
from __future__ import annotations

import math

import numpy as np
import paddle
import paddle.nn as nn

from pretrain_cli.ops.kernels import Kernels
from pretrain_cli.models.config import ModelConfig
from pretrain_cli.models.rope_scaling import attention_factor, rope_inv_freq


def normal_attr(std: float) -> paddle.ParamAttr:
    return paddle.ParamAttr(initializer=nn.initializer.Normal(mean=0.0, std=std))


def linear(cfg: ModelConfig, n_in: int, n_out: int, bias: bool, residual: bool = False) -> nn.Linear:
    """Linear with PaddleNLP init; residual projections are scaled by 1/sqrt(2·layers)."""
    std = cfg.initializer_range / (math.sqrt(2 * cfg.num_hidden_layers) if residual else 1.0)
    bias_attr = paddle.ParamAttr(initializer=nn.initializer.Constant(0.0)) if bias else False
    return nn.Linear(n_in, n_out, weight_attr=normal_attr(std), bias_attr=bias_attr)


class RMSNorm(nn.Layer):
    def __init__(self, hidden_size: int, eps: float, kernels: Kernels):
        super().__init__()
        self.eps = eps
        self.kernels = kernels
        self.weight = self.create_parameter(
            [hidden_size], default_initializer=nn.initializer.Constant(1.0))

    def forward(self, x):
        return self.kernels.rms_norm(x, self.weight, self.eps)

    def add_forward(self, x, a):
        """`(h, norm(h))` with `h = x + a`: a residual add and this norm as one kernel where one exists."""
        if self.kernels.add_rms_norm is None:
            h = x + a
            return h, self(h)
        return self.kernels.add_rms_norm(x, a, self.weight, self.eps)

    def fuses(self, proj: nn.Linear) -> bool:
        """Whether `projected_add_forward` can take `proj` into its op: a kernel for it, no bias on `proj`, and no
        hook on it (the op reads its weight, so a layout's hooks on the Linear would not run)."""
        return (self.kernels.linear_add_rms_norm is not None and proj.bias is None
                and not proj._forward_pre_hooks and not proj._forward_post_hooks)

    def projected_add_forward(self, x, a, proj: nn.Linear):
        """`(h, norm(h))` with `h = x + proj(a)`: the projection, the add and this norm as one kernel (`fuses(proj)`
        holds; the caller keeps `proj` out of any recomputed block, since the op keeps `a` for its backward)."""
        return self.kernels.linear_add_rms_norm(a, proj.weight, x, self.weight, self.eps)


class RotaryEmbedding(nn.Layer):
    """cos/sin tables `[seq_len, head_dim]`, computed once per length and not saved in state_dict; YaRN's
    `attention_factor` multiplies both (1 for every other RoPE type), as transformers does."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.inv_freq = rope_inv_freq(cfg)
        self.scale = attention_factor(cfg)
        self._cache: dict = {}

    def forward(self, seq_len: int, offset: int = 0):
        key = (seq_len, offset)
        if key not in self._cache:
            pos = np.arange(offset, offset + seq_len, dtype=np.float32)
            angles = np.outer(pos, self.inv_freq).astype(np.float32)  # [seq_len, head_dim/2]
            emb = np.concatenate([angles, angles], axis=-1)  # [seq_len, head_dim]
            cos, sin = np.cos(emb), np.sin(emb)
            if self.scale != 1.0:  # YaRN
                cos, sin = (t * np.float32(self.scale) for t in (cos, sin))
            self._cache[key] = (paddle.to_tensor(cos), paddle.to_tensor(sin))
            if len(self._cache) > 8:  # generation walks offsets; keep the table small
                self._cache.pop(next(iter(self._cache)))
        return self._cache[key]


class LayerKV:
    """One layer's cached keys/values `[bsz, cached_len, n_kv_heads, head_dim]` (generation only)."""

    def __init__(self):
        self.k = None
        self.v = None

    def append(self, k, v):
        """Concatenate the new positions and return the full K/V to attend over."""
        if self.k is not None:
            k = paddle.concat([self.k, k], axis=1)  # [bsz, cached_len+seq_len, n_kv_heads, head_dim]
            v = paddle.concat([self.v, v], axis=1)  # [bsz, cached_len+seq_len, n_kv_heads, head_dim]
        self.k, self.v = k, v
        return k, v


class KVCache:
    """Per-layer K/V plus the number of positions already cached (the RoPE offset of new tokens)."""

    def __init__(self, num_layers: int):
        self.layers = [LayerKV() for _ in range(num_layers)]
        self.offset = 0


class CoreAttention(nn.Layer):
    """Softmax(QKᵀ)V only, as its own layer so `core_attn` recompute can wrap exactly this."""

    def __init__(self, kernels: Kernels):
        super().__init__()
        self.kernels = kernels

    def forward(self, q, k, v, doc_start=None):
        """`doc_start` (int64 `[bsz, seq_len]`, packed documents): query i sees keys doc_start[b, i] … i only."""
        if doc_start is None:
            return self.kernels.attention(q, k, v)
        return self.kernels.attention_document(q, k, v, doc_start)


class Attention(nn.Layer):
    """GQA self-attention; `qk_norm` (Qwen3) RMS-normalises every q and k head over head_dim before RoPE."""

    def __init__(self, cfg: ModelConfig, kernels: Kernels, qkv_bias: bool, o_bias: bool, qk_norm: bool = False):
        super().__init__()
        self.n_heads = cfg.num_attention_heads
        self.n_kv_heads = cfg.num_key_value_heads
        self.head_dim = cfg.head_dim
        self.kernels = kernels
        h, q_out, kv_out = cfg.hidden_size, self.n_heads * self.head_dim, self.n_kv_heads * self.head_dim
        self.q_proj = linear(cfg, h, q_out, qkv_bias)
        self.k_proj = linear(cfg, h, kv_out, qkv_bias)
        self.v_proj = linear(cfg, h, kv_out, qkv_bias)
        self.o_proj = linear(cfg, q_out, h, o_bias, residual=True)
        if qk_norm:  # HF names self_attn.q_norm.weight / k_norm.weight, [head_dim] each
            self.q_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps, kernels)
            self.k_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps, kernels)
        self.qk_norm = qk_norm
        self.core = CoreAttention(kernels)

    def _one_op(self, kv) -> bool:
        """`kernels.attn_in` serves the plain projections: no biases, no per-head norm between them and RoPE, and
        no KV cache (generation keeps the separate ops and their cached K/V)."""
        return (self.kernels.attn_in is not None and kv is None and not self.qk_norm
                and self.q_proj.bias is None and self.k_proj.bias is None and self.v_proj.bias is None)

    def forward(self, x, cos, sin, kv: LayerKV | None = None, position_ids=None, doc_start=None,
                project: bool = True):
        """Training passes no `kv` (unchanged path); generation passes the layer's cache. Packed documents
        pass `position_ids` (each token's RoPE row) and/or `doc_start` (where its document begins).
        `project=False` returns the heads' output `[bsz, seq_len, n_heads*head_dim]` before `o_proj`, for the
        decoder layer to run the projection with its residual add and norm (`RMSNorm.projected_add_forward`)."""
        bsz, seq_len, _ = x.shape
        if self._one_op(kv):  # the projections and RoPE as one op (CPU)
            # q [bsz, seq_len, n_heads, head_dim], k and v [bsz, seq_len, n_kv_heads, head_dim], as the path below
            q, k, v = self.kernels.attn_in(x, self.q_proj.weight, self.k_proj.weight, self.v_proj.weight, cos, sin,
                                           position_ids)
        else:
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
            # the head counts follow the projections' widths: all heads, or the share a layout gave these weights
            q = q.reshape([bsz, seq_len, -1, self.head_dim])  # [bsz, seq_len, n_heads, head_dim]
            k = k.reshape([bsz, seq_len, -1, self.head_dim])  # [bsz, seq_len, n_kv_heads, head_dim]
            v = v.reshape([bsz, seq_len, -1, self.head_dim])  # [bsz, seq_len, n_kv_heads, head_dim]
            if self.qk_norm:
                q, k = self.q_norm(q), self.k_norm(k)
            if position_ids is None:
                q, k = self.kernels.rope(q, k, cos, sin)
            else:
                q, k = self.kernels.rope(q, k, cos, sin, position_ids)
        if kv is None:
            # [bsz, seq_len, n_heads, head_dim]; the plain call when causal (core_attn recompute wraps `core`)
            out = self.core(q, k, v) if doc_start is None else self.core(q, k, v, doc_start)
        else:
            k, v = kv.append(k, v)  # [bsz, cached_len+seq_len, n_kv_heads, head_dim]
            out = self.kernels.attention_cached(q, k, v)  # [bsz, seq_len, n_heads, head_dim]
        out = out.reshape([bsz, seq_len, -1])  # [bsz, seq_len, n_heads*head_dim]
        return self.o_proj(out) if project else out


class MLP(nn.Layer):
    def __init__(self, cfg: ModelConfig, kernels: Kernels, bias: bool = False):
        super().__init__()
        self.kernels = kernels
        h, inter = cfg.hidden_size, cfg.intermediate_size
        self.gate_proj = linear(cfg, h, inter, bias)
        self.up_proj = linear(cfg, h, inter, bias)
        self.down_proj = linear(cfg, inter, h, bias, residual=True)

    def forward(self, x, residual=None):
        """`down(swiglu(x))`, plus `residual` when given (the decoder layer's `h +`: one op with the down
        projection on CPU, `kernels.linear_residual`)."""
        if not self.kernels.pack_mlp:
            act = self.kernels.swiglu(self.gate_proj(x), self.up_proj(x))
        else:
            g, u = self.gate_proj, self.up_proj
            if self.kernels.mlp_in is not None and g.bias is None:  # one op on CPU
                act = self.kernels.mlp_in(x, g.weight, u.weight)  # [bsz, seq_len, inter]
            else:
                act = self.kernels.swiglu_packed(self.kernels.gate_up(x, g.weight, u.weight, g.bias, u.bias))
        if residual is None:
            return self.down_proj(act)
        if self.kernels.linear_residual is not None and self.down_proj.bias is None:
            return self.kernels.linear_residual(act, self.down_proj.weight, residual)
        return residual + self.down_proj(act)
