"""Pipeline parallelism on fleet's engine: the finished single-device model cut into stages from outside.

The cut itself is the `pp` layout step (`distributed.steps.pipeline_stages`: the model's own sublayers as fleet
`PipelineLayer` items); `stage_of` (`distributed.strategies.hybrid`) is the same split by HF tensor name, which the
checkpoint code uses to know which rank holds what. Every stage reads the same micro-batches; the first feeds them in,
the last computes the loss (the fused head + loss needs the labels, which only it sees).

Tied embeddings (and DeepSeek-V3's multi-token prediction, which looks the input ids up on the last stage): the last
stage holds the embedding's weight as a fleet `SharedLayerDesc` (the first stage's value broadcast at build); after
backward fleet all-reduces the two copies' gradients, so both get the same update, as the one weight of one process
does. The gradient norm counts the copy once, the checkpoint writes it once (from the first stage). The MTP loss
and a MoE model's router losses are logged from the last stage's values, summed over its data ranks
(`Strategy.share_logged`), the per-layer expert load from every stage's layers and data ranks
(`Pipeline.whole_model_rows`).

Per step `forward_backward` hands the step's micro-batches to fleet's 1F1B schedule
(`PipelineParallel.forward_backward_pipeline`, `train_batch` before its optimizer step); clipping, the non-finite
policy and the update stay the trainer's. With `virtual_pp_degree` V > 1 the decoder is cut into P x V chunks,
stage s holding chunks s, s + P, ..., run by fleet's `PipelineParallelWithInterleave` (interleaved 1F1B).
DP: gradients all-reduced over "dp" after the schedule; ZeRO-1: fleet's `DygraphShardingOptimizer` over each
stage's "sharding" axis; ZeRO-2 the same, each rank releasing the gradients it does not own after every update.
TP: each decoder layer cut to this rank's tp slice before the stages are built; each rank writes its slices.
fleet's groups are the run's `Topology` (stages outermost); the CPU workarounds are the collectives backend's
(`distributed.comms.collectives`: the shared-weight group's own store; stage-to-stage sends over two-rank groups).
"""
from __future__ import annotations

from pretrain_cli.distributed.strategies.hybrid import Hybrid, stage_of  # noqa: F401  (stage_of: the split by HF name)
from pretrain_cli.run_config import Loop
from pretrain_cli.run_layout import ParallelConfig



def pipeline_configs(loop: Loop, parallel: ParallelConfig) -> dict:
    """fleet's `pipeline_configs` for the run's micro-batching (`Topology.init_fleet` hands them to fleet). Shapes
    are sent with every message (evaluation sends another batch size than training); fleet's interleaved schedule
    insists on its shape cache, which fleet then clears after every step instead (`Topology.init_fleet`).
    Activations go whole to the next stage under sequence parallelism, where each tp rank holds its own part of
    the sequence (fleet's partial send is right only for a tensor every tp rank holds alike; the backend may
    send whole anyway: `Collectives.pipeline_flags`)."""
    return {"accumulate_steps": loop.grad_accum, "micro_batch_size": loop.micro_batch,
            "p2p_cache_shape": parallel.virtual_pp_degree > 1,
            "enable_partial_send_recv": not parallel.sequence_parallel}


class Pipelined:
    """fleet's `PipelineParallel` as the trainer's model: parameters, train/eval, and `model(ids, labels=...)`
    for evaluation (a forward-only pass of the pipeline; returns the global sums like a plain model)."""

    def __init__(self, engine, loss, sequence=None):
        self.engine, self.loss, self.sequence = engine, loss, sequence  # sequence: context.ContextSide or None

    def __getattr__(self, name):
        return getattr(self.engine, name)

    def __call__(self, ids, labels=None, **extra):
        import paddle

        from pretrain_cli.ops.loss import IGNORE_INDEX

        pp = self.engine
        # fleet's interleaved schedule needs a micro-batch per stage: the batch, then copies whose labels are all
        # ignored (their loss sums are 0); fleet divides the sum by the micro-batch count, multiplied back below
        k = pp.num_stages if getattr(pp, "num_model_chunks", 1) > 1 else 1
        batch, target = inputs_of(ids, extra, self.sequence), labels
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
        if self.sequence is not None:  # the loss summed x C (`StageLoss`); the cp group's count
            _, count = self.sequence.whole_sequence(total, count)
        return paddle.reshape(total, []), count


