"""DeepSeek-V2/V3's Mixture-of-Experts, on `models.moe`'s interface: a router with the same call and `Routing`,
the same experts and dispatch, plus DeepSeek's ungated shared experts and its sequence-wise balance loss. So
expert parallelism (`distributed.steps.expert_parallel`) swaps the dispatch as for Qwen's blocks and splits the routed
experts only: the shared experts and the router are dense weights to it.

Routing (transformers' `DeepseekV3TopkRouter` / `DeepseekV2TopkRouter`, all in float32):
- DeepSeek-V3 (`topk_method: noaux_tc`, the hub's `scoring_func: sigmoid`): scores are sigmoids of the logits;
  the auxiliary-loss-free balancing bias `e_score_correction_bias` (fp32, in the checkpoint, no gradient) is added
  to choose experts only; the experts are cut into `n_group` groups ranked by the sum of their two best biased
  scores, the best `topk_group` groups kept, the top-k of their experts chosen; the combine weights are the
  unbiased scores of the chosen experts, normalised to sum 1 when `norm_topk_prob` (top-1 included, as
  transformers: its weight is then exactly 1), times `routed_scaling_factor`.
- DeepSeek-V2 (softmax scores): `greedy` is plain top-k; `group_limited_greedy` ranks groups by their best
  score. Weights are the scores × the scaling factor, never normalised: transformers' V2 router ignores
  `norm_topk_prob` (its config drops the key), and a checkpoint must compute the same in transformers.
The family decides the method (`ModelConfig` refuses a V3 `topk_method` other than `noaux_tc`, which
transformers' V3 router would ignore, and `noaux_tc` on V2, which its V2 router cannot run).
The bias is updated from each step's expert load by `moe_loss.update_expert_bias` (`bias_update_rate`).

Balance loss (`sequence_balance_loss`): DeepSeek-V3's complementary sequence-wise loss (V2's expert-level loss
is the same formula with softmax scores, per sequence as the hub's `seq_aux`): for each sequence,
`Σ_i f_i · P_i`, f_i = E/(K·T) · (tokens of the sequence routed to expert i), P_i = the mean over its tokens of
expert i's score normalised over all experts; averaged over the sequences, summed over the sparse layers,
× α (`MoeConfig.aux_loss_coef`: `config.moe.aux_coefficient` decides it, by default config.json's `aux_loss_alpha`,
else the papers' 1e-4 for V3 and 1e-3 for V2; none for a model built without a run, as transformers);
`moe_loss.router_loss` takes it instead of HF's load-balancing loss for these blocks. transformers computes no
auxiliary loss for either family.
"""
from __future__ import annotations

import dataclasses

import paddle
import paddle.nn as nn

from pretrain_cli.models.config import ModelConfig
from pretrain_cli.models.layers import MLP, normal_attr
from pretrain_cli.models.moe import Routing, SparseMoeBlock, balancing_bias, fp32_router
from pretrain_cli.ops.fp32 import autocast_off
from pretrain_cli.ops.kernels import Kernels
from pretrain_cli.run_config import MoeConfig



