"""The sparse Mixture-of-Experts block of Qwen2-MoE and Qwen3-MoE (and the parts DeepSeek-V3 plugs into).

Interface (what the decoder, the balance losses, expert parallelism and other routers rely on):

- **Router** (`SoftmaxTopKRouter`; HF `mlp.gate`): `router(x [tokens, hidden]) -> Routing`. It always works in
  float32, whatever the activations' dtype, under mixed precision too (`fp32_router`: its weights and bias stay
  fp32 through AMP's O2 cast and it runs with autocast off, `ops.fp32.autocast_off`: under autocast the gate's
  matmul would run in bf16 and close experts tie; as PaddleNLP's and Megatron's routers do), and is
  pluggable: the block only calls it and reads the `Routing`, so
  DeepSeek-V3's sigmoid group-limited router is another class with the same call. A router may hold
  `e_score_correction_bias` (float32 `[experts]`, no gradient: the auxiliary-loss-free balancing bias, DeepSeek's
  name); it is added to the scores to *choose* experts only, never to the combine weights.
- **Routing** (NamedTuple): `logits` `[tokens, experts]` fp32 (HF's `router_logits`, what the load-balancing and
  z-losses read), `scores` `[tokens, experts]` fp32 (softmax probabilities), `indices` int64 `[tokens, top_k]`,
  `weights` fp32 `[tokens, top_k]` (combine weights; renormalised when `norm_topk_prob`).
- **Experts** (`Experts`; HF `mlp.experts.{e}.{gate,up,down}_proj`): `experts(x_sorted [rows, hidden], counts)`
  where the rows are token copies grouped by expert in ascending expert order and `counts` (host ints, one per
  expert this module holds) says how many rows each has; returns `[rows, hidden]` in the same order. The compute
  is one grouped computation chosen by `ops.kernels` (`Kernels.grouped_mlp`), never a loop over all tokens per
  expert. Each expert's weights are ordinary Linear parameters under HF's per-expert names, so checkpoints,
  ZeRO, conversion and per-tensor init treat them like any other weight; expert parallelism holds a subset
  (`Experts.first` is the global index of its first expert).
- **SparseMoeBlock** (HF `mlp` of a sparse layer): `block(x [bsz, seq_len, hidden]) -> [bsz, seq_len, hidden]`.
  It keeps what the step needs of its last forward in `block.record` (`MoeRecord`): the routing, the per-expert
  token counts (fp32 `[experts]`, after dropping) and the dropped assignments; the balance losses
  (`models.moe_loss`) read the records of all sparse layers. It also sums its counts since the last log
  (`block.load`, `block.dropped`: `moe_loss.read_load`) and since the last bias update (`block.step_load`):
  fp32 tensors, never read on the host inside a step, counted in training mode only (not evaluation's). Dispatch (sort
  by expert, run the experts, combine) is `dispatch_local` here, or the kernel table's `moe_dispatch` the model is
  built with: expert parallelism's exchanges rows between ranks, tensor parallelism's runs sliced experts, with the
  same inputs and outputs (`distributed.steps.order.build_kernels`).

Options that are training choices, not architecture (`run_config.MoeConfig`): the auxiliary-loss-free bias
(created when its update rate is > 0) and `capacity_factor` (0: dropless, the default; > 0: each expert keeps at
most ceil(factor · tokens · top_k / experts) assignments, the earliest tokens first, the rest dropped: weight 0;
in training only: evaluation computes every assignment, as `eval` and transformers do).
"""
from __future__ import annotations

import dataclasses
from typing import NamedTuple

import paddle
import paddle.nn as nn

from pretrain_cli.models.config import ModelConfig
from pretrain_cli.models.layers import MLP, linear, normal_attr
from pretrain_cli.ops.fp32 import autocast_off
from pretrain_cli.ops.kernels import Kernels
from pretrain_cli.run_config import MoeConfig


class Routing(NamedTuple):
    logits: paddle.Tensor  # [tokens, experts] fp32
    scores: paddle.Tensor  # [tokens, experts] fp32
    indices: paddle.Tensor  # [tokens, top_k] int64
    weights: paddle.Tensor  # [tokens, top_k] fp32


