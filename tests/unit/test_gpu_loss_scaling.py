"""fp16 loss scaling through the emulation of tests/gpu_emulation.py: the loss scaler enabled on the CPU and fleet's
hybrid optimizer over the sharding stand-in, each written from Paddle 3.3.1's source (issue #60's fp16 loss scaling
under fleet). Gradients are reduced to their owners once and the update is the unscaled one; an overflow, this rank's
or another's, skips the update and lowers the scale; another rank's non-finite loss sends every rank down one branch;
a step skipped for a spike keeps the scale; ZeRO-2 releases the gradients a stage does not own."""
from types import SimpleNamespace

import math

import numpy as np
import pytest

import gpu_emulation as emu
from amp_tiny_model import Tiny
from gpu_emulation import paddle


# ---------------------------------------------------------------- fp16 loss scaling with fleet's optimizer (bug 2)
def _layout(monkeypatch, strategy_cls, scale=1024.0, plain=False, **attrs):
    """A one-process `Step` over `strategy_cls` whose optimizer is fleet's hybrid optimizer (over the sharding
    stand-in; `plain`: Paddle's AdamW itself), with an fp16 loss scaler enabled on the CPU and wrapped by the
    strategy as `training.run.lay_out` wraps it. fleet's layouts get `fleet.distributed_scaler` itself (its
    hybrid group stood in for, in sharding mode): its `_unscale` reads fleet's strategy and all-reduces over the
    world, neither of which is there, so a step that called it would fail."""
    from paddle.distributed import fleet
    from paddle.distributed.fleet.base.topology import ParallelMode

    from pretrain_cli.ops.kernels import StepKernels
    from pretrain_cli.run_config import Precision
    from pretrain_cli.run_layout import ParallelConfig
    from pretrain_cli.training.precision import build_amp
    from pretrain_cli.training.step import Layout

    paddle.seed(0)
    model = Tiny()
    hpo = paddle.optimizer.AdamW(learning_rate=0.1, parameters=model.parameters())
    hpo = hpo if plain else emu.hybrid_optimizer(hpo)
    strategy = object.__new__(strategy_cls)
    strategy.step_kernels, strategy._clip_coef = StepKernels(), 1.0
    strategy.sequence, strategy.parallel = None, ParallelConfig()  # one process, no context parallelism
    strategy._hpo, strategy._params, strategy._owned = hpo, list(model.parameters()), list(model.parameters())
    for key, val in attrs.items():
        setattr(strategy, key, val)
    with emu.scaler_enabled_on_cpu():
        model, hpo, amp = build_amp(model, hpo, Precision("float16", "O1", loss_scale=scale))
    monkeypatch.setattr(fleet.fleet, "_hcg", SimpleNamespace(get_parallel_mode=lambda: ParallelMode.SHARDING_PARALLEL),
                        raising=False)
    amp.wrap_scaler(strategy)
    assert amp.scaler.is_enable()
    return Layout(model, hpo, amp, strategy, model), hpo


def _step(layout):
    from pretrain_cli.run_config import MoeConfig, Schedule
    from pretrain_cli.training.step import Step

    run = SimpleNamespace(loop=SimpleNamespace(grad_accum=1), schedule=Schedule("constant", 0.1, 0.1, 0, 10),
                          optimizer=SimpleNamespace(max_grad_norm=0.0), moe=MoeConfig())
    ids = np.arange(6, dtype="int64").reshape(1, 6)
    return Step(run, comm=None)(layout, iter([{"input_ids": ids, "labels": ids}]), SimpleNamespace(global_step=0))


def _zero1():
    from pretrain_cli.distributed.strategies.strategy import FleetZero1

    class Zero1(FleetZero1):
        def global_norm_sq(self, sq):  # one process: no sharding group to sum the owners' parts over
            return sq

    return Zero1


def test_fp16_loss_scaling_under_fleet_zero1_reduces_each_gradient_once_and_updates_unscaled(monkeypatch):
    layout, hpo = _layout(monkeypatch, _zero1())
    before = [p.numpy().copy() for p in layout.model.parameters()]
    result = _step(layout)
    assert result.outcome == "applied"
    assert hpo._inner_opt.reductions == 1, "gradients reduced to their owners more than once"
    assert hpo._inner_opt.steps == 1
    _assert_unscaled_update(layout.model, before)


def _assert_unscaled_update(model, before):
    """`model` took the update an unscaled fp32 step of Paddle's AdamW takes from `before` (the scale divided out
    exactly once)."""
    ref = Tiny()
    opt = paddle.optimizer.AdamW(learning_rate=0.1, parameters=ref.parameters())
    for p, b in zip(ref.parameters(), before):
        p.set_value(b)
    total, count = ref(paddle.to_tensor(np.arange(6, dtype="int64").reshape(1, 6)))
    (total / count).backward()
    opt.step()
    for p, r in zip(model.parameters(), ref.parameters()):
        np.testing.assert_allclose(p.numpy(), r.numpy(), rtol=1e-5, atol=1e-6)


def test_fp16_loss_scaling_with_paddles_own_optimizer_updates_unscaled_and_skips_an_overflow(monkeypatch):
    """One process (and `paddle.DataParallel`): the optimizer is Paddle's AdamW, stepped once through the view."""
    from pretrain_cli.distributed.strategies.strategy import Strategy

    layout, _ = _layout(monkeypatch, Strategy, plain=True)
    before = [p.numpy().copy() for p in layout.model.parameters()]
    assert _step(layout).outcome == "applied"
    _assert_unscaled_update(layout.model, before)
    layout, _ = _layout(monkeypatch, Strategy, scale=1e38, plain=True)
    layout.model.gain = 30.0
    before = [p.numpy().copy() for p in layout.model.parameters()]
    assert _step(layout).outcome == "overflow"
    for p, b in zip(layout.model.parameters(), before):
        np.testing.assert_array_equal(p.numpy(), b)


