"""How a finished single-device model is spread over processes: one `Strategy` per layout.

Model code is single-device; parallelism is applied here from outside, like torchtitan's
`parallelize_fn` or nanoGPT's `DDP(model)`. The trainer and the checkpoint code call the same
methods whatever the layout, in this order: `place` (before the optimizer exists), `wrap`, `wrap_scaler` (fp16's loss
scaler), then per step `forward_backward` (`shard_batch`, `no_sync`), `sync_grads`, `unscale` (fp16), `grad_norm`,
`clip`, `step`, `drop_grads` (applied or skipped), and for checkpoints
`pieces` (what this rank writes: the blocks of weights and optimizer state it holds, `distributed.layout.pieces`)
and `local_box` (what it reads back: where each of its tensors sits in the global one). Nothing is gathered.

- `Strategy` (one process): every method is the identity;
- `DataParallel`: `paddle.DataParallel` (gradients all-reduced in backward, once per accumulated step);
- `FleetZero1` (`sharding: stage1`): fleet's `DygraphShardingOptimizer`: each rank owns, updates and
  keeps the AdamW state of a slice of the parameters. Kept over the semi-auto engine's stage 1 because
  it is faster here (docs/DISTRIBUTED.md) and supports a sharding degree below the data-parallel world;
- `SemiAuto` (`distributed/strategies/semi_auto.py`: ZeRO-2/3 and tensor parallelism): Paddle's semi-auto engine.

`distributed.setup` picks the strategy for a resolved `ParallelConfig` and joins the process group.
"""
from __future__ import annotations

import contextlib

from pretrain_cli.distributed.comms.collectives import for_device
from pretrain_cli.distributed.layout.topology import Topology
from pretrain_cli.ops.kernels import StepKernels
from pretrain_cli.run_layout import ParallelConfig


def _nbytes(t) -> int:
    if t is None:
        return 0
    v = t._local_value() if getattr(t, "is_dist", lambda: False)() else t
    return int(v.numel()) * v.element_size()


def step_grad(param):
    """The gradient the optimizer steps from: `main_grad` where Paddle keeps it instead of `grad` (the semi-auto
    engine's ZeRO-2/3 under `amp_master_grad`: `ShardingStage2/3`'s hook casts each gradient to fp32 into
    `param.main_grad` and clears `grad`, and `Optimizer.step` prefers `main_grad`; distributed/auto_parallel/api.py,
    optimizer/optimizer.py 3.3.1), else `grad`. The norm reads this one and the clip scales it."""
    main = getattr(param, "main_grad", None)
    return main if main is not None else param.grad


LOGGED = ("aux_loss", "z_loss", "mtp_loss", "lm_loss")  # logged apart, each rank's summed at log time (`share_logged`)


