"""The GPU branch's host -> device tensors leak nothing per call, executed on CPU with the device emulated.

`paddle.to_tensor` leaks one Python list per call in Paddle 3.3.1 on every device (tests/unit/test_host_tensors.py
counts it on CPU), and a GPU run made tensors with it per micro-batch: the batch (`ops.tensors.from_numpy` kept
`to_tensor` for any device but the CPU), a MoE layer's all-to-all split sizes (`Collectives.split_matrix`, since
replaced by counts made on the device: tests/unit/test_expert_all_to_all_gpu.py) and its grouped GEMM's idle-expert
mask (`grouped_gemm_layer.BatchedGemm.dw`, ~3 per sparse layer and micro-batch); and per step, fp16's overflow
verdict for the loss scaler (`training.precision.Amp.step`). Here `paddle.get_device()` answers "gpu:0" and the
expected place is a CPU place standing in for the GPU's, so the GPU branch runs; counted, not timed: the gc-tracked
objects alive after N calls. Paddle's GPU-only `batched_gemm` stands behind a reference of its contract that, like
the kernel, does not promise zeros for an expert without rows (a GEMM with k = 0): it writes NaN there
(`gpu_emulation.gpu_experts`).
"""
from __future__ import annotations

import numpy as np
import pytest

import gpu_emulation as emu
from gpu_emulation import paddle
from object_leaks import alive_after

from pretrain_cli.ops import grouped, kernels
from pretrain_cli.ops.tensors import from_numpy


@pytest.fixture
def on_gpu(monkeypatch):
    """The current device a GPU (`paddle.get_device()`), its place a CPU place standing in for it; returns the
    places `Tensor._copy_to` was asked for and the number of `paddle.to_tensor` calls."""
    device_place = paddle.CPUPlace()
    seen = {"copies": [], "to_tensor": 0}
    copy_to, to_tensor = paddle.Tensor._copy_to, paddle.to_tensor

    def counted_copy(self, place, blocking):
        seen["copies"].append((place, blocking))
        return copy_to(self, place, blocking)

    def counted_to_tensor(*args, **kwargs):
        seen["to_tensor"] += 1
        return to_tensor(*args, **kwargs)

    emu.as_gpu_device(monkeypatch, device_place)
    monkeypatch.setattr(paddle.Tensor, "_copy_to", counted_copy)
    monkeypatch.setattr(paddle, "to_tensor", counted_to_tensor)
    seen["place"] = device_place
    return seen


def test_from_numpy_on_a_gpu_copies_a_host_tensor_to_the_device_and_leaks_nothing(on_gpu):
    batch = np.arange(32, dtype=np.int64).reshape(2, 16)
    t = from_numpy(batch)
    assert on_gpu["to_tensor"] == 0 and on_gpu["copies"] == [(on_gpu["place"], True)]  # to_tensor's synchronous copy
    assert (t.dtype, t.shape, t.stop_gradient) == (paddle.int64, [2, 16], True)
    np.testing.assert_array_equal(t.numpy(), batch)
    for a in (np.array([1.5, 2.5]), np.array([True, False]), np.arange(6, dtype=np.int32).reshape(2, 3)[:, 1:]):
        got, want = from_numpy(a), paddle.to_tensor(a)  # the dtypes `to_tensor` gives, non-contiguous views too
        assert (got.dtype, got.shape) == (want.dtype, want.shape)
        np.testing.assert_array_equal(got.numpy(), a)
    on_gpu["to_tensor"] = 0
    assert alive_after(lambda: from_numpy(batch)) < 10  # was one list per call: 300
    assert on_gpu["to_tensor"] == 0


def test_an_fp16_step_hands_the_scaler_the_steps_verdict_without_a_leak(on_gpu):
    """`Amp.step` (fp16 only, a GPU only) sets the scaler's `found_inf` to the step's verdict at every step: a bool
    `[1]` tensor, as `paddle.to_tensor([overflow])` made it (and leaked a list per step)."""
    from pretrain_cli.training.precision import Amp

    class Scaler:
        """GradScaler's part `Amp.step` drives: its `step` reads `_found_inf` and runs the optimizer's step once."""

        def step(self, view):
            self.seen = self._found_inf
            view.step()

        def update(self):
            pass

    amp, ran = Amp(None, Scaler()), []
    for overflow in (True, False):
        amp.step("the optimizer", ran.append, overflow=overflow)
        f = amp.scaler.seen
        assert (f.dtype, f.shape, f.stop_gradient, bool(f.numpy()[0])) == (paddle.bool, [1], True, overflow)
    assert ran == ["the optimizer"] * 2 and on_gpu["to_tensor"] == 0
    assert alive_after(lambda: amp.step("the optimizer", lambda o: None)) < 10  # was one list per step: 300
    assert on_gpu["to_tensor"] == 0


def test_the_grouped_gemm_gives_idle_experts_zero_gradients_without_a_leak(on_gpu, monkeypatch):
    emu.gpu_experts(monkeypatch, idle=float("nan"))  # no zeros promised for an expert without rows: NaN there
    counts, rng = [2, 0, 5, 1], np.random.default_rng(3)
    init = [[rng.standard_normal(s).astype("float32") * 0.3 for s in ((8, 6), (8, 6), (6, 8))] for _ in counts]
    x0 = rng.standard_normal((8, 8)).astype("float32")

    def step():
        ws = [tuple(paddle.assign(a) for a in trio) for trio in init]
        for trio in ws:
            for w in trio:
                w.stop_gradient = False
        x = paddle.assign(x0)
        x.stop_gradient = False
        grouped.grouped_mlp_gpu(x, counts, ws, kernels.swiglu_packed).sum().backward()
        return ws

    ws = step()
    for (g, u, d), n in zip(ws, counts):
        for w in (g, u, d):
            assert np.all(np.isfinite(w.grad.numpy())) and (n or not np.any(w.grad.numpy()))  # idle: exactly 0
    assert alive_after(step, 50) < 10  # was a list per dW product with an idle expert: 150
    assert on_gpu["to_tensor"] == 0
