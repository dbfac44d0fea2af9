"""A MoE layer's routed experts on the GPU path compute in autocast's half dtype, as its dense matmuls do.

`batched_gemm` (the GPU's grouped GEMM) and `bmm` (the padded path) are on neither of AMP's lists (amp/amp_lists.py
3.3.1), so autocast runs them in fp32 when an input is fp32 ("gray", `use_promote`). At O1 the rows a sparse layer
gets are fp32 (the norm before it is promoted by its fp32 weight), so the experts' GEMMs ran in fp32 while the
white-listed matmuls of the dense MLP and the shared experts ran in half. Executed on CPU: `tests/gpu_emulation`'s
`fake_auto_cast` holds the level and dtype, `paddle.amp.is_autocast_enabled` / `get_autocast_dtype` answer from it,
and `batched_gemm` stands behind a reference of its contract (`gpu_emulation.gpu_experts`) that casts its inputs as
autocast would (`amp_cast`), records the dtype it computed in and returns its product in that dtype (fp32 values
rounded, as a half GEMM with fp32 accumulation); SwiGLU, which the CPU has no bf16 kernel of, computes in fp32 and
rounds to its input's dtype.
"""
from __future__ import annotations

import numpy as np
import pytest

import gpu_emulation as emu
from gpu_emulation import paddle

from pretrain_cli.ops import grouped


@pytest.fixture
def computed(monkeypatch) -> list:
    """The experts' GPU path under the emulated autocast (`gpu_emulation.gpu_experts`); returns the (trans_lhs,
    trans_rhs, dtype) of each `batched_gemm` call."""
    return emu.gpu_experts(monkeypatch).calls


def _experts(counts, rng=np.random.default_rng(4)):
    ws = [tuple(paddle.to_tensor(rng.standard_normal(s).astype("float32") * 0.3, stop_gradient=False)
                for s in ((8, 6), (8, 6), (6, 8))) for _ in counts]
    x = paddle.to_tensor(rng.standard_normal((sum(counts), 8)).astype("float32"), stop_gradient=False)
    return x, ws


def test_o1_bf16_experts_compute_in_bf16_and_return_fp32(computed):
    counts = [3, 2, 4, 1]
    x, ws = _experts(counts)
    want = grouped.grouped_mlp_gpu(x, counts, ws, emu.ref_swiglu)  # autocast off: fp32 throughout
    assert {d for _, _, d in computed} == {paddle.float32}
    computed.clear()
    with emu.fake_auto_cast(level="O1", dtype="bfloat16"):
        got = grouped.grouped_mlp_gpu(x, counts, ws, emu.ref_swiglu)  # x fp32, as the promoted norm gives it at O1
    assert [d for _, _, d in computed] == [paddle.bfloat16] * 3  # gate, up, down: they ran fp32 before
    assert got.dtype == paddle.float32  # the combine after the experts sees x's dtype, as before
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=0.05, atol=0.03)  # bf16's rounding
    # (the backward, whose products StackedGemm runs in dy's dtype, needs bf16 adds the CPU build lacks: not run)


def test_o1_fp16_experts_take_the_half_paths_in_fp16(computed, monkeypatch):
    """fp16 has no batched_gemm kernel: the padded or segment path, in fp16 (the padded path's `bmm` is gray too,
    so it ran fp32 at O1 while the segments' white-listed matmul ran fp16: the routing's balance chose)."""
    seen = []
    monkeypatch.setattr(grouped, "grouped_mlp_cpu", lambda x, *a: seen.append(x.dtype) or x)
    x, ws = _experts([3, 2, 4, 1])
    with emu.fake_auto_cast(level="O1", dtype="float16"):
        out = grouped.grouped_mlp_gpu(x, [3, 2, 4, 1], ws, emu.ref_swiglu)
    assert seen == [paddle.float16] and out.dtype == paddle.float32 and not computed