class Strategy:
    """One process: the model and optimizer as they are."""

    name = "single process"
    global_batch = False  # True: each rank's batch is declared a piece of one global batch (semi-auto)

    def __init__(self, parallel: ParallelConfig, device: str = "cpu", step_kernels: StepKernels | None = None,
                 recompute=None):
        """`step_kernels`: the optimizer step's kernels (`ops.kernels.select_step`); with a fused AdamW, `clip`
        only records the coefficient and `step` hands it to the update. `recompute` (`run_config.Recompute` or
        None): the layout's `recompute` step (`distributed.steps.order`)."""
        self.parallel, self.device, self.recompute = parallel, device, recompute
        self.backend = for_device(device)  # the run's one collectives backend
        self.topology = Topology.of(parallel)  # every rank, group and coordinate this layout asks for
        self.step_kernels = step_kernels or StepKernels()
        self._clip_coef = 1.0
        self.sequence = None  # context parallelism's batch side (`context.ContextSide`), when cp > 1
        if parallel.cp_degree > 1:
            from pretrain_cli.distributed.steps.context import ContextSide

            self.sequence = ContextSide(parallel, self.backend)
            self.name = self.sequence.name  # (a layout with more axes names itself)
        elif parallel.world_size > 1:  # the start-up's `layout:` line says the degrees, as check does (the
            self.name = f"{self.name}: {parallel.axes()}{parallel.expert_axis()}"  # engines with more axes rename)
        self.placement = None  # what the layout steps left (`steps.Placement`), once placed

    # ------------------------------------------------------------------ building
    def place(self, model, source=None):
        """Lay the parameters out over the processes; before the optimizer is created. `source`
        (`distributed.layout.materialize`): where a lazily built model's parameters get their values; every layout
        creates only what this rank holds (here: everything, whole, one parameter at a time). Then the layout
        steps in their order (`distributed.steps.order`)."""
        if source is not None:
            from pretrain_cli.distributed.layout.materialize import fill

            fill(model, source)
        return self.apply_steps(model, source)

    def apply_steps(self, model, source=None):
        """The model through the layout's steps (`distributed.steps.order.ORDER`); what they leave is
        `self.placement`."""
        from pretrain_cli.distributed.steps.order import Placement, apply_steps

        self.placement = Placement(self.parallel, self.topology, self.backend, source, self.recompute,
                                   sequence=self.sequence)
        return apply_steps(model, self.placement)

    def model_inputs(self, model):
        """The model as the trainer calls it: under context parallelism `ContextModel` (global positions in, the
        whole sequence's loss out), else the model itself."""
        return self.sequence.wrap(model) if self.sequence is not None else model

    def wrap(self, model, optimizer):
        return self.model_inputs(model), optimizer

    def wrap_scaler(self, scaler):
        """fp16's loss scaler, made to agree across ranks on whether a step overflowed (GPU only)."""
        return scaler

    def unscale(self, scaler, optimizer) -> None:
        """fp16's loss scale divided out of this rank's gradients before the norm (`training.precision.Amp.unscale`;
        `optimizer`: the scaler's view of it): `GradScaler.unscale_`, which marks the optimizer unscaled so that
        `step` does not divide again."""
        scaler.unscale_(optimizer)

    # ------------------------------------------------------------------ a step
    def forward_backward(self, model, batches: list, amp, forward_loss):
        """The step's micro-batches, each forward (`forward_loss(batch)`: its mean loss) and backward, the
        gradient all-reduce held back until the last (`no_sync`); returns the mean loss over them (a tensor).
        A pipeline overrides this with its own schedule."""
        total, acc = None, len(batches)
        for i, batch in enumerate(batches):
            with self.no_sync(model, last_micro_batch=i == acc - 1):
                loss = forward_loss(batch) / acc
                amp.backward(loss)
            total = loss.detach() if total is None else total + loss.detach()
        return total

    def shard_batch(self, tensor):
        """This rank's micro-batch as the model's input (context parallelism: its chunks of every sequence)."""
        return self.sequence.shard(tensor) if self.sequence is not None else tensor

    def no_sync(self, model, last_micro_batch: bool):
        """Skip the gradient all-reduce for all but the last micro-batch of an accumulated step."""
        return contextlib.nullcontext()

    def sync_grads(self) -> None:
        """Bring gradients to where the update needs them (after the last backward of a step)."""

    def grad_params(self, model) -> list:
        """Parameters whose gradients this rank holds fully reduced (its share of the global norm)."""
        return list(model.parameters())

    def grad_norm(self, model):
        """The global gradient L2 norm as a 0-D dense tensor (fp32), the same on every rank: a `squared_l2_norm`
        per parameter (what Paddle's ClipGradByGlobalNorm uses), or the fused step's one pass over all."""
        import paddle

        grads = [g for g in map(step_grad, self.grad_params(model)) if g is not None]
        return paddle.sqrt(self.global_norm_sq(self.step_kernels.global_sq_norm(grads)))

    def global_norm_sq(self, sq):
        return sq

    def clip(self, model, coef: float) -> None:
        if self.step_kernels.adamw is not None:  # the fused update scales the gradients as it reads them
            self._clip_coef = coef
            return
        import paddle

        with paddle.no_grad():
            for g in map(step_grad, self.grad_params(model)):
                if g is not None:
                    g.scale_(coef)

    def step(self, optimizer) -> None:
        if self.step_kernels.adamw is None:
            optimizer.step()
            return
        optimizer.step(grad_scale=self._clip_coef)
        self._clip_coef = 1.0

    def drop_grads(self, model, optimizer) -> None:
        """The step's gradients cleared at its end, applied or skipped (`training.step.Step`), so the next step's
        backward adds to none of them. The semi-auto engine also drops the `main_grad`s `clear_grad` leaves."""
        optimizer.clear_grad()

    def to_host(self, tensor):
        """A scalar the step computed, as a dense tensor whose value is the global one."""
        return self.sequence.to_host(tensor) if self.sequence is not None else tensor

    def share_logged(self, sums: dict) -> None:
        """The logged losses (`LOGGED`: {name: (sum, forwards)} since the last log line) as one process logs them,
        on every rank, at log time: summed over every rank, so with several data ranks the mean is over all their
        micro-batches, as one process's over the same ones (a tp rank's copy adds the same value and a forward
        more: the mean is unchanged). Only ranks that compute them add theirs (`_computes_logged`: a pipeline's
        last stage). The semi-auto engine computes them over the global batch on every rank already. One small
        all-reduce a log line, exact in fp32 (its tensor by `ops.tensors.from_numpy`: `paddle.to_tensor` leaks)."""
        if self.parallel.world_size == 1 or self.global_batch:
            return
        import numpy as np
        import paddle.distributed as dist

        from pretrain_cli.ops.tensors import from_numpy

        mine = [sums.get(name, (0.0, 0)) if self._computes_logged() else (0.0, 0) for name in LOGGED]
        both = from_numpy(np.array([float(x) for pair in mine for x in pair], dtype=np.float32))  # [2 * names]
        dist.all_reduce(both, op=dist.ReduceOp.SUM)
        for i, (total, n) in enumerate(both.numpy().reshape([-1, 2])):  # [names, 2]
            if n:
                sums[LOGGED[i]] = (float(total), int(n))

    def _computes_logged(self) -> bool:
        return True

    def whole_model_rows(self, rows):
        """A MoE model's per-layer load rows (`models.moe_loss.load_rows`) of the whole model from this rank's:
        every rank runs every layer here, so summed over every rank, the counts of all data ranks' tokens as one
        process counts them (a tp rank's copy doubles a layer's every count: its shares are unchanged; rank 0's
        own were logged before, another batch than one process's); a pipeline gathers its stages'. One all-reduce
        at log time (its tensor by `ops.tensors.from_numpy`: `paddle.to_tensor` leaks). Asked only of a model with
        sparse blocks (`log_values`): here every rank's rows are the same shape, never empty (gloo takes no
        zero-element all-reduce)."""
        if self.parallel.world_size == 1:
            return rows
        import paddle.distributed as dist

        from pretrain_cli.ops.tensors import from_numpy

        out = from_numpy(rows)  # [layers, experts + 1]
        dist.all_reduce(out, op=dist.ReduceOp.SUM)
        return out.numpy()

    # ------------------------------------------------------------------ checkpoints and reports
    def holders(self, tensor, kind: str) -> tuple:
        """The ranks holding the same whole (non-DistTensor) `tensor` as this rank: every rank unless a
        layout keeps it on fewer (fleet ZeRO-1's optimizer state; a pipeline stage's parameters)."""
        return self.topology.replicas()

    def local_box(self, tensor, name: str | None = None):
        """(`Box` of this rank's part of `tensor` in the global tensor, Paddle layout; the ranks holding the
        same block, or None: `holders`). The load side reads exactly this block; the save side writes it
        (`pieces`). `name`: the checkpoint's name of the tensor (HF name, "/<slot>" for optimizer state)."""
        from pretrain_cli.distributed.layout.pieces import Box, dist_layout

        if getattr(tensor, "is_dist", lambda: False)():
            return dist_layout(tensor, self.parallel.rank)
        shape = tuple(tensor.shape)
        return Box(shape, (0,) * len(shape), shape), None

    def pieces(self, model, optimizer=None) -> list:
        """The checkpoint interface every layout implements through `holders` / `local_box`: this rank's
        pieces (`distributed.layout.pieces.Piece`) of the weights and (with `optimizer`) the optimizer state, HF
        names and layout, each with its global shape and offsets and the ranks that hold a copy. No
        collective, no copy: a piece's `view()` hands its block to the writer when it asks.
        The checkpoint writes the pieces `pieces.writer_of` gives this rank (one writer per replica)."""
        from pretrain_cli.distributed.layout.pieces import Piece, dtype_code, state_tensors

        out = []
        for name, kind, t, transpose in state_tensors(model, optimizer):
            box, holders = self.local_box(t, name)
            holders = holders or self.holders(t, kind)
            out.append(Piece(name, kind, box.transposed() if transpose else box, dtype_code(t), tuple(holders),
                             t, transpose))
        return out

    def local_bytes(self, model, optimizer) -> dict:
        """What this rank physically holds: parameters and optimizer state (AdamW moments, O2 master copies)."""
        from pretrain_cli.distributed.layout.pieces import inner_optimizer

        inner = inner_optimizer(optimizer)
        state = sum(_nbytes(t) for table in inner._accumulators.values() for t in table.values())
        state += sum(_nbytes(t) for t in (getattr(inner, "_master_weights", None) or {}).values())
        return {"parameters": sum(_nbytes(p) for p in model.parameters()), "optimizer_state": state}


