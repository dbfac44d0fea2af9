"""Pre-norm decoder stack and the causal-LM head shared by every family.

Parameter names equal HF's (`model.layers.N.self_attn.q_proj.weight`, `lm_head.weight`),
so conversion is only a transpose of 2-D Linear weights (ARCHITECTURE.md facts: HF names and layout). Families differ
only in which biases exist and whether q/k heads are RMS-normalised (`families.FAMILIES`).

Packed samples under `attention_mask_type: document` also carry `position_ids` (RoPE positions that
restart at each document) and `doc_start` (where each token's document begins); without them the
forward is the plain causal one, unchanged.
"""
from __future__ import annotations

import paddle
import paddle.nn as nn

from pretrain_cli.ops.kernels import Kernels
from pretrain_cli.ops.loss import causal_lm_loss_sum, head_loss_sum
from pretrain_cli.models.config import ModelConfig
from pretrain_cli.models.families import family
from pretrain_cli.models.layers import MLP, Attention, KVCache, RMSNorm, RotaryEmbedding, linear, normal_attr
from pretrain_cli.models.mla import LatentAttention
from pretrain_cli.models.mtp import DecoderLayers, MTPModule, mtp_term
from pretrain_cli.run_config import MoeConfig


class DecoderLayer(nn.Layer):
    """`h = x + Attn(norm(x))`; `y = h + MLP(norm(h))`; the MLP is `moe.SparseMoeBlock` when `moe` is given."""

    def __init__(self, cfg: ModelConfig, kernels: Kernels, qkv_bias: bool, o_bias: bool, mlp_bias: bool,
                 qk_norm: bool = False, moe: MoeConfig | None = None):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, kernels)
        if cfg.mla:  # DeepSeek's multi-head latent attention: the q/kv down-projections take `qkv_bias`
            self.self_attn = LatentAttention(cfg, kernels, qkv_bias, o_bias)
        else:
            self.self_attn = Attention(cfg, kernels, qkv_bias, o_bias, qk_norm)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, kernels)
        self.dense = moe is None
        if moe is None:
            self.mlp = MLP(cfg, kernels, mlp_bias)
        else:
            from pretrain_cli.models.moe import SparseMoeBlock

            if cfg.mla:  # DeepSeek's routing and shared experts on the same interface
                from pretrain_cli.models.deepseek_moe import DeepseekMoeBlock

                self.mlp = DeepseekMoeBlock(cfg, kernels, moe)
            else:
                self.mlp = SparseMoeBlock(cfg, kernels, moe, family(cfg.model_type).shared_expert)

    def forward(self, x, cos, sin, kv=None, position_ids=None, doc_start=None):
        attn, post = self.self_attn, self.post_attention_layernorm
        attn_in = self.input_layernorm(x)
        if post.fuses(attn.o_proj):  # the heads' output, then h = x + o_proj(it) and its norm as one op (CPU)
            heads = attn(attn_in, cos, sin, kv, position_ids, doc_start, project=False)
            h, normed = post.projected_add_forward(x, heads, attn.o_proj)
        else:  # o_proj inside the attention (and inside its recomputed block, `full_attn`), then h = x + attn
            h, normed = post.add_forward(x, attn(attn_in, cos, sin, kv, position_ids, doc_start))
        if self.dense:  # h + down(...) as one op on CPU
            return self.mlp(normed, residual=h)
        return h + self.mlp(normed)


class DecoderModel(nn.Layer):
    def __init__(self, cfg: ModelConfig, kernels: Kernels, moe: MoeConfig | None = None):
        super().__init__()
        fam = family(cfg.model_type)
        moe = moe or MoeConfig()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size,
                                         weight_attr=normal_attr(cfg.initializer_range))
        layers = [DecoderLayer(cfg, kernels, *fam.biases(cfg), fam.qk_norm, moe if cfg.is_sparse_layer(i) else None)
                  for i in range(cfg.num_hidden_layers)]
        # DeepSeek-V3's multi-token prediction modules follow as layers num_hidden_layers + k (`models.mtp`)
        mtp = [MTPModule(cfg, kernels, DecoderLayer(cfg, kernels, *fam.biases(cfg), fam.qk_norm,
                                                    moe if cfg.is_sparse_layer(i) else None))
               for i in range(cfg.num_hidden_layers, cfg.num_hidden_layers + cfg.num_nextn_predict_layers)]
        self.layers = DecoderLayers(layers, mtp)
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, kernels)
        self.rotary_emb = RotaryEmbedding(cfg)
        self.kernels = kernels

    def forward(self, input_ids, cache: KVCache | None = None, position_ids=None, doc_start=None):
        seq_len = input_ids.shape[1]
        offset = cache.offset if cache is not None else 0
        span = seq_len if position_ids is None else seq_len * self.kernels.rope_span  # the positions may reach
        cos, sin = self.rotary_emb(span, offset)  # [span, head_dim] each
        x = self.kernels.embedding(input_ids, self.kernels.whole_weight(self.embed_tokens.weight))  # [bsz, seq, hidden]
        if position_ids is not None or doc_start is not None:  # packed documents (positions < seq_len)
            for layer in self.layers:
                x = layer(x, cos, sin, None, position_ids, doc_start)
        elif cache is None:  # training/eval: the plain path, nothing cache-related traced
            for layer in self.layers:
                x = layer(x, cos, sin)
        else:
            for layer, kv in zip(self.layers, cache.layers):
                x = layer(x, cos, sin, kv)
            cache.offset += seq_len
        return self.norm(x)


