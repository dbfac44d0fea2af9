"""Megatron tensor parallelism inside a fleet pipeline stage, over Paddle's own collectives.

Neither of Paddle's tensor-parallel forms runs inside a fleet pipeline stage on CPU: fleet's `mp` layers
need `c_identity` and friends, which have no CPU kernel, and the semi-auto engine's pipeline crashes
(docs/DISTRIBUTED.md, "What CPU verifies"). fleet's `mp` layers are two autograd functions around an
all-reduce within the tensor-parallel group; this module is the same two, as `PyLayer`s over
`paddle.distributed.all_reduce` on the topology's "mp" group, applied to the finished single-device model from
outside — the same code on GPU and CPU:

- `copy_to_tp` (Megatron's f): identity forward, all-reduce of the input's gradient backward. A forward
  pre-hook puts it on the input of every `self_attn` and `mlp`.
- `reduce_from_tp` (Megatron's g): all-reduce forward, identity backward. A forward post-hook puts it on the
  output of every row-parallel projection (`o_proj`, `down_proj`); a bias there is added once, after the sum.

Each rank keeps its slice of the projections on the dim the one TP plan gives (`models.tp_plan`; Paddle
`[in, out]`): q/k/v and gate/up column-parallel (the output dimension, so each rank has num_heads / tp heads and
num_key_value_heads / tp KV heads, intermediate / tp MLP columns), o/down row-parallel (the input dimension). RMSNorm,
RoPE, the embedding and the LM head stay whole on every tp rank; their gradients are the same on every tp rank, because
every activation outside the two functions is. A whole weight inside a region that every head shares (Qwen3's `q_norm` /
`k_norm`, one `[head_dim]` weight over all heads) gets only this rank's heads' part of its gradient: `head_shared` lists
them and `sum_grads` sums them over the tp group once a step (`Hybrid.sync_grads`), as sequence parallelism's norms.
Sliced parameters are marked `is_distributed`, which fleet reads to leave them alone
when it broadcasts the replicated ones over the tp group. A Mixture-of-Experts layer's routed experts are each cut
like an MLP, with the two functions around the experts alone and its router whole (`TPDispatch`; why:
`moe_layouts`).
"""
from __future__ import annotations

import paddle.distributed as dist  # imported lazily, after the environment (only the layout steps import this)
from paddle.autograd import PyLayer

from pretrain_cli.models.tp_plan import ATTENTION, LATENT, MLP, ROW, split_dim


class CopyToTP(PyLayer):
    """Megatron's f: identity forward, the input gradient all-reduced over the tp group backward."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.clone()

    @staticmethod
    def backward(ctx, dy):
        g = dy.clone()
        dist.all_reduce(g, group=ctx.group)  # the input fed every tp rank's slice: its gradient is their sum
        return g


class ReduceFromTP(PyLayer):
    """Megatron's g: the row-parallel partial products all-reduced forward, identity backward."""

    @staticmethod
    def forward(ctx, x, group):
        y = x.clone()
        dist.all_reduce(y, group=group)
        return y

    @staticmethod
    def backward(ctx, dy):
        return dy.clone()


def all_reduce_regions(group) -> tuple:
    """(enter, leave) around each attention and MLP block: Megatron's f and g over `group`."""
    return (lambda x: CopyToTP.apply(x, group)), (lambda x: ReduceFromTP.apply(x, group))


def cut_by_tp(name: str) -> bool:
    """Whether HF tensor `name` is one `split_layers` cuts (the plan's, without the vocabulary: a lazily built stage
    creates these as slices only)."""
    return split_dim(name) is not None