class GroupLimitedRouter(nn.Linear):
    """DeepSeek's gate (HF `mlp.gate.weight` `[experts, hidden]`, Paddle `[hidden, experts]`): see the module."""

    def __init__(self, cfg: ModelConfig, moe: MoeConfig):
        super().__init__(cfg.hidden_size, cfg.num_experts, weight_attr=normal_attr(cfg.initializer_range),
                         bias_attr=False)
        self.method, self.scale = cfg.topk_method, cfg.routed_scaling_factor
        self.sigmoid = cfg.topk_method == "noaux_tc"
        self.top_k, self.normalise = cfg.num_experts_per_tok, self.sigmoid and cfg.norm_topk_prob  # V2: never
        self.groups, self.kept = cfg.n_group, cfg.topk_group
        # V3 always stores the bias (its checkpoints carry it); V2 only when balancing by it
        keep = self.sigmoid or moe.bias_update_rate > 0 or moe.routing_bias
        self.e_score_correction_bias = balancing_bias(self, cfg) if keep else None
        fp32_router(self)  # weights and bias fp32 under O2, the forward outside autocast (`models.moe`)

    def forward(self, x) -> Routing:
        with autocast_off():
            return self._route(x)

    def _route(self, x) -> Routing:
        logits = paddle.matmul(x.astype("float32"), self.weight.astype("float32"))  # [tokens, experts]
        scores = nn.functional.sigmoid(logits) if self.sigmoid else nn.functional.softmax(logits, axis=-1)
        choice = scores if self.e_score_correction_bias is None else scores + self.e_score_correction_bias
        if self.method != "greedy":
            choice = self._keep_best_groups(choice)
        _, indices = paddle.topk(choice, self.top_k, axis=-1)  # [tokens, top_k]
        weights = paddle.take_along_axis(scores, indices, axis=-1)  # [tokens, top_k]: unbiased scores
        if self.normalise:
            weights = weights / (weights.sum(axis=-1, keepdim=True) + 1e-20)
        return Routing(logits, scores, indices, weights * self.scale)

    def _keep_best_groups(self, choice):
        """`choice` with the experts outside the `topk_group` best groups set to −inf."""
        tokens, experts = choice.shape
        grouped = choice.reshape([tokens, self.groups, experts // self.groups])  # [tokens, groups, per_group]
        if self.sigmoid:  # V3: a group's score is the sum of its two best experts' scores
            group_scores = paddle.topk(grouped, 2, axis=-1)[0].sum(axis=-1)  # [tokens, groups]
        else:  # V2's group_limited_greedy: its best expert's score
            group_scores = grouped.max(axis=-1)  # [tokens, groups]
        _, best = paddle.topk(group_scores, self.kept, axis=-1)  # [tokens, kept]
        keep = nn.functional.one_hot(best, self.groups).sum(axis=1)  # [tokens, groups]: 1 for a kept group
        keep = keep.unsqueeze(-1).expand(grouped.shape).reshape([tokens, experts])  # [tokens, experts]
        return paddle.where(keep > 0, choice, paddle.full_like(choice, float("-inf")))


def sequence_balance_loss(routing: Routing, bsz: int, seq_len: int, top_k: int, normalise: bool, split=None):
    """One layer's `mean over sequences of Σ_i f_i · P_i` (fp32 scalar); `normalise`: divide the (sigmoid)
    scores by their sum over the experts first (V3's s'_{i,t}). `split` (context parallelism's
    `sequence_sums`: this rank holds `seq_len` of each sequence's `seq_len × split.ranks` tokens): f_i from the
    sequence's counts summed over the cp group, P_i this rank's tokens' part of the sequence's mean, so the cp
    ranks' losses add up to the whole sequences' (`moe_loss.router_loss` takes that sum)."""
    _, scores, indices, _ = routing  # (by position: to_static's SOT can hand a Routing over as a plain tuple)
    experts = scores.shape[-1]
    if normalise:
        scores = scores / (scores.sum(axis=-1, keepdim=True) + 1e-20)
    scores = scores.reshape([bsz, seq_len, experts])  # [bsz, seq_len, experts]
    chosen = nn.functional.one_hot(indices, experts).sum(axis=1)  # [tokens, experts]
    counts = chosen.reshape([bsz, seq_len, experts]).sum(axis=1).astype("float32")  # [bsz, experts]
    if split is None:
        p = scores.mean(axis=1)  # [bsz, experts]
    else:
        seq_len = seq_len * split.ranks  # the whole sequence's tokens
        p, counts = scores.sum(axis=1) / seq_len, split.counts(counts)  # [bsz, experts] each
    f = counts * (experts / (top_k * seq_len))  # [bsz, experts]
    return (f.detach() * p).sum(axis=-1).mean()


class DeepseekMoeBlock(SparseMoeBlock):
    """`y = Σ_k w_k · expert_k(x) + shared_experts(x)` (HF `DeepseekV3MoE`): `n_shared_experts` always-on experts
    as one MLP `moe_intermediate_size · n_shared_experts` wide, no gate."""

    def __init__(self, cfg: ModelConfig, kernels: Kernels, moe: MoeConfig):
        super().__init__(cfg, kernels, moe, shared_expert=False)
        self.gate = GroupLimitedRouter(cfg, moe)  # replaces the softmax router, same place among the sublayers
        self.top_k, self.normalise = cfg.num_experts_per_tok, cfg.topk_method == "noaux_tc"
        if cfg.n_shared_experts:
            width = cfg.moe_intermediate_size * cfg.n_shared_experts
            self.shared_experts = MLP(dataclasses.replace(cfg, intermediate_size=width), kernels)
        else:
            self.shared_experts = None
        self.seq_shape = None
        self.split = kernels.sequence_sums  # context parallelism: the cp group holds the rest of each sequence

    def forward(self, x):
        self.seq_shape = tuple(x.shape[:2])  # (bsz, seq_len): the sequences the balance loss is taken over
        out = super().forward(x)  # [bsz, seq_len, hidden]
        return out if self.shared_experts is None else out + self.shared_experts(x)

    def balance_loss(self):
        """This layer's sequence-wise balance loss over its last forward (unweighted)."""
        return sequence_balance_loss(self.record.routing, *self.seq_shape, self.top_k, self.normalise, self.split)
