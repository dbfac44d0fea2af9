"""The all-to-all dispatcher's GPU path (distributed/steps/expert_all_to_all.py), executed on CPU: how often a sparse
layer waits for the device, and the dtype of the rows it sends under O1.

Host syncs: a GPU `bincount` copies its input's max to the host to size its output (phi/kernels/gpu/bincount_kernel.cu:
`phi::Copy(..., CPUPlace(), true, ...)`), and `.numpy()` / `.tolist()` / `.item()` / `int()` of a device tensor
wait for the stream. The dispatcher made six per sparse layer and micro-batch (three `bincount`s, three
`.numpy()`s); the split sizes need one, an all-gather of the per-expert counts read once, as torchtitan's and
Megatron-Core's dispatchers do. Counted here: the calls the project's code makes (directly or through Paddle's
Python), not the test's stand-ins', on two thread-ranks of an expert group with the device emulated as
tests/parity/test_gpu_host_tensors.py does and the experts on `grouped_mlp_gpu` (its `batched_gemm` a reference):
`gpu_emulation.as_gpu_device` and `gpu_experts`.

O1: the norm before the experts hands them fp32 rows, which the dispatcher sent as they were (twice the bytes `plan`
charges: `planning.experts.dispatch_bytes` counts `compute_bytes`, 2 for bf16) while the experts cast them to bf16
anyway; here autocast is `gpu_emulation.fake_auto_cast` (tests/parity/test_gpu_experts_amp.py) and every tensor the
all-to-alls carry is recorded.
"""
from __future__ import annotations

import sys
import threading
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pytest

import gpu_emulation as emu
from gpu_emulation import paddle

import pretrain_cli  # noqa: E402
from pretrain_cli.distributed.steps.expert_all_to_all import AllToAllDispatch  # noqa: E402
from pretrain_cli.distributed.steps.expert_parallel import held_range, keep_held  # noqa: E402
from pretrain_cli.models.moe import Routing  # noqa: E402
from pretrain_cli.ops import grouped  # noqa: E402
from test_expert_all_to_all import EXPERTS, HIDDEN, TOKENS, ThreadRanks, _block, _probe, _routing  # noqa: E402
from thread_ranks import Hub  # noqa: E402

SRC, PADDLE = str(Path(pretrain_cli.__file__).parent), str(Path(paddle.__file__).parent)
STEPS = str(Path(SRC, "distributed", "steps"))
READS = ("numpy", "tolist", "item", "__int__", "__float__", "__bool__", "__index__")  # a device tensor read on the host
SIZED_BY_DATA = ("bincount", "nonzero", "masked_select", "unique")  # GPU kernels that read their input to size output


def _ours() -> bool:
    """Whether the call being counted comes from the project's code (through any of Paddle's own Python)."""
    f = sys._getframe(2)
    while f is not None and f.f_code.co_filename.startswith(PADDLE):
        f = f.f_back
    return f is not None and f.f_code.co_filename.startswith(SRC)


_swiglu = emu.ref_swiglu  # (test_moe_host_syncs.py takes it from here)


@pytest.fixture
def on_gpu(monkeypatch):
    """The device a GPU, `batched_gemm` and autocast's queries emulated (`gpu_emulation.as_gpu_device`,
    `gpu_experts`); returns {thread: [what was read or sized by data]} and the tensors sent."""
    seen = {"syncs": {}, "sent": {}}

    def counted(name, real):
        def call(*args, **kwargs):
            if _ours():
                seen["syncs"].setdefault(threading.get_ident(), []).append(name)
            return real(*args, **kwargs)
        return call

    for name in READS:
        monkeypatch.setattr(paddle.Tensor, name, counted(name, getattr(paddle.Tensor, name)))
    for name in SIZED_BY_DATA:
        monkeypatch.setattr(paddle, name, counted(name, getattr(paddle, name)))
    emu.as_gpu_device(monkeypatch)
    emu.gpu_experts(monkeypatch)
    return seen