def inputs_of(ids, extra: dict, sequence=None):
    """The first stage's input: the ids, then the document fields in the order `Block` passes them to the layer
    (positionally: `position_ids`, `doc_start`), so `position_ids` is always there when `doc_start` is: the
    tokens' global positions under context parallelism (`sequence`), else 0 … seq_len − 1 (what none means)."""
    import paddle

    from pretrain_cli.data.loader import DOCUMENT_FIELDS

    if "position_ids" not in extra and (sequence is not None or "doc_start" in extra):
        positions = (sequence.positions(*ids.shape) if sequence is not None
                     else paddle.arange(ids.shape[1], dtype="int64").expand(ids.shape))  # [bsz, seq_len]
        extra = dict(extra, position_ids=positions)
    doc = [extra[k] for k in DOCUMENT_FIELDS if k in extra]
    return (ids, *doc) if doc else ids


class Pipeline(Hybrid):
    """`pipeline_parallel_degree > 1`, with tensor parallelism inside the stages and data parallelism / ZeRO-1/2 on
    the topology's "dp" / "sharding" axes."""

    def __init__(self, parallel: ParallelConfig, device: str = "cpu", step_kernels=None, recompute=None):
        super().__init__(parallel, device, step_kernels, recompute)
        self.name = f"pipeline (fleet 1F1B): {parallel.axes()}{parallel.fleet_sharding()}"  # check's words

    def wrap(self, model, optimizer):
        from paddle.distributed import fleet

        engine = fleet.distributed_model(model)  # (its shape cache cleared every step: `Topology.init_fleet`)
        return Pipelined(engine, self.loss, self.sequence), self.shard(model, optimizer)

    def forward_backward(self, model, batches: list, amp, forward_loss=None):
        """The step's micro-batches through fleet's 1F1B schedule (the stages compute the loss: `forward_loss` is
        not used); the summed mean loss (every stage gets it)."""
        import paddle

        from pretrain_cli.data.loader import DOCUMENT_FIELDS
        from pretrain_cli.ops.tensors import from_numpy

        # int64 [micro, seq_len] each (context parallelism: this rank's [micro, seq_len / cp] chunks)
        column = lambda key: [self.shard_batch(from_numpy(b[key])) for b in batches]  # noqa: E731 (to_tensor leaks)
        fields = [k for k in DOCUMENT_FIELDS if k in batches[0]]
        columns = {k: column(k) for k in ["input_ids", *fields]}
        firsts = [inputs_of(ids, {k: columns[k][i] for k in fields}, self.sequence)
                  for i, ids in enumerate(columns["input_ids"])]  # per micro-batch: ids (+ its fields)
        # fleet's micro-batching: one list per input, each of the micro-batches
        first = tuple(list(f) for f in zip(*firsts)) if isinstance(firsts[0], tuple) else firsts
        labels = column("labels")
        with amp.autocast():
            loss = model.engine.forward_backward_pipeline([first, labels], amp.scaler)
        return paddle.reshape(loss, [])

    def _computes_logged(self) -> bool:
        """The last stage's loss computes the logged losses (`models.mtp.mtp_term`, `models.moe_loss.router_loss`)
        while rank 0, on the first, writes the log line: the other stages add zeros (`Strategy.share_logged`)."""
        return self.topology.stage == self.parallel.pp_degree - 1

    def whole_model_rows(self, rows):
        """Every stage's per-layer load rows (`models.moe_loss.load_rows`), in stage order, hence layer order (the
        last stage's MTP layers last, as one process lists them), each summed over the stage's ranks: the counts of
        all data ranks' tokens, as one process counts them (a tp rank's copy doubles a layer's every count: its
        shares are unchanged). Two all-reduces over every rank (the stages' row counts, then the rows, each in its
        stage's place), at log time only (their tensors by `ops.tensors.from_numpy`: `paddle.to_tensor` leaks). A
        stage without sparse layers (DeepSeek's first, dense ones) sends no rows but its place in the counts; the
        rows' all-reduce is skipped on every rank alike when no stage has any (gloo takes no zero-element one)."""
        import numpy as np
        import paddle.distributed as dist

        from pretrain_cli.ops.tensors import from_numpy

        pp, stage = self.parallel.pp_degree, self.topology.stage
        counts = np.zeros([pp], dtype="float32")
        counts[stage] = len(rows)
        sizes = from_numpy(counts)  # [stages]
        dist.all_reduce(sizes, op=dist.ReduceOp.MAX)
        sizes = [int(x) for x in sizes.numpy()]
        whole = np.zeros([sum(sizes), rows.shape[1]], dtype="float32")  # [layers, experts + 1]
        if not whole.size:  # (the same sizes on every rank)
            return whole
        start = sum(sizes[:stage])
        whole[start:start + len(rows)] = rows
        out = from_numpy(whole)  # [layers, experts + 1]
        dist.all_reduce(out, op=dist.ReduceOp.SUM)
        return out.numpy()