class MoeRecord(NamedTuple):
    """One sparse layer's last forward, for the balance losses and the load statistics (no host sync)."""

    routing: Routing
    counts: paddle.Tensor  # [experts] fp32: assignments each expert computed (after dropping)
    dropped: paddle.Tensor  # [] fp32: assignments dropped by the capacity (0 when dropless)


def fp32_router(router: nn.Layer) -> None:
    """Keep `router`'s parameters float32 under AMP's O2 cast (`paddle.amp.decorate` leaves a layer whose
    `_cast_to_low_precision` is off in fp32: amp/auto_cast.py 3.3.1, `need_keep_fp32`). Cast to bf16, the balancing
    bias could not move by its rate (bf16 keeps 8 bits: at |bias| >= 0.5 a step of 1e-3 rounds to no change) and
    the gate weight would route from bf16 values; the optimizer updates an fp32 parameter as its own master copy."""
    router._cast_to_low_precision = False


def balancing_bias(router: nn.Layer, cfg: ModelConfig):
    """Aux-loss-free balancing's per-expert bias (`e_score_correction_bias`): a checkpointed fp32 parameter, zero
    at first, no gradient, no optimizer touches it (`moe_loss.update_expert_bias` moves it)."""
    bias = router.create_parameter([cfg.num_experts], dtype="float32",
                                   default_initializer=nn.initializer.Constant(0.0))
    bias.stop_gradient = True
    return bias


class SoftmaxTopKRouter(nn.Linear):
    """Qwen2-/Qwen3-MoE's gate: softmax over all experts in fp32, top-k, renormalised only when `norm_topk_prob`
    (transformers' Qwen2MoeTopKRouter). A Linear (Paddle `[hidden, experts]`) so `convert` transposes it to HF's
    `mlp.gate.weight` `[experts, hidden]` like every other projection."""

    def __init__(self, cfg: ModelConfig, moe: MoeConfig):
        super().__init__(cfg.hidden_size, cfg.num_experts, weight_attr=normal_attr(cfg.initializer_range),
                         bias_attr=False)
        self.top_k, self.norm_topk_prob = cfg.num_experts_per_tok, cfg.norm_topk_prob
        self.e_score_correction_bias = (balancing_bias(self, cfg) if moe.bias_update_rate > 0 or moe.routing_bias
                                        else None)
        fp32_router(self)

    def forward(self, x) -> Routing:
        with autocast_off():  # fp32 routing under GPU autocast too (`ops.fp32`)
            return self._route(x)

    def _route(self, x) -> Routing:
        logits = paddle.matmul(x.astype("float32"), self.weight.astype("float32"))  # [tokens, experts]
        scores = nn.functional.softmax(logits, axis=-1)  # [tokens, experts]
        if self.e_score_correction_bias is None:
            weights, indices = paddle.topk(scores, self.top_k, axis=-1)  # [tokens, top_k] each
        else:  # the bias steers the choice; the weights stay the unbiased probabilities
            _, indices = paddle.topk(scores + self.e_score_correction_bias, self.top_k, axis=-1)
            weights = paddle.take_along_axis(scores, indices, axis=-1)  # [tokens, top_k]
        if self.norm_topk_prob:
            weights = weights / weights.sum(axis=-1, keepdim=True)
        return Routing(logits, scores, indices, weights)


class Expert(nn.Layer):
    """One routed expert: a bias-free SwiGLU MLP `moe_intermediate_size` wide (HF `experts.{e}.*_proj`)."""

    def __init__(self, cfg: ModelConfig, width: int):
        super().__init__()
        h = cfg.hidden_size
        self.gate_proj = linear(cfg, h, width, False)
        self.up_proj = linear(cfg, h, width, False)
        self.down_proj = linear(cfg, width, h, False, residual=True)


