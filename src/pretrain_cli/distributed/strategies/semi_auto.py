"""ZeRO-2/3 and tensor parallelism on Paddle's semi-auto engine (`dist.shard_layer`, `dist.shard_optimizer`).

The ranks form the topology's 2-D mesh `[dp, mp]` (`Topology.mesh`: data ranks by tp ranks). On "mp" the
decoder is split by the one TP plan (`models.tp_plan`): q/k/v and gate/up column-parallel (weight `Shard(1)`,
bias `Shard(0)`), o and down row-parallel (weight `Shard(0)`), the embedding and LM head over the
vocabulary when tp divides it; RMSNorm and RoPE stay replicated. On "dp" each rank reads its slice of
the global batch (`Shard(0)`), and `dist.shard_optimizer(ShardingStage{1,2,3}("dp"))` shards the
AdamW state (stage 1), the gradients the update uses (2) and the parameters themselves (3).
Paddle's SPMD rules insert every collective; nothing here is a hand-written one.

On CPU, two workarounds (ARCHITECTURE.md facts: gloo; custom ops under semi-auto): the `to_replicated` gradient hook
(gloo has no reduce-scatter, so Partial gradients are all-reduced instead: ZeRO-2/3's gradient memory saving
happens only on GPU), and our fused CPU kernels run on local pieces (`local_kernels`). The model arrives
built with those kernels (`distributed.steps.order.build_kernels`, in `training.run.build_model`): nothing of a live
layer is replaced here.
"""
from __future__ import annotations

import functools

from pretrain_cli.distributed.strategies.strategy import Strategy, step_grad
from pretrain_cli.models.tp_plan import split_dim
from pretrain_cli.run_layout import ParallelConfig