@dataclass(frozen=True)
class Recorded(ThreadRanks):
    """The thread-ranks' backend, with the collectives the dispatcher calls recorded per thread: (name, dtype,
    rows) of what it sends."""

    sent: dict = None

    def _note(self, name, x):
        if sys._getframe(2).f_code.co_filename.startswith(STEPS):  # the dispatcher's, not the gloo emulation's inside
            self.sent.setdefault(threading.get_ident(), []).append((name, x.dtype, x.shape[0]))

    def all_gather(self, x, group, axis: int):
        self._note("all_gather", x)
        return super().all_gather(x, group, axis)

    def all_to_all_single(self, x, matrix, me, group):
        self._note("all_to_all", x)
        return super().all_to_all_single(x, matrix, me, group)


def _dispatch_on_two_ranks(seen, skewed=False, backward=True):
    """One sparse layer's dispatch (and its backward) on each of two thread-ranks; per rank: (its thread, out,
    counts, the grads of x)."""
    x, indices, weights = _routing(skewed)
    hub, results = Hub(2), {}
    blocks = [_block() for _ in range(2)]
    for r, block in enumerate(blocks):
        keep_held(paddle.nn.LayerList([block]), held_range(EXPERTS, 2, r))
        block.experts.kernels = replace(block.experts.kernels, grouped_mlp=grouped.grouped_mlp_gpu,
                                        swiglu_packed=_swiglu)

    def rank(r):
        rows = slice(r * TOKENS, (r + 1) * TOKENS)
        xt = paddle.to_tensor(x[rows], stop_gradient=False)
        wt = paddle.to_tensor(weights[rows], stop_gradient=False)
        ids = paddle.to_tensor(indices[rows])
        dispatch = AllToAllDispatch(None, 2, r, Recorded(gloo=True, hub=hub, sent=seen["sent"]))
        me = threading.get_ident()
        seen["syncs"][me] = []
        out, counts, _ = dispatch(xt, Routing(None, None, ids, wt), blocks[r].experts, EXPERTS)
        if backward:
            (out * paddle.to_tensor(_probe((2 * TOKENS, HIDDEN))[rows])).sum().backward()
        results[r] = me, out, counts, xt.grad

    hub.run(rank)
    return results


@pytest.mark.parametrize("skewed", [False, True], ids=["uneven", "a_rank_receives_nothing"])
def test_a_sparse_layer_reads_the_device_once_per_micro_batch(on_gpu, skewed):
    results = _dispatch_on_two_ranks(on_gpu, skewed)
    _, indices, _ = _routing(skewed)
    for r, (me, out, counts, dx) in results.items():
        assert on_gpu["syncs"][me] == ["numpy"], on_gpu["syncs"][me]  # was 3 bincounts and 3 .numpy(): 6
        sent = [(name, dtype) for name, dtype, _ in on_gpu["sent"][me]]
        assert sent == [("all_gather", paddle.int64),  # the per-expert counts: the split sizes and the held rows
                        ("all_to_all", paddle.float32), ("all_to_all", paddle.int64), ("all_to_all", paddle.float32),
                        ("all_to_all", paddle.float32), ("all_to_all", paddle.float32)]  # (backward: the last two)
        np.testing.assert_array_equal(counts.numpy(), np.bincount(indices[r * TOKENS:(r + 1) * TOKENS].reshape(-1),
                                                                  minlength=EXPERTS))
        assert np.all(np.isfinite(dx.numpy()))


def test_under_o1_the_rows_cross_in_bf16_and_the_output_is_fp32(on_gpu):
    """Forward only: the experts' bf16 backward needs bf16 adds the CPU build lacks (test_gpu_experts_amp.py)."""
    want = {r: out.numpy() for r, (_, out, _, _) in _dispatch_on_two_ranks(on_gpu, backward=False).items()}
    on_gpu["sent"].clear()
    with emu.fake_auto_cast(level="O1", dtype="bfloat16"):
        got = _dispatch_on_two_ranks(on_gpu, backward=False)
    for r, (me, out, _, _) in got.items():
        sent = on_gpu["sent"][me]
        assert [(name, dtype) for name, dtype, _ in sent] == [
            ("all_gather", paddle.int64), ("all_to_all", paddle.bfloat16), ("all_to_all", paddle.int64),
            ("all_to_all", paddle.bfloat16)]  # the rows both ways: fp32 before, twice the bytes plan charges
        assert out.dtype == paddle.float32  # the combine in x's dtype, as before
        np.testing.assert_allclose(out.numpy(), want[r], rtol=0.05, atol=0.05)  # bf16's rounding