class Experts(nn.Layer):
    """Experts `first … first + len(self) - 1` of a layer (all of them on one device). Each is a sublayer named by
    its global index, so its parameters carry HF's name (`mlp.experts.{e}.gate_proj.weight`) on any rank."""

    def __init__(self, cfg: ModelConfig, kernels: Kernels, first: int = 0, count: int | None = None):
        super().__init__()
        self.kernels, self.first = kernels, first
        self.count = cfg.num_experts - first if count is None else count
        for e in range(first, first + self.count):
            self.add_sublayer(str(e), Expert(cfg, cfg.moe_intermediate_size))

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, e: int) -> Expert:
        """Expert `e` by its global index."""
        return getattr(self, str(e))

    def forward(self, x_sorted, counts: list[int]):
        """`x_sorted` `[rows, hidden]` grouped by expert; `counts[i]` rows for expert `first + i`."""
        ws = []
        for e in range(self.first, self.first + self.count):  # a plain loop: SOT lost `self` in nested comprehensions
            x = self[e]
            ws.append((x.gate_proj.weight, x.up_proj.weight, x.down_proj.weight))
        out = self.kernels.grouped_mlp(x_sorted, counts, ws, self.kernels.swiglu_packed)
        idle = self.idle(counts)
        return out if idle is None else out + idle.astype(out.dtype)  # [rows, hidden]

    def idle(self, counts: list[int]):
        """0 · one element of each weight of the experts no row reached (fp32 `[]`), None when every expert got
        rows: added to the output, it keeps every held expert in the graph, so each gets a zero gradient, not
        none (`paddle.DataParallel` and expert parallelism's all-reduce need the same parameters on every rank
        each step; the segmented kernel skips an empty expert). Exact, and O(1) per expert forward."""
        keep = []
        for i, n in enumerate(counts):
            if n == 0:
                x = self[self.first + i]
                keep += [w[0, 0].astype("float32") for w in (x.gate_proj.weight, x.up_proj.weight,
                                                             x.down_proj.weight)]
        return paddle.add_n(keep) * 0.0 if keep else None


def capacity(tokens: int, top_k: int, num_experts: int, factor: float) -> int:
    """Assignments one expert keeps under `capacity_factor` (`MoeConfig.expert_capacity`: the one formula)."""
    return MoeConfig(capacity_factor=factor).expert_capacity(tokens, top_k, num_experts)


def expert_counts(flat, num_experts: int):
    """Int64 `[experts]`: how many of `flat`'s expert indices (int64 `[assignments]`) name each expert, on the device:
    an `index_add` of ones, where a GPU `bincount` copies its input's max to the host, blocking, to size its output
    (phi/kernels/gpu/bincount_kernel.cu), a wait per sparse layer and micro-batch (docs/PERFORMANCE.md §8)."""
    return paddle.index_add(paddle.zeros([num_experts], dtype="int64"), flat, 0, paddle.ones_like(flat))