def test_an_fp16_overflow_under_fleet_skips_the_update_once_and_lowers_the_scale(monkeypatch):
    layout, hpo = _layout(monkeypatch, _zero1(), scale=1e38)
    layout.model.gain = 30.0  # a finite loss whose scaled gradients overflow
    before = [p.numpy().copy() for p in layout.model.parameters()]
    result = _step(layout)
    assert result.outcome == "overflow" and hpo._inner_opt.reductions == 1
    for p, b in zip(layout.model.parameters(), before):
        np.testing.assert_array_equal(p.numpy(), b)
    assert float(layout.amp.scaler._scale) == pytest.approx(0.5e38, rel=1e-6)


def test_an_overflow_on_another_rank_skips_this_ranks_update_too(monkeypatch):
    """This rank's scaled gradients are finite, another rank's overflowed: the global norm (the same on every
    rank) is inf. The scaler's own flag is this rank's (`GradScaler.unscale_` bypasses the layouts' patched,
    all-reducing `_unscale`), so the step hands it the common verdict: no rank applies the update, every scale
    halves alike."""
    from pretrain_cli.distributed.strategies.strategy import Strategy

    layout, _ = _layout(monkeypatch, Strategy, plain=True)
    monkeypatch.setattr(Strategy, "grad_norm", lambda self, model: paddle.to_tensor(float("inf")))
    before = [p.numpy().copy() for p in layout.model.parameters()]
    assert _step(layout).outcome == "overflow"
    for p, b in zip(layout.model.parameters(), before):
        np.testing.assert_array_equal(p.numpy(), b)
    assert float(layout.amp.scaler._scale) == pytest.approx(512.0)


def test_another_ranks_non_finite_loss_sends_this_rank_down_the_same_branch(monkeypatch):
    """This rank's loss is finite and the global norm inf; another rank's loss is inf (an fp16 activation overflow
    there). Every rank must take the non-finite branch (nan_policy), not this one the overflow branch: its step runs
    the strategy's collectives while the other rank stops alone (a hang)."""
    from pretrain_cli.distributed.strategies.strategy import Strategy
    from pretrain_cli.run_config import MoeConfig, Schedule
    from pretrain_cli.training.step import Step

    layout, _ = _layout(monkeypatch, Strategy, plain=True)
    monkeypatch.setattr(Strategy, "grad_norm", lambda self, model: paddle.to_tensor(float("inf")))
    asked = []

    class OtherRankBad:
        def sum(self, value):  # another rank's loss is inf: the ranks' sum is not finite
            asked.append(value)
            return float("inf")

    run = SimpleNamespace(loop=SimpleNamespace(grad_accum=1), schedule=Schedule("constant", 0.1, 0.1, 0, 10),
                          optimizer=SimpleNamespace(max_grad_norm=0.0), moe=MoeConfig())
    ids = np.arange(6, dtype="int64").reshape(1, 6)
    result = Step(run, comm=OtherRankBad())(layout, iter([{"input_ids": ids, "labels": ids}]),
                                            SimpleNamespace(global_step=0))
    assert len(asked) == 1 and math.isfinite(asked[0]) and result.outcome == "non_finite"


def test_a_skipped_step_moves_the_scale_by_its_own_verdict_not_the_last_steps(monkeypatch):
    """After an overflow, a step dropped for a spike (finite gradients) must not lower the scale again (the
    scaler's `update` would read the overflow's flag); a non-finite one lowers it."""
    layout, _ = _layout(monkeypatch, _zero1(), scale=1e38)
    layout.model.gain = 30.0
    assert _step(layout).outcome == "overflow"
    scale = float(layout.amp.scaler._scale)
    layout.amp.skip(layout.optimizer)  # a spike: the update dropped, the gradients were finite
    assert float(layout.amp.scaler._scale) == pytest.approx(scale, rel=1e-6)
    layout.amp.skip(layout.optimizer, overflow=True)
    assert float(layout.amp.scaler._scale) == pytest.approx(scale / 2, rel=1e-6)


def test_zero2_pipeline_releases_gradients_it_does_not_own_under_fp16_loss_scaling(monkeypatch):
    from pretrain_cli.distributed.strategies.pipeline import Pipeline

    class Stage(Pipeline):
        def grad_norm(self, model):  # one process: no pipeline or sharding group to sum over
            return paddle.sqrt(self.step_kernels.global_sq_norm([p.grad for p in self._owned]))

        def forward_backward(self, model, batches, amp, forward_loss=None):
            return super(Pipeline, self).forward_backward(model, batches, amp, forward_loss)

    layout, hpo = _layout(monkeypatch, Stage, parallel=SimpleNamespace(sharding_stage=2, data_world_size=2),
                          _tp_summed=[])
    layout.strategy._owned = layout.strategy._params[:1]
    layout.optimizer.clear_grad = lambda set_to_zero=True: None  # keep what the step left, to look at it
    _step(layout)
    w, u = layout.model.parameters()
    assert hpo._inner_opt.reductions == 1
    assert w.grad is not None and w.grad._is_initialized()
    assert u.grad is None or not u.grad._is_initialized(), "ZeRO-2: a gradient this rank does not own was kept"
