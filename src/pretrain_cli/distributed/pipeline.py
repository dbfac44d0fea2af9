"""Pipeline parallelism on fleet's engine: the finished single-device model cut into stages from outside.

The decoder's own pieces become fleet `PipelineLayer` items: the embedding, one item per decoder layer, the final
norm, and the LM head's weight. `stage_bounds` splits the decoder layers over the stages as evenly as they go (the
embedding rides with the first, the norm and head with the last); `stage_of` is the same split by HF tensor name,
which the checkpoint code uses to know which rank holds what. Every stage reads the same micro-batches; the first
feeds them in, the last computes the loss (the fused head + loss needs the labels, which only it sees). Packed-
document fields (`position_ids`, `doc_start`) travel between stages with the hidden states.

Tied embeddings: the last stage holds the embedding's weight as a fleet `SharedLayerDesc` (the first stage's value
broadcast at build); after backward fleet all-reduces the two copies' gradients, so both get the same update, as
the one tied weight of one process does. The gradient norm counts the copy once.

Per step `forward_backward` hands the step's micro-batches to fleet's 1F1B schedule
(`PipelineParallel.forward_backward_pipeline`, `train_batch` before its optimizer step); clipping, the non-finite
policy and the update stay the trainer's. With `virtual_pp_degree` V > 1 the decoder is cut into P x V chunks,
stage s holding chunks s, s + P, ..., run by fleet's `PipelineParallelWithInterleave` (interleaved 1F1B).
DP: gradients all-reduced over "dp" after the schedule; ZeRO-1: fleet's `DygraphShardingOptimizer` over each
stage's "sharding" axis; ZeRO-2 the same, each rank releasing the gradients it does not own after every update.
TP: each decoder layer cut to this rank's tp slice before the stages are built; each rank writes its slices.
fleet's groups are the run's `Topology` (stages outermost); the CPU workarounds are `Topology.init_fleet`'s and
`distributed/gloo.py`'s (the shared-weight group's own store; stage-to-stage sends over two-rank groups).
"""
from __future__ import annotations

import re

from pretrain_cli.distributed.gloo import neighbour_sends, separate_stores
from pretrain_cli.distributed.pieces import split_name
from pretrain_cli.distributed.strategy import FleetHybrid
from pretrain_cli.models.stages import stage_bounds
from pretrain_cli.run_config import Loop, ParallelConfig


def stage_of(name: str, bounds: list[int], stages: int | None = None) -> int:
    """The stage that holds (the first copy of) an HF-named tensor, by its global layer index. `bounds` has one
    part per model chunk; with virtual stages (`stages` < parts) chunk c runs on stage c mod `stages`, as in
    fleet's interleaved schedule (stage 0 holds chunks 0, P, 2P, ...)."""
    parts = len(bounds) - 1
    m = re.match(r"model\.layers\.(\d+)\.", name)
    if m:
        i = int(m.group(1))
        chunk = max(s for s in range(parts) if bounds[s] <= i)
    else:
        chunk = 0 if name.startswith("model.embed_tokens.") else parts - 1  # model.norm, lm_head: the last
    return chunk % (stages or parts)


def pipeline_configs(loop: Loop, parallel: ParallelConfig) -> dict:
    """fleet's `pipeline_configs` for the run's micro-batching (`Topology.init_fleet` hands them to fleet). Shapes
    are sent with every message (evaluation sends another batch size than training); fleet's interleaved schedule
    insists on its shape cache, which `Pipeline.wrap` then clears after every step instead."""
    return {"accumulate_steps": loop.grad_accum, "micro_batch_size": loop.micro_batch,
            "p2p_cache_shape": parallel.virtual_pp_degree > 1}