def dispatch_local(x, routing: Routing, experts: Experts, num_experts: int, capacity_factor: float = 0.0):
    """(combined output `[tokens, hidden]`, per-expert counts fp32 `[experts]`, dropped fp32 `[]`): every
    (token, choice) assignment sorted by expert (stable, so a token's copies keep token order within an expert),
    the experts run once over the sorted rows, each row weighted and summed back into its token.

    One host read a call, the counts the grouped GEMM needs as host ints: the counts are made on the device
    (`expert_counts`) and the capacity's kept rows cut at their number from those host counts (`masked_select`
    sizes its output from its mask: a second read)."""
    _, _, indices, weights = routing  # (by position: to_static's SOT can hand the gate's Routing over as a plain tuple)
    tokens, top_k = indices.shape
    flat = indices.reshape([-1])  # [tokens*top_k]
    weights = weights.reshape([-1])  # [tokens*top_k]
    order = paddle.argsort(flat, stable=True)  # [tokens*top_k]: assignments grouped by expert
    counts = expert_counts(flat, num_experts)  # [experts] int64
    dropped = paddle.zeros([], dtype="float32")
    keep = None
    if capacity_factor > 0:
        cap = capacity(tokens, top_k, num_experts, capacity_factor)
        sorted_experts = paddle.gather(flat, order)  # [tokens*top_k]
        starts = paddle.cumsum(counts) - counts  # [experts]: first sorted row of each expert
        slot = paddle.arange(flat.shape[0], dtype="int64") - paddle.gather(starts, sorted_experts)  # [tokens*top_k]
        keep = slot < cap  # [tokens*top_k] in sorted order: the first `cap` of each expert
        dropped = (~keep).astype("float32").sum()
        counts = paddle.clip(counts, max=cap)
    host_counts = [int(c) for c in counts.numpy()]  # the grouped GEMM needs each segment's length on the host
    if keep is not None:  # the kept assignments first, in sorted order (a stable sort of the drop flag), cut there
        kept_first = paddle.argsort((~keep).astype("int32"), stable=True)  # [tokens*top_k]
        order = paddle.gather(order, kept_first[:sum(host_counts)])  # [kept]
    rows = paddle.gather(x, order // top_k)  # [kept, hidden]
    out_rows = experts(rows, host_counts)  # [kept, hidden]
    w = paddle.gather(weights, order).astype(out_rows.dtype).unsqueeze(-1)  # [kept, 1]
    out = paddle.zeros_like(x)  # [tokens, hidden]
    out = paddle.index_add(out, order // top_k, 0, out_rows * w)  # [tokens, hidden]
    return out, counts.astype("float32"), dropped


class SparseMoeBlock(nn.Layer):
    """`y = Σ_k w_k · expert_k(x)` (+ `sigmoid(shared_expert_gate(x)) · shared_expert(x)` for Qwen2-MoE)."""

    def __init__(self, cfg: ModelConfig, kernels: Kernels, moe: MoeConfig, shared_expert: bool):
        super().__init__()
        self.num_experts, self.capacity_factor = cfg.num_experts, moe.capacity_factor
        self.gate = SoftmaxTopKRouter(cfg, moe)
        self.experts = Experts(cfg, kernels)
        if shared_expert:  # HF Qwen2MoeMLP(intermediate_size=shared_expert_intermediate_size) + a [1, hidden] gate
            shared = dataclasses.replace(cfg, intermediate_size=cfg.shared_expert_intermediate_size)
            self.shared_expert = MLP(shared, kernels)
            self.shared_expert_gate = linear(cfg, cfg.hidden_size, 1, False)
        else:
            self.shared_expert = None
        self.dispatch = kernels.moe_dispatch or dispatch_local  # (the layout's, chosen before the model exists)
        self.record: MoeRecord | None = None
        self.reset_load()

    def reset_load(self) -> None:
        """Forget the counts accumulated since the last report (`moe_loss.read_load`)."""
        self.load = None  # [experts] fp32: assignments computed since the reset
        self.dropped = None  # [] fp32: assignments dropped since the reset
        self.step_load = None  # [experts] fp32: since the last bias update (`moe_loss.update_expert_bias`)

    def forward(self, x):
        bsz, seq_len, hidden = x.shape
        flat = x.reshape([-1, hidden])  # [tokens, hidden]
        routing = self.gate(flat)
        # evaluation is dropless, as `eval` and transformers run the model: the run's eval_loss is theirs
        factor = self.capacity_factor if self.training else 0.0
        out, counts, dropped = self.dispatch(flat, routing, self.experts, self.num_experts, factor)
        # (a Routing again: under to_static SOT can hand the gate's over as a plain tuple, which moe_loss reads by name)
        self.record = MoeRecord(Routing(*routing), counts, dropped)
        if self.training:  # an evaluation's tokens neither move the balancing bias nor show in the logged load
            self.load = counts if self.load is None else self.load + counts
            self.step_load = counts if self.step_load is None else self.step_load + counts
            self.dropped = dropped if self.dropped is None else self.dropped + dropped
        if self.shared_expert is not None:
            gate = nn.functional.sigmoid(self.shared_expert_gate(flat))  # [tokens, 1]
            out = out + gate * self.shared_expert(flat)
        return out.reshape([bsz, seq_len, hidden])  # [bsz, seq_len, hidden]
