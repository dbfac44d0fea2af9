"""fp16 loss scaling and `amp_master_grad` on the semi-auto engine (ZeRO-2/3), one rank on the engine's own mesh, as
on GPUs: the gradient hook gloo needs is off (`hook` None, as on NCCL), the scaler enabled on the CPU
(`gpu_emulation.scaler_enabled_on_cpu`), and `use_master_grad` set as `paddle.amp.decorate(master_grad=True)` sets it
on a GPU (amp/auto_cast.py 3.3.1; on CPU `decorate` returns first). Each step goes through the project's `Step`,
`Amp` and `SemiAuto`, and is compared with Paddle's AdamW stepping the same model in one process without AMP.
Before: fp16's `unscale_` failed on DistTensor gradients (`Unrecognized egr::EagerVariable type`), and under
`amp_master_grad` the norm read a gradient ZeRO-2/3 had moved to `main_grad` ("Tensor holds no memory")."""
from types import SimpleNamespace

import numpy as np
import pytest

import gpu_emulation as emu
from amp_tiny_model import Tiny
from gpu_emulation import paddle

EPS = 1.0  # AdamW's epsilon, as large as the gradients: the update then depends on their size (a clip, a scale)


def _batch(seed: int) -> dict:
    ids = np.random.default_rng(seed).integers(0, 4, size=(2, 6)).astype("int64")
    return {"input_ids": ids, "labels": ids}


@pytest.fixture
def amp_state(monkeypatch):
    """Paddle's global AMP state as a GPU run's (restored afterwards): fp16 autocast's dtype, which `GradScaler.scale`
    requires (it disables itself for another), and `use_master_grad` when a test sets it."""
    from paddle.amp.auto_cast import amp_global_state

    state = amp_global_state()
    for key in ("amp_dtype", "use_master_grad", "already_register_final_backward_hook"):
        monkeypatch.setattr(state, key, getattr(state, key))
    return state


def _layout(stage: int, precision, master_grad: bool, amp_state):
    """A `Layout` over `SemiAuto` (ZeRO-`stage`, one rank) with `precision`'s `Amp` built and wrapped as
    `training.run.lay_out` does."""
    from pretrain_cli.distributed.strategies.semi_auto import SemiAuto
    from pretrain_cli.run_layout import ParallelConfig
    from pretrain_cli.training.precision import build_amp
    from pretrain_cli.training.step import Layout

    paddle.seed(0)
    strategy = SemiAuto(ParallelConfig(sharding_stage=stage))
    strategy.hook = None  # NCCL's: no gloo all-reduce hook before ZeRO's own
    model = strategy.place(Tiny())
    optimizer = paddle.optimizer.AdamW(learning_rate=0.1, parameters=model.parameters(), epsilon=EPS)
    with emu.scaler_enabled_on_cpu():
        model, optimizer, amp = build_amp(model, optimizer, precision)
    amp_state.amp_dtype = precision.amp_dtype
    amp_state.use_master_grad = master_grad
    model, optimizer = strategy.wrap(model, optimizer)
    amp.wrap_scaler(strategy)
    assert amp.scaler is None or amp.scaler.is_enable()
    return Layout(model, optimizer, amp, strategy, model)


def _step(layout, batch, max_grad_norm: float = 0.0, guard=None):
    """One `Step` on `batch` (a list: its micro-batches, accumulated)."""
    from pretrain_cli.run_config import MoeConfig, Schedule
    from pretrain_cli.training.step import Step

    batches = batch if isinstance(batch, list) else [batch]
    run = SimpleNamespace(loop=SimpleNamespace(grad_accum=len(batches)),
                          schedule=Schedule("constant", 0.1, 0.1, 0, 10),
                          optimizer=SimpleNamespace(max_grad_norm=max_grad_norm), moe=MoeConfig())
    return Step(run, comm=None, guard=guard)(layout, iter(batches), SimpleNamespace(global_step=0, spike_stats=None))


def _weights(model) -> list:
    return [p._local_value().numpy().copy() for p in model.parameters()]


def _reference(before, batch: dict, max_grad_norm: float = 0.0):
    """(weights after, gradient norm) of Paddle's AdamW stepping `before` on `batch` in one process, fp32, the
    gradients clipped to `max_grad_norm` as `Step` clips them."""
    ref = Tiny()
    for p, b in zip(ref.parameters(), before):
        p.set_value(b)
    opt = paddle.optimizer.AdamW(learning_rate=0.1, parameters=ref.parameters(), epsilon=EPS)
    total, count = ref(paddle.to_tensor(batch["input_ids"]))
    (total / count).backward()
    norm = float(paddle.sqrt(sum((p.grad * p.grad).sum() for p in ref.parameters())))
    if 0 < max_grad_norm < norm:
        with paddle.no_grad():
            for p in ref.parameters():
                p.grad.scale_(max_grad_norm / (norm + 1e-6))
    opt.step()
    return [p.numpy() for p in ref.parameters()], norm