class DataParallel(Strategy):
    name = "data parallel (paddle.DataParallel)"

    def wrap(self, model, optimizer):
        import paddle

        return paddle.DataParallel(self.model_inputs(model), find_unused_parameters=False), optimizer

    def no_sync(self, model, last_micro_batch: bool):
        return contextlib.nullcontext() if last_micro_batch else model.no_sync()


class FleetHybrid(Strategy):
    """The step through fleet's hybrid-parallel optimizer (`fleet.distributed_optimizer`: ZeRO-1's
    `DygraphShardingOptimizer` under it; ZeRO-2 the same, releasing the gradients a rank does not own after each
    update), for `FleetZero1` and `Hybrid`'s engines. `wrap` sets `_hpo` (None when the optimizer is not fleet's),
    `_params` (every parameter of this rank's model) and `_owned` (those whose update this rank owns)."""

    _hpo = None  # set by `wrap`
    _params: tuple = ()  # set by `wrap` (a tuple: no list shared between instances)
    _owned: tuple = ()

    def wrap_scaler(self, scaler):
        from paddle.distributed import fleet

        return fleet.distributed_scaler(scaler)

    def sync_grads(self) -> None:
        if self._hpo is not None:
            self._hpo._hybrid_sync_grad(self._params)  # reduce to each parameter's owner (+ the dp all-reduce)

    def step(self, optimizer) -> None:
        """fleet's update of the owned parameters, then their broadcast (gradients already synced). ZeRO-2: after
        the update the gradients this rank does not own are released (their owner alone read them; the next
        backward creates them again). Not earlier: fleet's broadcast skips a parameter with no gradient."""
        if self._hpo is None:
            return super().step(optimizer)
        self._hpo._step(self._params)
        if self.parallel.sharding_stage == 2:
            owned = {id(p) for p in self._owned}
            for p in self._params:
                if id(p) not in owned:
                    p.clear_gradient(False)  # storage released, not zeroed


