"""Multi-token prediction (DeepSeek-V3, `num_nextn_predict_layers`): module k predicts the token k + 1 positions
ahead of each position, from the previous depth's hidden states and the embedding of the token k positions ahead.

Module k (HF names under `model.layers.{num_hidden_layers + k}.`, as the published checkpoints store it):
`h' = eh_proj([enorm(embed(t_{i+k})) ; hnorm(h_i^{k-1})])`, then one decoder layer of the main model's kind
(`self_attn`, `mlp`, its two norms), then `shared_head.norm` and the main model's LM head. The concatenation order
(embedding first) is vLLM's and Megatron-Core's for these weights; depth 0's hidden states are the main model's
final (normed) output, as vLLM feeds them. The embedding and the head are the main model's own parameters
(DeepSeek shares them); the checkpoints also store copies under the module (`embed_tokens`,
`shared_head.head`), which `convert` writes on export and skips on load.

Training adds `mtp_loss_weight / D · Σ_k L_k` to the main loss (the paper's λ/D; λ 0.3, later 0.1), each L_k the
mean over the positions whose target exists. transformers ignores these layers (`DeepseekV3ForCausalLM` has no MTP
module), so an exported directory loads there as the main model.
"""
from __future__ import annotations

import paddle
import paddle.nn as nn

from pretrain_cli.models.config import ModelConfig
from pretrain_cli.models.layers import RMSNorm, linear
from pretrain_cli.ops.kernels import Kernels
from pretrain_cli.ops.loss import IGNORE_INDEX

SHARED = ("embed_tokens.weight", "shared_head.head.weight")  # stored per module, shared with the main model


class SharedHead(nn.Layer):
    """`shared_head.norm` (the head itself is the main model's `lm_head`)."""

    def __init__(self, cfg: ModelConfig, kernels: Kernels):
        super().__init__()
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, kernels)


class MTPModule(nn.Layer):
    """One prediction depth: the two norms, the projection, a decoder layer (`block`, built by the decoder as
    layer `num_hidden_layers + k`), the head's norm."""

    def __init__(self, cfg: ModelConfig, kernels: Kernels, block: nn.Layer):
        super().__init__()
        h = cfg.hidden_size
        self.enorm = RMSNorm(h, cfg.rms_norm_eps, kernels)
        self.hnorm = RMSNorm(h, cfg.rms_norm_eps, kernels)
        self.eh_proj = linear(cfg, 2 * h, h, False)
        self.shared_head = SharedHead(cfg, kernels)
        # the decoder layer's own sublayers sit directly under the module (HF: layers.61.self_attn, .mlp, ...)
        for name, sub in block.named_children():
            self.add_sublayer(name, sub)
        self._block = [block]  # not a sublayer: its children are registered above under HF's names

    def forward(self, h_prev, emb_next, cos, sin, position_ids=None, doc_start=None):
        """`h_prev`, `emb_next` `[bsz, seq_len, hidden]` → this depth's hidden states `[bsz, seq_len, hidden]`
        (before `shared_head.norm`)."""
        x = self.eh_proj(paddle.concat([self.enorm(emb_next), self.hnorm(h_prev)], axis=-1))  # [.., 2*hidden] in
        return self._block[0](x, cos, sin, None, position_ids, doc_start)


def shift_left(t, fill):
    """`t[:, 1:]` with `fill` appended: the next position's value `[bsz, seq_len]` (the last one has none)."""
    pad = paddle.full([t.shape[0], 1], fill, dtype=t.dtype)
    return paddle.concat([t[:, 1:], pad], axis=1)  # [bsz, seq_len]


def mtp_losses(lm, h, input_ids, labels, cos, sin, position_ids=None, doc_start=None) -> list:
    """Each depth's mean loss (0-D fp32), from the main model's final hidden states `h`. Depth k reads the
    embedding of the input k positions on and is scored on the label k positions on (`IGNORE_INDEX` past the end).
    The kernel table decides where those are (`next_tokens`: under context parallelism the next token of a chunk's
    last one is another rank's) and over whose tokens the mean is taken (`sequence_sums`: the cp group's, so each
    depth's loss is the whole sequence's as one process's; its sum keeps the gradient of every rank's part)."""
    kernels = lm.kernels
    shift, sums = kernels.next_tokens or shift_left, kernels.sequence_sums
    losses = []
    ids, targets = input_ids, labels
    for module in lm.model.layers.mtp:
        ids, targets = shift(ids, 0), shift(targets, IGNORE_INDEX)  # [bsz, seq_len] each
        emb = kernels.embedding(ids, kernels.whole_weight(lm.model.embed_tokens.weight))
        h = module(h, emb, cos, sin, position_ids, doc_start)
        total, count = lm.loss_sum(module.shared_head.norm(h), targets)
        if sums is not None:
            total, count = sums.sum(total), sums.counts(count)
        losses.append(total / paddle.clip(count.astype(total.dtype), min=1.0))
    return losses


def mtp_term(lm, h, input_ids, labels, position_ids=None, doc_start=None):
    """What training adds to the main loss per counted token: `mtp_loss_weight` x the mean of the depths' losses
    (0-D fp32), that mean logged apart as `mtp_loss` (`moe_loss.log_values`). One function for one process
    (`CausalLM.forward`) and a pipeline's last stage (`distributed.steps.pipeline_stages.StageLoss`, which gets the
    input ids passed along the stages), so both add the same term."""
    from pretrain_cli.models.moe_loss import add_logged

    seq_len = input_ids.shape[1]  # with `position_ids`, a cp rank's share of a sequence `rope_span` x as long
    cos, sin = lm.model.rotary_emb(seq_len if position_ids is None else seq_len * lm.kernels.rope_span)
    losses = mtp_losses(lm, h, input_ids, labels, cos, sin, position_ids, doc_start)
    extra = paddle.add_n(losses) / len(losses)  # [] the mean over the depths
    add_logged(lm.router_losses, "mtp_loss", extra)
    return extra * lm.moe.mtp_loss_weight  # λ (`run_config.MoeConfig`)


class DecoderLayers(nn.LayerList):
    """The decoder layers, then the MTP modules under the indices the published checkpoints use
    (`num_hidden_layers + k`), so every parameter carries HF's name. Iterating, `len` and slicing see the decoder
    layers only: the forward, recompute and every parallel layout walk those (`mtp` gives the modules)."""

    def __init__(self, layers: list, mtp: list):
        super().__init__(list(layers) + list(mtp))
        self.num_decoder = len(layers)

    def __len__(self) -> int:
        return self.num_decoder

    def __iter__(self):
        return iter([self._sub_layers[str(i)] for i in range(self.num_decoder)])

    def __getitem__(self, idx):
        if isinstance(idx, slice):
            return nn.LayerList(list(self)[idx])
        if idx < 0:
            idx += self.num_decoder
        if not 0 <= idx < self.num_decoder:
            raise IndexError(f"decoder layer {idx} of {self.num_decoder}")
        return self._sub_layers[str(idx)]

    @property
    def mtp(self) -> list:
        return [self._sub_layers[str(i)] for i in range(self.num_decoder, len(self._sub_layers))]
