"""The Mixture-of-Experts block's grouped expert compute (`ops.grouped`) against one expert at a time over its own
tokens: the padded, segment and CPU-default paths, the GPU's grouped GEMM behind a reference of its contract, and the
weights a forward keeps for backward."""
import numpy as np
import pytest

import gpu_emulation as emu
from gpu_emulation import paddle

from moe_helpers import expert_np
from pretrain_cli.ops import kernels
from pretrain_cli.ops.grouped import grouped_mlp_cpu, grouped_mlp_padded, grouped_mlp_segments

nn_silu = paddle.nn.functional.silu


def _weights(rng, n, h=8, f=6):
    return [tuple(paddle.to_tensor(rng.standard_normal(s).astype("float32") * 0.3) for s in ((h, f), (h, f), (f, h)))
            for _ in range(n)]


@pytest.mark.parametrize("grouped", [grouped_mlp_padded, grouped_mlp_segments, grouped_mlp_cpu])
def test_grouped_expert_compute_equals_one_expert_at_a_time(grouped):
    rng = np.random.default_rng(0)
    counts = [3, 0, 7, 1, 0, 2]  # uneven, with idle experts
    ws = _weights(rng, len(counts))
    x = rng.standard_normal((sum(counts), 8)).astype("float32")
    out = grouped(paddle.to_tensor(x), counts, ws, kernels.swiglu_packed).numpy()
    start = 0
    for (g, u, d), n in zip(ws, counts):
        want = expert_np(x[start:start + n], g.numpy(), u.numpy(), d.numpy())
        np.testing.assert_allclose(out[start:start + n], want, rtol=1e-5, atol=1e-5)
        start += n
    assert grouped(paddle.zeros([0, 8]), [0] * 6, ws, kernels.swiglu_packed).shape == [0, 8]


def test_the_gpu_grouped_gemm_call_with_a_reference_behind_it_trains_the_experts(monkeypatch):
    """`grouped_mlp_gpu` calls Paddle's `batched_gemm(lhs [rows, in], rhs [experts, in, out], batch_sizes)` (its
    docstring: row segment e times rhs[e]). The GPU op cannot run here, so a reference of its contract stands
    behind it, with its flags (`trans_rhs`: rhs[e] transposed; `trans_lhs`: segment e of lhs transposed times
    segment e of rhs, out `[experts, in, out]`) and, like the real op (no grad node in Paddle 3.3.1), no
    backward: its outputs are constants to autograd. The forward and every gradient must equal one expert at a
    time, an expert without rows included; fp16, which the kernel lacks, takes another path."""
    from pretrain_cli.ops import grouped

    calls = emu.gpu_experts(monkeypatch).calls
    counts = [2, 0, 5, 1]

    def run(fn):  # the same weights and rows each time, a gradient of its own
        ws = [tuple(paddle.to_tensor(t.numpy(), stop_gradient=False) for t in trio)
              for trio in _weights(np.random.default_rng(5), len(counts))]
        x = paddle.to_tensor(np.random.default_rng(6).standard_normal((8, 8)).astype("float32"), stop_gradient=False)
        out = fn(x, counts, ws, kernels.swiglu_packed)
        (out * paddle.to_tensor(np.linspace(-1, 1, 64).reshape([8, 8]).astype("float32"))).sum().backward()
        return out.numpy(), x.grad.numpy(), [[t.grad for t in trio] for trio in ws]

    got, want = run(grouped.grouped_mlp_gpu), run(grouped_mlp_segments)
    # the backward ran through the op's own flags
    assert (True, False, paddle.float32) in calls and (False, True, paddle.float32) in calls
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got[1], want[1], rtol=1e-5, atol=1e-6)
    for e, (g_trio, w_trio) in enumerate(zip(got[2], want[2])):
        for g, w in zip(g_trio, w_trio):
            if counts[e] == 0:  # the segments never touch an expert without rows; the stacked weights give it 0
                assert w is None and not np.any(g.numpy())
            else:
                np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=1e-5, atol=1e-6)
    calls.clear()
    monkeypatch.setattr(grouped, "grouped_mlp_cpu", lambda *a: "padded or segments")
    assert grouped.grouped_mlp_gpu(paddle.zeros([8, 8], dtype="float16"), counts, None, None) == "padded or segments"
    assert not calls


