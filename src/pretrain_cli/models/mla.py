"""Multi-head latent attention (DeepSeek-V2/V3), as transformers' `DeepseekV3Attention` computes it.

Queries come from `q_proj` (`q_lora_rank` null: DeepSeek-V2-Lite) or the low-rank `q_a_proj → q_a_layernorm →
q_b_proj`; keys and values from one latent: `kv_a_proj_with_mqa` gives `kv_lora_rank` latent dims plus one RoPE
key of `qk_rope_head_dim` shared by every head, the latent is RMS-normalised (`kv_a_layernorm`) and expanded
by `kv_b_proj` into each head's non-RoPE key (`qk_nope_head_dim`) and value (`v_head_dim`). Each query and
key head is `[nope | rope]`; only the rope part is rotated.

DeepSeek lays the rotary dims out in adjacent pairs (`rope_interleave`, V2 always): transformers rotates each
pair by one frequency, and V3 returns the pairs de-interleaved. Both q and k go through the same permutation,
so the scores are those of de-interleaving first (evens, then odds) and rotating half: what is done here, on the
kernels' own RoPE, so every RoPE kernel (and packed documents' `position_ids`) serves MLA unchanged.

The attention itself is the kernels' (`kernels.attention` / `attention_document`: the fused block-causal CPU
kernel, flash attention on GPU, the materialised reference), which take one head width for q, k and v: the
value heads are zero-padded to the query width (the padded output columns are zero and dropped, as
transformers' flash path does), and the queries are pre-multiplied so that the kernels' `1/√width` becomes
MLA's softmax scale (`qk_head_dim^-½`, YaRN's `mscale_all_dim` correction included: `rope_scaling`). On a GPU that
width is flash-attn's head width: DeepSeek-V2/V3's 192 runs on compute capability 8.x and 9.0, which flash-attn's
forward check asserts (Blackwell's 10.0 / 12.0, which Paddle's sdpa admits, unverified); at a width flash-attn
refuses (`ops.flash_width.path`) the kernels run sdpa's memory-efficient kernel or materialise the scores.
"""
from __future__ import annotations

import math

import paddle
import paddle.nn as nn

from pretrain_cli.models.config import ModelConfig
from pretrain_cli.models.layers import CoreAttention, LayerKV, RMSNorm, linear
from pretrain_cli.models.rope_scaling import mla_softmax_scale
from pretrain_cli.ops.kernels import Kernels

# transformers builds q_a_layernorm / kv_a_layernorm with RMSNorm's default eps, not the config's
LATENT_NORM_EPS = 1e-6