def split_layers(layers, tp: int, tp_rank: int, group, source=None, regions=None) -> dict:
    """Slice every decoder layer of this pipeline stage in `layers` (the model's whole list: the index is the HF
    name's) to tp rank `tp_rank` of `tp` and hook in the two functions over `group`. A stage's layer is one whose
    norms exist (another stage's layers, never created on this rank, are left as they are). A parameter that has
    storage is cut; one still without (a lazily built model: `cut_by_tp`) is created as its slice only, from
    `source` (`distributed.layout.materialize`), so no rank ever holds a whole tensor-parallel weight.
    `regions`: the (enter, leave) functions to hook in instead of the two above (`sequence_parallel.regions`).
    Returns {id(parameter): the Paddle dim it is split on} for the sliced parameters."""
    import paddle

    from pretrain_cli.distributed.layout.materialize import read_block
    from pretrain_cli.distributed.layout.pieces import Box

    copy_to_tp, reduce_from_tp = regions or all_reduce_regions(group)
    split: dict = {}

    def enter(layer, inputs):
        return (copy_to_tp(inputs[0]),) + tuple(inputs[1:])

    def leave(layer, inputs, out):
        if layer.bias is None:
            return reduce_from_tp(out)
        return reduce_from_tp(out - layer.bias) + layer.bias  # the bias once, after the sum

    def keep_slice(parent, name: str, prefix: str):
        linear = getattr(parent, name)
        for key in ("weight", "bias"):
            p, d = getattr(linear, key), split_dim(f"{prefix}.{name}.{key}")  # the plan (`models.tp_plan`)
            if p is None or d is None:  # a row-parallel bias stays whole (added after the sum)
                continue
            size = p.shape[d] // tp
            start = [0] * len(p.shape)
            start[d] = tp_rank * size
            end = list(p.shape)
            end[d] = start[d] + size
            if p._is_initialized():
                piece = paddle.slice(p, axes=list(range(len(p.shape))), starts=start, ends=end)  # this rank's block
            else:  # created as the block only: [start, end) of the HF-named tensor, in Paddle's layout
                box = Box(tuple(int(n) for n in p.shape), tuple(start), tuple(e - s for s, e in zip(start, end)))
                piece = read_block(f"{prefix}.{name}.{key}", p, source, box)
            new = paddle.create_parameter(piece.shape, str(piece.dtype).split(".")[-1],
                                          default_initializer=paddle.nn.initializer.Assign(piece))
            new.is_distributed = True
            setattr(linear, key, new)
            split[id(new)] = d

    mtp = list(getattr(layers, "mtp", []))  # DeepSeek-V3's MTP modules: layers num_hidden_layers + k, cut alike
    for i, layer in enumerate(list(layers) + mtp):
        if not layer.input_layernorm.weight._is_initialized():  # not this stage's: nothing to cut, never run here
            continue
        attn = f"model.layers.{i}.self_attn"
        if hasattr(layer.self_attn, "kv_b_proj"):  # multi-head latent attention: its own two functions' places
            split_latent(layer.self_attn, attn, keep_slice, leave, group)
            dense = []
        else:
            dense = [(layer.self_attn, attn, ATTENTION, ROW[0])]
        dense += [(mlp, prefix, MLP, ROW[1]) for mlp, prefix in dense_mlps(layer.mlp, f"model.layers.{i}.mlp")]
        for block, prefix, columns, _ in dense:
            for name in columns:
                keep_slice(block, name, prefix)
            block.register_forward_pre_hook(enter)
        for block, prefix, _, row in dense:
            keep_slice(block, row, prefix)
            getattr(block, row).register_forward_post_hook(leave)
        experts = getattr(layer.mlp, "experts", None)
        if experts is not None:  # each routed expert cut like an MLP; the two functions around the experts alone
            for e in range(experts.first, experts.first + experts.count):
                for name in MLP + ROW[1:]:
                    keep_slice(experts[e], name, f"model.layers.{i}.mlp.experts.{e}")  # (run by `TPDispatch`)
    return split


def head_shared(layers) -> list:
    """The whole weights of this stage's attention regions that every head shares (Qwen3's `q_norm` / `k_norm`): each
    tp rank applies them to its own heads only, so its gradient is those heads' part, which `sum_grads` sums over the
    tp group (without it the tp ranks' copies drifted apart and the checkpoint kept the first's: Qwen3 and Qwen3-MoE
    under tp x pp, tp + sp, tp x cp and ep x tp left one process by 2.8e-5 to 7.8e-5 in 6 steps)."""
    out = []
    for layer in list(layers) + list(getattr(layers, "mtp", [])):
        if not layer.input_layernorm.weight._is_initialized():  # another stage's layer
            continue
        out += [norm.weight for norm in (getattr(layer.self_attn, "q_norm", None),
                                         getattr(layer.self_attn, "k_norm", None)) if norm is not None]
    return out


def sum_grads(params: list, group) -> None:
    """Gradients that each cover this rank's part only (its heads: `head_shared`; its positions: sequence
    parallelism's norms, `sequence_parallel.hook_model`) summed over the tp `group`, once a step: the whole one."""
    for p in params:
        if p.grad is not None:
            dist.all_reduce(p.grad, group=group)