class SemiAuto(Strategy):
    global_batch = True

    def __init__(self, parallel: ParallelConfig, device: str = "cpu", step_kernels=None, recompute=None):
        super().__init__(parallel, device, step_kernels, recompute)
        self.hook = self.backend.gradient_hook  # gloo: Partial gradients all-reduced whole (None on NCCL)
        self.name = f"semi-auto: {parallel.axes()}"  # check's words
        self.mesh = None
        self.vocab = parallel.vocab_parallel  # config.resolve: the embedding and LM head split over the vocabulary

    # ------------------------------------------------------------------ building
    def place(self, model, source=None):
        """A lazily built model's parameters are created here at their final size from `source`
        (`distributed.layout.materialize`): TP slices at once; under ZeRO-3 they stay without storage until
        `wrap`, whose `ShardingStage3` creates each as its dp shard, so no rank ever holds a whole one."""
        import paddle.distributed as dist

        model = self.apply_steps(model, source)  # (recompute: the steps before the data side)
        self.mesh = self.topology.mesh()
        self._source = source
        dist.shard_layer(model, self.mesh, self._shard_fn)
        self._names = {id(param): name for name, param in model.named_parameters()}
        if self.hook is not None:
            for param in model.parameters():
                if not param.stop_gradient:  # (a MoE router's balancing bias has no gradient)
                    param.register_hook(self.hook)  # before shard_optimizer registers its own
        return model

    def _placements(self, tp_dim=None) -> list:
        import paddle.distributed as dist

        mp = dist.Shard(tp_dim) if tp_dim is not None and self.parallel.tp_degree > 1 else dist.Replicate()
        return [dist.Replicate(), mp]

    def _shard_fn(self, name: str, layer, mesh) -> None:
        """Every parameter on "mp" where the one TP plan splits it (`models.tp_plan.split_dim`, Paddle Linear
        weights are [in, out]; the vocabulary only when `vocab`), else replicated, with one placement per mesh axis
        (shard_layer's own default gives a 1-D weight one placement, which a 2-D mesh rejects)."""
        for key, param in list(layer._parameters.items()):
            if param is not None and not param.is_dist():
                dim = split_dim(f"{name}.{key}" if name else key, self.vocab)
                layer.add_parameter(key, self._place(name, key, param, mesh, self._placements(dim)))

    def _place(self, layer_name: str, key: str, param, mesh, placements):
        """`param` with `placements` (the "mp" layout): a whole (eagerly built) tensor is cut by
        `dist.shard_tensor`; a lazy one is created as this rank's block (ZeRO-3: left lazy for `wrap`, but for
        a parameter without gradient, such as a MoE router's balancing bias: the optimizer never sees it)."""
        import paddle.distributed as dist

        from pretrain_cli.distributed.layout.materialize import fill_placed, pending

        if not pending(param) or (self.parallel.sharding_stage == 3 and not param.stop_gradient):
            return dist.shard_tensor(param, mesh, placements)  # (one without gradient is outside the optimizer)
        name = f"{layer_name}.{key}" if layer_name else key
        return fill_placed(name, param, self._source, mesh, placements, self.parallel.rank)

    def wrap(self, model, optimizer):
        import paddle.distributed as dist

        stage = self.parallel.sharding_stage
        if stage:
            sharding = {1: dist.ShardingStage1, 2: dist.ShardingStage2, 3: self._stage3()}[stage]
            optimizer = dist.shard_optimizer(optimizer, sharding("dp", self.mesh))
        else:
            # AdamW's own accumulator creation keeps a whole dense copy of every moment next to the sharded
            # one (2x the optimizer state, measured); the wrapper creates them with the parameters' placements
            optimizer = dist.shard_optimizer(optimizer)
        return model, optimizer

    def _stage3(self):
        """ZeRO-3's sharding stage, creating each lazy parameter directly as its dp shard from `place`'s source
        (`zero3.CreatedSharded`)."""
        from pretrain_cli.distributed.strategies.zero3 import CreatedSharded

        return functools.partial(CreatedSharded, source=self._source, names=self._names, rank=self.parallel.rank)

    def wrap_scaler(self, scaler):
        import paddle.distributed as dist

        return dist.shard_scaler(scaler)

    def unscale(self, scaler, optimizer) -> None:
        """The wrapper's own `_unscale` (`dist.shard_scaler`: `check_finite_and_unscale_` on DistTensors; it marks the
        optimizer unscaled as `unscale_` does), not `unscale_`, which runs the class's legacy op on them and fails
        (`Unrecognized egr::EagerVariable type`). The wrapper divides only a `grad` that holds memory; the step's
        other gradients (`step_grad`: under `amp_master_grad` ZeRO-2/3's hook has moved each into `main_grad` and
        cleared `grad`) are divided here by the same op."""
        import paddle

        scaler._unscale(optimizer)
        rest = [g for p in optimizer._parameter_list if not _holds(p.grad) and _holds(g := step_grad(p))]
        if rest and scaler.is_enable():
            scale = scaler._scale._local_value() if scaler._scale.is_dist() else scaler._scale
            paddle._C_ops.check_finite_and_unscale_(rest, scale)  # (its flag unused: the step's verdict decides)

    # ------------------------------------------------------------------ a step
    def forward_backward(self, model, batches: list, amp, forward_loss):
        """A step's backward starts from no gradient: under `amp_master_grad` ZeRO-2/3 accumulates into
        `main_grad`, which the optimizer's `clear_grad` leaves. The step's end drops it on every path
        (`drop_grads`); dropped here too, a step never adds to gradients it did not make, whatever ended the last."""
        _drop_main_grads(model)
        return super().forward_backward(model, batches, amp, forward_loss)

    def drop_grads(self, model, optimizer) -> None:
        """Also ZeRO-2/3's `main_grad`s under `amp_master_grad`, which only an update drops
        (`_ShardOptimizer._finish_update`): a skipped step's (non-finite, a spike) would hold their fp32 memory
        through a save or an evaluation until the next step."""
        super().drop_grads(model, optimizer)
        _drop_main_grads(model)

    def shard_batch(self, tensor):
        """This rank's rows as its piece of the global batch: `Shard(0)` on "dp", the same rows on every "mp" rank."""
        import paddle.distributed as dist
        from paddle.distributed.auto_parallel.api import dtensor_from_local

        return dtensor_from_local(tensor, self.mesh, [dist.Shard(0), dist.Replicate()])

    def grad_norm(self, model):
        """`squared_l2_norm` of a sharded gradient is Partial (each rank's part): the parts are summed per
        placement kind and made Replicate once each (a few scalar all-reduces), then added."""
        import paddle

        groups: dict = {}
        for g in map(step_grad, model.parameters()):
            if g is not None:
                g = g if g.dtype == paddle.float32 else g.astype("float32")
                s = paddle._C_ops.squared_l2_norm(g)  # [1]
                groups.setdefault(str(s.placements), []).append(s)
        total = paddle.zeros([1], dtype="float32")
        for items in groups.values():
            s = paddle.add_n(items) if len(items) > 1 else items[0]
            total = total + self.to_host(s)
        return paddle.sqrt(total).reshape([])

    def to_host(self, tensor):
        import paddle.distributed as dist

        if not tensor.is_dist():
            return tensor
        if not all(p.is_replicated() for p in tensor.placements):
            tensor = dist.reshard(tensor, tensor.process_mesh, [dist.Replicate() for _ in tensor.placements])
        # replicated, the local value is the whole; in the global shape (a 0-d loss's can come as [1]: DeepSeek-V2's)
        return tensor._local_value().reshape(tensor.shape)


def _holds(tensor) -> bool:
    """Whether a gradient holds memory: ZeRO-2/3's master-gradient hook frees `grad`'s memory, not the tensor."""
    return tensor is not None and tensor._is_initialized()


def _drop_main_grads(model) -> None:
    for p in model.parameters():
        if hasattr(p, "main_grad"):  # (set by ZeRO-2/3's hook registration under `amp_master_grad`)
            p.main_grad = None