def deinterleave(x):
    """`[..., d]` laid out in pairs (x0, x1), (x2, x3), … → `[evens | odds]` (the rotate-half layout)."""
    # (no `*lead, d = x.shape`: under to_static, SOT built `[*lead, d // 2, 2]` without `d // 2`, Paddle 3.3.1)
    lead, d, n = list(x.shape[:-1]), x.shape[-1], x.ndim - 1
    x = x.reshape(lead + [d // 2, 2])  # [..., d/2, 2]
    x = x.transpose(list(range(n)) + [n + 1, n])  # [..., 2, d/2]
    return x.reshape(lead + [d])  # [..., d]


class LatentAttention(nn.Layer):
    """MLA with HF's parameter names; `forward` has `Attention`'s signature, so the decoder layer is shared."""

    def __init__(self, cfg: ModelConfig, kernels: Kernels, down_bias: bool, o_bias: bool):
        super().__init__()
        self.kernels = kernels
        self.nope, self.rope = cfg.qk_nope_head_dim, cfg.qk_rope_head_dim
        self.v_dim, self.qk_dim = cfg.v_head_dim, cfg.qk_head_dim
        self.kv_lora_rank = cfg.kv_lora_rank
        self.interleave = bool(cfg.rope_interleave) or cfg.model_type == "deepseek_v2"
        h, heads = cfg.hidden_size, cfg.num_attention_heads
        if cfg.q_lora_rank is None:
            self.q_proj = linear(cfg, h, heads * self.qk_dim, False)
        else:
            self.q_a_proj = linear(cfg, h, cfg.q_lora_rank, down_bias)
            self.q_a_layernorm = RMSNorm(cfg.q_lora_rank, LATENT_NORM_EPS, kernels)
            self.q_b_proj = linear(cfg, cfg.q_lora_rank, heads * self.qk_dim, False)
        self.low_rank_q = cfg.q_lora_rank is not None
        self.kv_a_proj_with_mqa = linear(cfg, h, self.kv_lora_rank + self.rope, down_bias)
        self.kv_a_layernorm = RMSNorm(self.kv_lora_rank, LATENT_NORM_EPS, kernels)
        self.kv_b_proj = linear(cfg, self.kv_lora_rank, heads * (self.nope + self.v_dim), False)
        self.o_proj = linear(cfg, heads * self.v_dim, h, o_bias, residual=True)
        # the kernels' head width and the factor that turns their 1/sqrt(width) into MLA's softmax scale
        self.width = max(self.qk_dim, self.v_dim)
        self.q_scale = mla_softmax_scale(cfg, self.qk_dim) * math.sqrt(self.width)
        self.core = CoreAttention(kernels)

    def queries(self, x):
        """`[bsz, seq_len, hidden]` → `[bsz, seq_len, heads, qk_head_dim]` (not yet rotated)."""
        bsz, seq_len, _ = x.shape
        q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x))) if self.low_rank_q else self.q_proj(x)
        return q.reshape([bsz, seq_len, -1, self.qk_dim])  # [bsz, seq_len, heads, qk_head_dim]

    def forward(self, x, cos, sin, kv: LayerKV | None = None, position_ids=None, doc_start=None,
                project: bool = True):
        """`project=False`: the heads' output before `o_proj`, as `layers.Attention.forward`."""
        bsz, seq_len, _ = x.shape
        q_nope, q_rot = paddle.split(self.queries(x), [self.nope, self.rope], axis=-1)
        latent, k_rot = paddle.split(self.kv_a_proj_with_mqa(x), [self.kv_lora_rank, self.rope], axis=-1)
        k_rot = k_rot.reshape([bsz, seq_len, 1, self.rope])  # [bsz, seq_len, 1, rope]: one key for every head
        if self.interleave:
            q_rot, k_rot = deinterleave(q_rot), deinterleave(k_rot)
        if position_ids is None:
            q_rot, k_rot = self.kernels.rope(q_rot, k_rot, cos, sin)
        else:
            q_rot, k_rot = self.kernels.rope(q_rot, k_rot, cos, sin, position_ids)
        kv_heads = self.kv_b_proj(self.kv_a_layernorm(latent))  # [bsz, seq_len, heads*(nope+v)]
        kv_heads = kv_heads.reshape([bsz, seq_len, -1, self.nope + self.v_dim])  # [bsz, seq_len, heads, nope+v]
        k_nope, v = paddle.split(kv_heads, [self.nope, self.v_dim], axis=-1)
        heads = k_nope.shape[2]
        k = paddle.concat([k_nope, k_rot.expand([bsz, seq_len, heads, self.rope])], axis=-1)  # [.., heads, qk]
        q = paddle.concat([q_nope, q_rot], axis=-1)  # [bsz, seq_len, heads, qk_head_dim]
        q, k, v = self._to_width(q * self.q_scale), self._to_width(k), self._to_width(v)
        if kv is None:
            out = self.core(q, k, v) if doc_start is None else self.core(q, k, v, doc_start)
        else:
            k, v = kv.append(k, v)  # [bsz, cached_len+seq_len, heads, width]
            out = self.kernels.attention_cached(q, k, v)  # [bsz, seq_len, heads, width]
        if self.v_dim < self.width:
            out = out[:, :, :, :self.v_dim]  # [bsz, seq_len, heads, v_head_dim]: the padded columns are zero
        out = out.reshape([bsz, seq_len, -1])  # [bsz, seq_len, heads*v_head_dim]
        return self.o_proj(out) if project else out

    def _to_width(self, t):
        """Zero-pad the last dim to the kernels' one head width (zeros change neither scores nor outputs)."""
        d = t.shape[-1]
        if d == self.width:
            return t
        pad = paddle.zeros([*t.shape[:-1], self.width - d], dtype=t.dtype)
        return paddle.concat([t, pad], axis=-1)  # [..., width]