def _layers():
    """The stage items (classes built on first use: paddle is imported lazily)."""
    import paddle.nn as nn

    class Embed(nn.Layer):
        """First stage: token ids (+ document fields) -> (hidden, *document fields)."""

        def __init__(self, embed_tokens):
            super().__init__()
            self.embed_tokens = embed_tokens

        def forward(self, inputs):
            return embed(self.embed_tokens, inputs)

    class TiedWeight(nn.Layer):
        """The embedding's weight as fleet's shared layer: first stage (lookup) and last (head)."""

        def __init__(self, embed_tokens):
            super().__init__()
            self.weight = embed_tokens.weight
            self._embedding = [embed_tokens]  # not a sublayer: the weight above is its only parameter

    class Block(nn.Layer):
        """One decoder layer; RoPE tables from the model's own rotary embedding."""

        def __init__(self, layer, rotary, parts: int = 1):
            super().__init__()
            self.layer, self._rotary, self.parts = layer, [rotary], parts  # parts: sequence shards of its input

        def forward(self, inputs):
            x, *doc = inputs if isinstance(inputs, tuple) else (inputs,)
            cos, sin = self._rotary[0](x.shape[1] * self.parts)  # the whole sequence's positions
            if doc:  # fleet frees what a stage sends; this stage's backward (and recompute) still reads its own
                return (self.layer(x, cos, sin, None, *doc),) + tuple(d.clone() for d in doc)
            return self.layer(x, cos, sin)

    class Final(nn.Layer):
        """The final norm: the hidden states the loss reads (document fields end here)."""

        def __init__(self, norm):
            super().__init__()
            self.norm = norm

        def forward(self, inputs):
            return self.norm(inputs[0] if isinstance(inputs, tuple) else inputs)

    class Head(nn.Layer):
        """An untied LM head's weight on the last stage (the fused head + loss reads it in the loss)."""

        def __init__(self, lm_head):
            super().__init__()
            self.lm_head = lm_head

        def forward(self, h):
            return h

    return Embed, TiedWeight, Block, Final, Head


def embed(embed_tokens, inputs):
    ids, *doc = inputs if isinstance(inputs, tuple) else (inputs,)
    x = embed_tokens(ids)
    return (x,) + tuple(doc) if doc else x


def _tied_lookup(shared, inputs):
    return embed(shared._embedding[0], inputs)


def _tied_head(shared, h):
    return h


class StageLoss:
    """The last stage's loss: the model's own head + loss on the final hidden states. `sum_mode` (evaluation)
    returns the sum of token losses instead of their mean."""

    __name__ = "StageLoss"

    def __init__(self, lm):
        self.lm, self.sum_mode = lm, False

    def __call__(self, h, labels):
        from pretrain_cli.ops.loss import mean_loss

        total, count = self.lm.loss_sum(h, labels)
        return total if self.sum_mode else mean_loss(total, count)


def build_pipeline_layer(lm, parallel: ParallelConfig):
    """fleet's PipelineLayer over `lm`'s own sublayers (the same parameter objects: nothing is copied)."""
    import paddle
    from paddle.distributed import fleet
    from paddle.distributed.fleet.meta_parallel import PipelineLayer, SharedLayerDesc

    Embed, TiedWeight, Block, Final, Head = _layers()
    dec, tied = lm.model, lm.lm_head is None
    items = [SharedLayerDesc("embed_tokens", TiedWeight, _tied_lookup, "weight", embed_tokens=dec.embed_tokens)
             if tied else Embed(dec.embed_tokens)]
    parts = parallel.tp_degree if parallel.sequence_parallel else 1  # after layer 0 the stream is cut (SP)
    items += [Block(layer, dec.rotary_emb, parts if i else 1) for i, layer in enumerate(dec.layers)]
    items.append(Final(dec.norm))
    items.append(SharedLayerDesc("embed_tokens", TiedWeight, _tied_head, "weight", embed_tokens=dec.embed_tokens)
                 if tied else Head(lm.lm_head))
    pp, vpp = parallel.pp_degree, parallel.virtual_pp_degree
    bounds = stage_bounds(len(dec.layers), pp * vpp)  # one part per model chunk (a stage's, without virtual stages)
    seg = [0] + [b + 1 for b in bounds[1:-1]] + [len(items)]  # item 0 is the embedding
    if vpp > 1:  # fleet splits equal chunks itself (a list is read as P parts): config checks layers % (P x V) == 0
        seg = "layer:^Block$"
    loss = StageLoss(lm)
    gloo = paddle.get_device().startswith("cpu")
    hcg = fleet.get_hybrid_communicate_group()
    with separate_stores(gloo):  # the tied embedding's first-last stage group; on gloo the stage-pair groups
        layer = PipelineLayer(layers=items, num_stages=pp, loss_fn=loss, seg_method=seg, topology=hcg.topology(),
                              num_virtual_pipeline_stages=vpp)  # the run's Topology
        if gloo:
            neighbour_sends(hcg)
    return layer, loss, bounds