class FleetZero1(FleetHybrid, DataParallel):
    """ZeRO-1 through fleet: each sharding rank updates (and holds the AdamW state of) its own parameters; ZeRO-2
    (context parallelism's) also releases the others' gradients after each update."""

    name = "ZeRO-1 (fleet DygraphShardingOptimizer)"

    def wrap(self, model, optimizer):
        from paddle.distributed import fleet

        model = fleet.distributed_model(self.model_inputs(model))
        return model, self.shard_optimizer(optimizer)

    def shard_optimizer(self, optimizer):
        """fleet's sharding optimizer over `optimizer`'s parameters: which this rank owns, its sharding group."""
        from paddle.distributed import fleet

        self._hpo = fleet.distributed_optimizer(optimizer)
        self._dso = self._hpo._inner_opt
        hcg = self._dso._hcg
        self._group = hcg.get_sharding_parallel_group()
        self._params = list(self._dso._origin_parameter_list)
        self._owned = self._dso.filter_parameters(self._params, hcg)
        return self._hpo

    def no_sync(self, model, last_micro_batch: bool):
        """fleet's `ShardingParallel` (what `distributed_model` gives with a sharding axis) reduces nothing in the
        backward and has no `no_sync`: the gradients are reduced once a step, in `sync_grads`. A plain
        `DataParallel` (no sharding axis) holds its all-reduce back as `DataParallel.no_sync` does."""
        if hasattr(model, "no_sync"):
            return super().no_sync(model, last_micro_batch)
        return contextlib.nullcontext()

    def grad_params(self, model) -> list:
        return self._owned

    def global_norm_sq(self, sq):
        import paddle.distributed as dist

        dist.all_reduce(sq, op=dist.ReduceOp.SUM, group=self._group)  # owners hold disjoint parameters
        return sq

    def holders(self, tensor, kind: str) -> tuple:
        """Optimizer state lives on its parameter's owner only, and on the owners of the same shard in the other
        data-parallel groups: the ranks with this rank's place on fleet's sharding axis, which is the topology's
        sharding × cp (`Topology.fleet_hybrid_configs`; fleet's groups are the topology's)."""
        if kind != "optimizer":
            return super().holders(tensor, kind)
        return self.topology.replicas("sharding", "cp")