class CausalLM(nn.Layer):
    """`forward(input_ids int64 [bsz, seq_len]) -> logits [bsz, seq_len, vocab]`; with `labels`, the loss
    terms instead (the loss itself is `ops.loss`'s), so the fused head + loss kernel never materialises logits."""

    def __init__(self, cfg: ModelConfig, kernels: Kernels, moe: MoeConfig | None = None):
        super().__init__()
        self.config = cfg
        self.kernels = kernels
        self.moe = moe or MoeConfig()
        # a Mixture-of-Experts model, its MTP modules' layers counted (a plain bool: to_static traces it)
        self.sparse = bool(cfg.expert_layers)
        self.mtp_depth = int(cfg.num_nextn_predict_layers)  # DeepSeek-V3's MTP modules (a plain int, as `sparse`)
        self.router_losses: dict = {}  # {name: (sum, forwards)} since the last log line (`moe_loss.log_values`)
        self.model = DecoderModel(cfg, kernels, self.moe)
        self.lm_head = None if cfg.tie_word_embeddings else linear(cfg, cfg.hidden_size, cfg.vocab_size, False)

    def new_cache(self) -> KVCache:
        """An empty KV cache for `forward(ids, cache)` (generation)."""
        return KVCache(self.config.num_hidden_layers)

    def forward(self, input_ids, cache: KVCache | None = None, position_ids=None, doc_start=None, labels=None):
        """`cache` (generation only) feeds just the new tokens and appends their K/V. Packed documents pass
        `position_ids` and/or `doc_start` (int64 `[bsz, seq_len]`, no cache). `labels` (int64 `[bsz, seq_len]`,
        shifted, -100 = not counted): returns (sum of token losses, counted tokens) instead of logits; a MoE model
        in training mode adds its router losses (`models.moe_loss.router_loss`) × counted tokens to the sum, so
        the step's mean is transformers' loss with `output_router_logits`. The kernel table's `reduce_counts` (the
        data ranks' expert counts summed, chosen by the layout) serves the global balance scope."""
        if position_ids is not None or doc_start is not None:
            if cache is not None:
                raise ValueError("position_ids/doc_start are for packed training samples, not with a KV cache")
            h = self.model(input_ids, None, position_ids, doc_start)  # [bsz, seq_len, hidden]
        else:
            h = self.model(input_ids) if cache is None else self.model(input_ids, cache)  # [bsz, seq_len, hidden]
        if labels is not None:
            total, count = self.loss_sum(h, labels)
            if self.training and (self.sparse or self.mtp_depth):  # the LM part, logged apart as lm_loss
                from pretrain_cli.models.moe_loss import add_lm_loss

                add_lm_loss(self, total, count)
            if self.training and self.mtp_depth:  # + λ/D · Σ_k L_k per counted token (`models.mtp`)
                extra = mtp_term(self, h, input_ids, labels, position_ids, doc_start)  # logged as mtp_loss
                total = total + extra * count.detach().astype(total.dtype)
            if self.sparse and self.training:  # + the router losses per counted token (training only:
                # eval and perplexity stay the language-model loss); the step's mean carries them
                from pretrain_cli.models.moe_loss import router_loss

                total = total + router_loss(self) * count.detach().astype(total.dtype)
            return total, count
        return self.logits(h)

    def loss_sum(self, h, labels):
        """(sum of token losses, counted tokens) from the final hidden states: the fused head + loss kernel when
        the kernels have one (the head weight is the embedding's when tied), else the logits and cross-entropy."""
        fused = self.kernels.linear_cross_entropy
        if fused is None:
            return causal_lm_loss_sum(self.logits(h), labels, self.kernels.cross_entropy)
        if self.lm_head is None:
            return head_loss_sum(h, self.model.embed_tokens.weight, labels, fused, vocab_major=True)
        return head_loss_sum(h, self.lm_head.weight, labels, fused, vocab_major=False)

    def logits(self, h):
        """The LM head: `[bsz, seq_len, hidden]` -> `[bsz, seq_len, vocab]`, the embedding's transpose when tied."""
        if self.lm_head is None:
            w = self.kernels.whole_weight(self.model.embed_tokens.weight)
            return paddle.matmul(h, w, transpose_y=True)  # [bsz, seq_len, vocab]
        return self.lm_head(h)  # [bsz, seq_len, vocab]