class Pipelined:
    """fleet's `PipelineParallel` as the trainer's model: parameters, train/eval, and `model(ids, labels=...)`
    for evaluation (a forward-only pass of the pipeline; returns the global sums like a plain model)."""

    def __init__(self, engine, loss):
        self.engine, self.loss = engine, loss

    def __getattr__(self, name):
        return getattr(self.engine, name)

    def __call__(self, ids, labels=None, **extra):
        import paddle

        from pretrain_cli.ops.loss import IGNORE_INDEX

        pp = self.engine
        # fleet's interleaved schedule needs a micro-batch per stage: the batch, then copies whose labels are all
        # ignored (their loss sums are 0); fleet divides the sum by the micro-batch count, multiplied back below
        k = pp.num_stages if getattr(pp, "num_model_chunks", 1) > 1 else 1
        batch, target = inputs_of(ids, extra), labels
        if k > 1:
            repeat = lambda t: paddle.concat([t] * k, axis=0)  # noqa: E731  [k * rows, seq_len]
            batch = tuple(map(repeat, batch)) if isinstance(batch, tuple) else repeat(batch)
            target = paddle.concat([labels] + [paddle.full_like(labels, IGNORE_INDEX)] * (k - 1), axis=0)
        saved = pp.accumulate_steps, pp.micro_batch_size
        pp.accumulate_steps, pp.micro_batch_size = k, ids.shape[0]
        self.loss.sum_mode = True
        try:
            total = pp.eval_batch([batch, target], compute_loss=True) * k
        finally:
            pp.accumulate_steps, pp.micro_batch_size = saved
            self.loss.sum_mode = False
        count = (labels != IGNORE_INDEX).astype("float32").sum()
        return paddle.reshape(total, []), count


def inputs_of(ids, extra: dict):
    from pretrain_cli.data.loader import DOCUMENT_FIELDS

    doc = [extra[k] for k in DOCUMENT_FIELDS if k in extra]
    return (ids, *doc) if doc else ids