def _assert_weights(model, expected):
    for got, want in zip(_weights(model), expected):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("stage", [2, 3])
def test_fp16_on_the_semi_auto_engine_unscales_through_its_wrapper_and_updates_unscaled(stage, amp_state):
    from pretrain_cli.run_config import Precision

    layout = _layout(stage, Precision("float16", "O1", loss_scale=1024.0), False, amp_state)
    before, batch = _weights(layout.model), _batch(0)
    result = _step(layout, batch)
    assert result.outcome == "applied"
    expected, norm = _reference(before, batch)
    assert result.grad_norm == pytest.approx(norm, rel=1e-5)  # the norm of the unscaled gradients
    _assert_weights(layout.model, expected)


def test_an_fp16_overflow_on_the_semi_auto_engine_skips_the_update_and_lowers_the_scale(amp_state):
    from pretrain_cli.run_config import Precision

    layout = _layout(2, Precision("float16", "O1", loss_scale=1e38), False, amp_state)
    layout.model.gain = 30.0  # a finite loss whose scaled gradients overflow
    before = _weights(layout.model)
    assert _step(layout, _batch(0)).outcome == "overflow"
    for got, want in zip(_weights(layout.model), before):
        np.testing.assert_array_equal(got, want)
    assert float(layout.amp.scaler._scale) == pytest.approx(0.5e38, rel=1e-6)


@pytest.mark.parametrize("stage", [2, 3])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_master_grad_on_zero_2_3_norms_and_clips_the_gradient_the_optimizer_steps_from(stage, dtype, amp_state):
    """ZeRO-2/3's hook moves each gradient into `main_grad` (fp32) and clears `grad`: the norm is main_grad's, the
    clip scales it, fp16's scale is divided out of it, and the update is the clipped one."""
    from pretrain_cli.run_config import Precision

    layout = _layout(stage, Precision(dtype, "O2", master_grad=True), True, amp_state)
    before, batch = _weights(layout.model), _batch(0)
    _, norm = _reference(before, batch)
    clip = norm / 4  # the clip applies
    result = _step(layout, batch, max_grad_norm=clip)
    assert result.outcome == "applied"
    assert result.grad_norm == pytest.approx(norm, rel=1e-5)
    expected, _ = _reference(before, batch, max_grad_norm=clip)
    _assert_weights(layout.model, expected)
    w = layout.model.w
    assert w.grad is None or not w.grad._is_initialized(), "the gradient was not moved to main_grad: nothing tested"


def test_after_a_skipped_step_under_master_grad_the_next_step_uses_its_own_gradients_only(amp_state):
    """A spike skips the update and clears `grad`, not `main_grad` (only an update clears it): the next backward
    must not add to the skipped step's gradients."""
    from pretrain_cli.run_config import Precision

    layout = _layout(2, Precision("bfloat16", "O2", master_grad=True), True, amp_state)
    guard = _Verdicts("loss spike", None)
    before = _weights(layout.model)
    assert _step(layout, _batch(1), guard=guard).outcome == "spike"
    batch = _batch(2)
    result = _step(layout, batch, guard=guard)
    assert result.outcome == "applied"
    expected, norm = _reference(before, batch)
    assert result.grad_norm == pytest.approx(norm, rel=1e-5)
    _assert_weights(layout.model, expected)


class _Verdicts:
    """The spike guard, its verdicts given in order ("loss spike" withholds a step; None accepts it)."""

    def __init__(self, *verdicts):
        self.verdicts = list(verdicts)

    def check(self, stats, loss, norm):
        return self.verdicts.pop(0)

    def accept(self, stats, loss, norm):
        pass


CLIP = 0.05  # below the clipped step's gradient norm (asserted)
# (micro-batch seeds, what the step is, its max_grad_norm): a withheld step of 2 micro-batches, a clipped one, 3
# micro-batches, a NaN loss, a withheld step whose end leaves the gradients (as `clear_grad` alone leaves a
# `main_grad`), a step
SEQUENCE = (((1, 2), "spike", 0.0), ((3, 4), "clipped", CLIP), ((5, 6, 7), "applied", 0.0), ((8,), "nan", 0.0),
            ((9, 10), "left", 0.0), ((11,), "applied", 0.0))