def split_latent(attn, prefix: str, keep_slice, leave, group) -> None:
    """Multi-head latent attention (`models.mla`) cut by heads: its per-head up-projections (`q_proj` or `q_b_proj`,
    `kv_b_proj`) column-parallel, `o_proj` row-parallel (`leave`: the sum, the bias once), the down-projections,
    their norms and the one RoPE key every head shares whole on every tp rank. Megatron's f goes where the whole
    part meets the per-head one, not on the block's input: on the inputs of the up-projections and on the shared
    RoPE key (the rope columns of `kv_a_proj_with_mqa`'s output). Each rank's heads give those a partial gradient,
    summed there, so everything before them (the latents' projections and norms, the block input) gets the whole
    gradient on every tp rank, as a replicated weight must; an f on the block input would leave the latents'
    weights with one rank's part. Sequence parallelism's regions are not used here (refused: `config.refusals`)."""
    copy_to_tp = all_reduce_regions(group)[0]
    rank = attn.kv_lora_rank

    def enter(layer, inputs):
        return (copy_to_tp(inputs[0]),) + tuple(inputs[1:])

    def shared_key(layer, inputs, out):
        import paddle

        latent, rope = paddle.split(out, [rank, out.shape[-1] - rank], axis=-1)
        return paddle.concat([latent, copy_to_tp(rope)], axis=-1)  # [bsz, seq_len, kv_lora_rank + rope]

    for name in LATENT:
        if hasattr(attn, name):
            keep_slice(attn, name, prefix)
            getattr(attn, name).register_forward_pre_hook(enter)
    attn.kv_a_proj_with_mqa.register_forward_post_hook(shared_key)
    keep_slice(attn, ROW[0], prefix)
    attn.o_proj.register_forward_post_hook(leave)


def dense_mlps(mlp, prefix: str) -> list:
    """[(MLP, its HF prefix)] a layer's `mlp` holds whole-token MLPs in: itself when dense, a sparse block's shared
    expert (Qwen2-MoE `shared_expert`, DeepSeek `shared_experts`) when it has one; its routed experts are not."""
    if getattr(mlp, "experts", None) is None:
        return [(mlp, prefix)]
    return [(getattr(mlp, n), f"{prefix}.{n}") for n in ("shared_expert", "shared_experts")
            if getattr(mlp, n, None) is not None]


class SlicedExperts:
    """Stands in for `moe.Experts` inside `moe.dispatch_local` (which only calls `experts(rows, counts)`): the
    grouped kernel over `weights` (this rank's [(gate, up, down)] blocks), between Megatron's two functions over
    the tp `group` (None: no tensor parallelism). `idle` (`moe.Experts.idle`, or None where the data ranks' reduction
    does not need it): the zero term that gives an expert no row reached a zero gradient, not none, as one
    process's `Experts` adds it (the segmented kernel skips an empty expert; a data rank without its gradient
    would reduce other tensors than the rest)."""

    def __init__(self, kernels, weights: list, group, idle=None):
        self.kernels, self.weights, self.group, self.idle = kernels, weights, group, idle

    def __call__(self, rows, counts: list[int]):
        if self.group is not None:
            rows = CopyToTP.apply(rows, self.group)  # every tp rank's slice read the rows: their gradient summed
        out = self.kernels.grouped_mlp(rows, counts, self.weights, self.kernels.swiglu_packed)  # [rows, hidden]
        if self.group is not None:
            out = ReduceFromTP.apply(out, self.group)  # the row-parallel parts summed before the combine weights
        idle = self.idle(counts) if self.idle is not None else None  # (a tp group's ranks route alike)
        return out if idle is None else out + idle.astype(out.dtype)  # [rows, hidden]


def expert_weights(experts, read) -> list:
    """[(gate, up, down)] of every held expert, each through `read`."""
    out = []
    for e in range(experts.first, experts.first + experts.count):
        x = experts[e]
        out.append((read(x.gate_proj.weight), read(x.up_proj.weight), read(x.down_proj.weight)))
    return out


class TPDispatch:
    """`SparseMoeBlock.dispatch` under the manual `tp` step (the kernel table's `moe_dispatch`, `order._tp_kernels`):
    the experts' sliced weights (`split_layers`) between the two functions over the tp group, everything else as one
    process."""

    def __init__(self, group):
        self.group = group

    def __call__(self, x, routing, experts, num_experts: int, capacity_factor: float = 0.0):
        from pretrain_cli.models.moe import dispatch_local

        sliced = SlicedExperts(experts.kernels, expert_weights(experts, lambda w: w), self.group, experts.idle)
        return dispatch_local(x, routing, sliced, num_experts, capacity_factor)