class Pipeline(FleetHybrid):
    """`pipeline_parallel_degree > 1`, with tensor parallelism inside the stages and data parallelism / ZeRO-1/2 on
    the topology's "dp" / "sharding" axes."""

    def __init__(self, parallel: ParallelConfig, device: str = "cpu", step_kernels=None):
        super().__init__(parallel, device, step_kernels)
        zero = f", ZeRO-{parallel.sharding_stage} over {parallel.sharding_degree}" if parallel.sharding_stage else ""
        virtual = f" x{parallel.virtual_pp_degree} virtual" if parallel.virtual_pp_degree > 1 else ""
        tp = f" x tp {parallel.tp_degree}" if parallel.tp_degree > 1 else ""
        self.name = f"pipeline (fleet 1F1B): pp {parallel.pp_degree}{virtual}{tp} x dp {parallel.data_world_size}{zero}"
        self.lm = self.loss = self.bounds = None
        self.tp_dims: dict = {}  # HF name -> the Paddle dim its tensor-parallel slice is cut on
        self._seq_params: list = []  # SP: the parameters whose gradients cover this rank's positions only

    # ------------------------------------------------------------------ building
    def place(self, model, source=None):
        """The stages over `model`'s own sublayers (each decoder layer cut to this rank's tp slice); the optimizer
        is then built over this stage's parameters. A lazily built model gets only this stage's parameters created
        (from `source`; a tied embedding also on the last stage, whose copy fleet broadcasts from the first), the
        others' never have storage (an eagerly built one has theirs freed); under tp the tensor-parallel weights
        are created as this rank's slices only (`tensor_parallel.split_layers`), never whole."""
        from pretrain_cli.distributed.materialize import fill
        from pretrain_cli.distributed.tensor_parallel import cut_by_tp

        self.lm = model
        tp = self.parallel.tp_degree > 1
        if source is not None:
            pp, stage = self.parallel.pp_degree, self.topology.stage
            bounds = stage_bounds(len(model.model.layers), pp * self.parallel.virtual_pp_degree)  # one part per chunk
            tied = model.lm_head is None and stage == pp - 1
            fill(model, source, lambda name: (stage_of(name, bounds, pp) == stage and not (tp and cut_by_tp(name)))
                 or (tied and name == "model.embed_tokens.weight"))
        if tp:
            self._split_tensor_parallel(model, source)
        layer, self.loss, self.bounds = build_pipeline_layer(model, self.parallel)
        held = {id(p) for p in layer.parameters()}
        for p in model.parameters():  # names and shapes stay (checkpoint pieces are by name)
            if id(p) not in held and p._is_initialized():
                p._clear_data()
        return layer

    def _split_tensor_parallel(self, model, source=None) -> None:
        from paddle.distributed import fleet

        from pretrain_cli.distributed.tensor_parallel import split_layers

        group = fleet.get_hybrid_communicate_group().get_model_parallel_group()  # the topology's "mp" group
        tp, tp_rank, regions = self.parallel.tp_degree, self.topology.tp_rank, None
        if self.parallel.sequence_parallel:
            from pretrain_cli.distributed import sequence_parallel as sp

            gloo = self.device == "cpu"  # the one CPU switch: reduce-scatter as all-reduce + slice
            self._seq_params = sp.hook_model(model, group, tp, tp_rank, gloo)
            regions = sp.functions(tp, tp_rank, gloo)[:2]
        dims = split_layers(model.model.layers, tp, tp_rank, group, source, regions)
        self.tp_dims = {name: dims[id(p)] for name, p in model.named_parameters() if id(p) in dims}  # HF names

    def wrap(self, model, optimizer):
        from paddle.distributed import fleet

        engine = fleet.distributed_model(model)
        if self.parallel.virtual_pp_degree > 1:
            engine._clear_every_step_cache = True  # shapes sent again each step (evaluation's batch size differs)
        return Pipelined(engine, self.loss), self.shard(model, optimizer)

    def shard(self, model, optimizer):
        """fleet's ZeRO-1 (also ZeRO-2's) over each stage's sharding group, and which gradients this rank counts
        in the norm (its owned ones; a tied embedding's second copy not; tp slices apart from whole tensors)."""
        from paddle.distributed import fleet

        self.hcg = fleet.get_hybrid_communicate_group()
        self.pp_group = self.hcg.get_pipe_parallel_group()
        self._params = list(model.parameters())
        self._owned, self._hpo = self._params, None
        if self.parallel.sharding_stage:
            optimizer = self._hpo = fleet.distributed_optimizer(optimizer)
            self._owned = self._hpo._inner_opt.filter_parameters(self._params, self.hcg)
        tied = self.lm.lm_head is None and self.topology.stage > 0
        counted = [p for p in self._owned if not (tied and p is self.lm.model.embed_tokens.weight)]
        sliced = {id(p) for p in self.lm.parameters() if getattr(p, "is_distributed", False)}
        self._counted = ([p for p in counted if id(p) not in sliced], [p for p in counted if id(p) in sliced])
        return optimizer

    # ------------------------------------------------------------------ a step
    def forward_backward(self, model, batches: list, amp, forward_loss=None):
        """The step's micro-batches through fleet's 1F1B schedule (the stages compute the loss: `forward_loss` is
        not used); the summed mean loss (every stage gets it)."""
        import paddle

        from pretrain_cli.data.loader import DOCUMENT_FIELDS

        column = lambda key: [paddle.to_tensor(b[key]) for b in batches]  # noqa: E731  int64 [micro, seq_len] each
        fields = [k for k in DOCUMENT_FIELDS if k in batches[0]]  # the order `Block` passes them to the layer
        first = tuple([column("input_ids")] + [column(k) for k in fields]) if fields else column("input_ids")
        labels = column("labels")
        with amp.autocast():
            loss = model.engine.forward_backward_pipeline([first, labels], amp.scaler)
        return paddle.reshape(loss, [])

    def sync_grads(self) -> None:
        """Sequence parallelism: the norms' gradients summed over the tp group first. Then ZeRO-1/2: fleet's
        optimizer (`FleetHybrid`: each gradient reduced to its owner); else the mean over this stage's replicas."""
        if self._seq_params:  # a stage's own (another stage's norms have no gradient here)
            from pretrain_cli.distributed import sequence_parallel as sp

            sp.sum_grads(self._seq_params, self.hcg.get_model_parallel_group())
        if self._hpo is None and self.parallel.data_world_size > 1:
            from paddle.distributed.fleet.utils.hybrid_parallel_util import fused_allreduce_gradients

            fused_allreduce_gradients(self._params, self.hcg)
        else:
            super().sync_grads()

    def step(self, optimizer) -> None:
        """ZeRO-2: after the update the gradients this rank does not own are released (their owner alone read them;
        the next backward creates them again). Not earlier: fleet's broadcast skips a parameter with no gradient."""
        super().step(optimizer)
        if self.parallel.sharding_stage == 2:
            owned = {id(p) for p in self._owned}
            for p in self._params:
                if id(p) not in owned:
                    p.clear_gradient(False)  # storage released, not zeroed

    def grad_params(self, model) -> list:
        return self._owned

    def grad_norm(self, model):
        """Each stage's squared norm (ZeRO-1: each owner's part), summed over the pipeline; a tied weight's second
        copy is counted once, a tensor-parallel slice's part summed over its tp group, whole tensors once."""
        import paddle
        import paddle.distributed as dist

        whole, sliced = ([p.grad for p in ps if p.grad is not None] for ps in self._counted)
        sq = self.step_kernels.global_sq_norm(whole)
        if self.parallel.tp_degree > 1:
            part = self.step_kernels.global_sq_norm(sliced) if sliced else paddle.zeros_like(sq)
            dist.all_reduce(part, op=dist.ReduceOp.SUM, group=self.hcg.get_model_parallel_group())
            sq = sq + part
        if self._hpo is not None:
            dist.all_reduce(sq, op=dist.ReduceOp.SUM, group=self.hcg.get_sharding_parallel_group())
        dist.all_reduce(sq, op=dist.ReduceOp.SUM, group=self.pp_group)
        return paddle.sqrt(sq)

    def local_bytes(self, model, optimizer) -> dict:
        """Also the gradients held between steps (reported after the first update): every parameter's under
        ZeRO-1 (zeroed in place), only the owned ones' under ZeRO-2."""
        out = super().local_bytes(model, optimizer)
        out["gradients"] = sum(int(p.grad.numel()) * p.grad.element_size() for p in self._params
                               if p.grad is not None and p.grad._is_initialized())
        return out

    # ------------------------------------------------------------------ checkpoints
    def pieces(self, model, optimizer=None) -> list:
        """Only this stage's tensors (the whole model object exists on every rank, but only the stage's layers
        train here): each stage writes its own layers' weights and state, by HF name (`stage_of`). A tied
        embedding's copy on the last stage is the first stage's tensor: written once, from there."""
        stage, pp = self.topology.stage, self.parallel.pp_degree
        held = super().pieces(model, optimizer)
        return [p for p in held if stage_of(split_name(p.name)[0], self.bounds, pp) == stage]

    def holders(self, tensor, kind: str, sliced: bool = False) -> tuple:
        """The ranks of this stage (its data-parallel and tensor-parallel replicas); a tensor-parallel slice only
        on the ranks with this tp coordinate; under ZeRO-1/2 the optimizer state only on the replicas of its owner
        (the same coordinate on the stage's "sharding" axis)."""
        owned = kind == "optimizer" and self.parallel.sharding_stage
        return self.topology.replicas("pp", *(("sharding",) if owned else ()), *(("mp",) if sliced else ()))

    def local_box(self, tensor, name: str | None = None):
        """A tensor-parallel slice (the weight or its moments and master copy, by HF name): its block of the
        global tensor, cut on `tp_dims[name]` at this rank's tp coordinate; anything else whole."""
        hf, slot = split_name(name or "")
        dim = self.tp_dims.get(hf)
        if dim is None or slot not in (None, "moment1", "moment2", "master"):
            return super().local_box(tensor, name)
        from pretrain_cli.distributed.pieces import Box

        shape = tuple(tensor.shape)
        whole, offsets = list(shape), [0] * len(shape)
        whole[dim], offsets[dim] = shape[dim] * self.parallel.tp_degree, shape[dim] * self.topology.tp_rank
        kind = "weights" if not slot else "optimizer"
        return Box(tuple(whole), tuple(offsets), shape), self.holders(tensor, kind, sliced=True)