@pytest.mark.parametrize("path", ["padded", "segments", "gpu"])
def test_the_experts_keep_no_copy_of_their_weights_for_backward(path, monkeypatch):
    """A GEMM keeps its operands for backward, so `bmm(x, stack(weights))` (the padded path, the GPU's grouped GEMM)
    and `matmul(x, concat([gate, up]))` (the segments) kept a copy of a layer's expert weights until its backward:
    every routed expert again on one process, once per micro-batch in flight under a pipeline, which `plan` does not
    count (benchmarks/plan_calibration.py --stages: 15 % over the plan with experts as large as here). Now a forward
    leaves its activations allocated and no weights (here under 1/4 of the weights; it was them and more), and every
    gradient is the plain per-expert products' (x's too), each a contiguous tensor (ZeRO-3's hook all-reduces the
    buffer as laid out). The GPU path behind `gpu_emulation.gpu_experts`."""
    from pretrain_cli.ops import grouped

    if path == "gpu":
        emu.gpu_experts(monkeypatch)
    fn = {"padded": grouped_mlp_padded, "segments": grouped_mlp_segments, "gpu": grouped.grouped_mlp_gpu}[path]
    core = paddle.base.core
    counts, h, f = [8, 3, 12, 5, 9, 7, 10, 10], 64, 256  # 64 rows; 8 experts of 3 x 64 x 256 fp32: 1.5 MiB
    rng = np.random.default_rng(7)
    init = [[rng.standard_normal(s).astype("float32") * 0.1 for s in ((h, f), (h, f), (f, h))] for _ in counts]
    x0 = rng.standard_normal((sum(counts), h)).astype("float32")
    dy = paddle.to_tensor(rng.standard_normal((sum(counts), h)).astype("float32"))

    def leaves():
        return (paddle.to_tensor(x0, stop_gradient=False),
                [tuple(paddle.to_tensor(a, stop_gradient=False) for a in trio) for trio in init])

    x, ws = leaves()
    before = core.host_memory_stat_current_value("Allocated", 0)
    out = fn(x, counts, ws, kernels.swiglu_packed)
    kept = core.host_memory_stat_current_value("Allocated", 0) - before
    weights = 4 * 3 * h * f * len(counts)
    assert kept < weights / 4, (kept, weights)
    (out * dy).sum().backward()

    rx, rws = leaves()  # the reference: one expert at a time, Paddle's own autograd, no packing
    outs = []
    for part, (g, u, d) in zip(paddle.split(rx, counts), rws):
        outs.append(paddle.matmul(nn_silu(paddle.matmul(part, g)) * paddle.matmul(part, u), d))
    (paddle.concat(outs) * dy).sum().backward()
    np.testing.assert_allclose(out.numpy(), paddle.concat(outs).numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(x.grad.numpy(), rx.grad.numpy(), rtol=1e-5, atol=1e-5)
    for trio, ref in zip(ws, rws):
        for w, r in zip(trio, ref):
            assert w.grad.is_contiguous()
            np.testing.assert_allclose(w.grad.numpy(), r.grad.numpy(), rtol=1e-4, atol=1e-5)


def test_the_cpu_default_pads_only_a_balanced_routing(monkeypatch):
    from pretrain_cli.ops import grouped

    chosen = []
    monkeypatch.setattr(grouped, "grouped_mlp_padded", lambda *a: chosen.append("padded"))
    monkeypatch.setattr(grouped, "grouped_mlp_segments", lambda *a: chosen.append("segments"))
    grouped.grouped_mlp_cpu(None, [10, 11, 9, 12], None, None)  # 4 x 12 = 48 <= 1.3 x 42
    grouped.grouped_mlp_cpu(None, [30, 4, 4, 4], None, None)  # 4 x 30 = 120 > 1.3 x 42
    assert chosen == ["padded", "segments"]
    assert kernels.select(None, "cpu").grouped_mlp is grouped.grouped_mlp_cpu