def _trace(stage: int, master: bool, amp_state, monkeypatch) -> list:
    """(outcome, gradient norm, weights after) of each step of `SEQUENCE` on ZeRO-`stage` in bf16 O2, with or
    without `amp_master_grad`; checks that every step the sequence skips leaves the weights and no `main_grad`."""
    from pretrain_cli.run_config import Precision

    layout = _layout(stage, Precision("bfloat16", "O2", master_grad=master), master, amp_state)
    params, guard, out = list(layout.model.parameters()), _Verdicts("loss spike", None, None, "loss spike", None), []
    assert all(hasattr(p, "main_grad") == master for p in params), "ZeRO's master-gradient hook: not as asked"
    for seeds, kind, clip in SEQUENCE:
        before = _weights(layout.model)
        layout.model.gain = float("nan") if kind == "nan" else 1.0
        with monkeypatch.context() as m:
            if kind == "left":  # the step's end without the semi-auto engine's own part
                m.setattr(layout.strategy, "drop_grads", lambda model, optimizer: optimizer.clear_grad())
            result = _step(layout, [_batch(s) for s in seeds], max_grad_norm=clip, guard=guard)
        out.append((result.outcome, result.grad_norm, _weights(layout.model)))
        if kind == "clipped":
            assert result.grad_norm > CLIP, "the clip did not apply: nothing tested"
        if kind in ("spike", "nan", "left"):
            assert result.outcome == ("non_finite" if kind == "nan" else "spike")
            for got, want in zip(out[-1][2], before):
                np.testing.assert_array_equal(got, want)
            left = [p.name for p in params if getattr(p, "main_grad", None) is not None]
            assert left == ([] if kind != "left" or not master else [p.name for p in params]), left
    return out


@pytest.mark.parametrize("stage", [2, 3])
def test_master_grad_steps_as_plain_gradients_do_across_accumulation_skips_and_a_clip(stage, amp_state, monkeypatch):
    """ZeRO-2/3 under `amp_master_grad` (gradients accumulated in fp32 `main_grad`, which only an update drops)
    against the same stage's plain gradients, step by step: 2 micro-batches withheld for a spike, 2 clipped, 3, a NaN
    loss, a withheld step whose `main_grad` is left, then a step. A skipped step's end drops its `main_grad`
    (`SemiAuto.drop_grads`: none held through a save or an evaluation), and a step starts without one
    (`SemiAuto.forward_backward`: the last step here adds to the left one without it)."""
    master, plain = (_trace(stage, m, amp_state, monkeypatch) for m in (True, False))
    assert [o for o, _, _ in master] == [o for o, _, _ in plain] == [
        "spike", "applied", "applied", "non_finite", "spike", "applied"]
    for (_, norm_m, weights_m), (_, norm_p, weights_p) in zip(master, plain):
        np.testing.assert_allclose(norm_m, norm_p, rtol=1e-6)  # (NaN at the NaN loss: NaN equals NaN here)
        for got, want in zip(weights_m, weights_p):
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


def test_fleet_layouts_unscale_through_the_class_so_the_step_divides_once(monkeypatch, amp_state):
    """fleet's wrapper (`fleet.distributed_scaler`, which needs fleet's groups: stood in for) patches the instance's
    `_unscale` with one that does not mark the optimizer unscaled; were it called for the norm, `GradScaler.step`
    would call it again and divide the scale out twice. Its layouts keep `unscale_` (the class's)."""
    from paddle.amp.grad_scaler import GradScaler, OptimizerState

    from pretrain_cli.distributed.strategies.strategy import FleetZero1
    from pretrain_cli.run_config import Precision
    from pretrain_cli.training.precision import build_amp

    calls = []

    def fleet_wrapper(self, scaler):
        def unscale(optimizer):  # divides, all-reduces the flag (one process: nothing), leaves the state INIT
            calls.append(optimizer)
            GradScaler._unscale(scaler, optimizer)
            scaler._optimizer_states[id(optimizer)]["state"] = OptimizerState.INIT

        scaler._unscale = unscale
        return scaler

    monkeypatch.setattr(FleetZero1, "wrap_scaler", fleet_wrapper)
    paddle.seed(0)
    model = Tiny()
    optimizer = paddle.optimizer.AdamW(learning_rate=0.1, parameters=model.parameters(), epsilon=EPS)
    with emu.scaler_enabled_on_cpu():
        model, optimizer, amp = build_amp(model, optimizer, Precision("float16", "O1", loss_scale=1024.0))
    amp_state.amp_dtype = "float16"
    amp.wrap_scaler(object.__new__(FleetZero1))
    before, batch = _weights_dense(model), _batch(0)
    total, count = model(paddle.to_tensor(batch["input_ids"]))
    amp.backward(total / count)
    amp.unscale(optimizer)
    amp.step(optimizer, lambda opt: opt.step())
    assert calls == [], "the wrapper's _unscale ran: the step divides the scale out again"
    expected, _ = _reference(before, batch)
    for got, want in zip(_weights_dense(model), expected):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def _weights_dense(model) -> list:
    return [p.numpy().copy() for p in model.parameters()]
