"""The fused CPU kernels (csrc/) other than attention against the reference ops they replace, forward and backward:
RMSNorm (alone and after the residual add), SwiGLU, the MLP's input half, RoPE, cross entropy and the fused AdamW
step; strided, NaN, degenerate and out-of-range inputs. Attention: test_cpu_attention.py; which kernels a run
selects: test_cpu_kernel_selection.py.

Shapes are deliberately odd (hidden 40, head_dim 10, vocab 37) so vector tails and thread splits are
exercised; GQA, KV-cache-style q_len < k_len and strided (transposed) inputs are included.
"""
import os

import numpy as np
import pytest

from pretrain_cli import runtime

paddle = runtime.import_paddle()

from cpu_kernel_checks import _check, _t, _threads  # noqa: E402
from pretrain_cli.ops import cpu_ops, kernels, reference  # noqa: E402

OPS = cpu_ops.load()
RNG = np.random.default_rng(0)


def test_the_library_builds_here():
    assert OPS is not None, cpu_ops.load_error()


def test_rms_norm_matches_reference():
    x, w = RNG.standard_normal((3, 7, 40)).astype("float32"), (RNG.random(40) + 0.5).astype("float32")
    _check(lambda a, b: kernels.rms_norm_cpu(a, b, 1e-6), lambda a, b: kernels.rms_norm_reference(a, b, 1e-6), [x, w])


def test_add_rms_norm_matches_the_add_then_the_norm():
    """Both outputs used downstream (the residual and the norm), so the backward adds both gradients."""
    x, a = RNG.standard_normal((3, 7, 40)).astype("float32"), RNG.standard_normal((3, 7, 40)).astype("float32")
    w = (RNG.random(40) + 0.5).astype("float32")

    def both(fn):
        def run(x, a, w):
            h, y = fn(x, a, w, 1e-6)
            return h * 0.5 + y * y  # each output reaches the loss, so each sends its gradient back
        return run

    _check(both(kernels.add_rms_norm_cpu), both(reference.add_rms_norm_reference), [x, a, w], atol=1e-5)
    h, y = kernels.add_rms_norm_cpu(*map(paddle.to_tensor, (x, a, w)), 1e-6)  # the norm alone: h's gradient is none
    np.testing.assert_allclose(h.numpy(), x + a, rtol=1e-6)
    xs, as_, ws = _t(x), _t(a), _t(w)
    grads = paddle.grad([kernels.add_rms_norm_cpu(xs, as_, ws, 1e-6)[1]], [xs, as_, ws])
    want = paddle.grad([kernels.rms_norm_reference(*(t := [_t(x + a), _t(w)]), 1e-6)], t)
    for got, ref in zip((grads[0], grads[1], grads[2]), (want[0], want[0], want[1])):
        np.testing.assert_allclose(got.numpy(), ref.numpy(), atol=1e-5, rtol=1e-5)


def test_swiglu_packed_matches_reference():
    gu = (RNG.standard_normal((3, 5, 2 * 21)) * 3).astype("float32")
    _check(kernels.swiglu_packed_cpu, kernels.swiglu_packed, [gu], atol=1e-5)


@pytest.mark.parametrize("shape", [(3, 5, 40), (7, 40), (0, 40)])
def test_mlp_in_is_the_packed_gate_up_gemm_then_swiglu(shape):
    """x, gate and up weights: the one-op MLP input against the weight concat, matmul and SwiGLU it replaces,
    forward and all three gradients (odd widths; 3-D and 2-D x; no rows at all)."""
    x = RNG.standard_normal(shape).astype("float32")
    wg, wu = ((RNG.standard_normal((40, 21)) * 0.3).astype("float32") for _ in range(2))
    ref = lambda a, g, u: kernels.swiglu_packed(kernels.gate_up_packed(a, g, u))  # noqa: E731
    _check(kernels.mlp_in_cpu, ref, [x, wg, wu], atol=1e-5)


def test_mlp_in_refuses_mismatched_weights():
    with pytest.raises(Exception, match="gate and up weights must be"):
        kernels.mlp_in_cpu(paddle.zeros([2, 8]), paddle.zeros([8, 4]), paddle.zeros([8, 5]))
    with pytest.raises(Exception, match="x's last dim 6 != hidden 8"):
        kernels.mlp_in_cpu(paddle.zeros([2, 6]), paddle.zeros([8, 4]), paddle.zeros([8, 4]))


def test_rope_matches_gemm_rope_for_q_and_k():
    q = RNG.standard_normal((2, 7, 4, 10)).astype("float32")
    k = RNG.standard_normal((2, 7, 2, 10)).astype("float32")
    ang = RNG.standard_normal((7, 10)).astype("float32")
    cos, sin = paddle.to_tensor(np.cos(ang)), paddle.to_tensor(np.sin(ang))
    for i in (0, 1):
        _check(lambda a, b: kernels.rope_cpu(a, b, cos, sin)[i], lambda a, b: kernels.rope_reference(a, b, cos, sin)[i],
               [q, k], grad_mask=[i == 0, i == 1])


def test_rope_with_position_ids_matches_reference_forward_and_backward():
    q = RNG.standard_normal((2, 9, 4, 10)).astype("float32")
    k = RNG.standard_normal((2, 9, 2, 10)).astype("float32")
    ang = RNG.standard_normal((9, 10)).astype("float32")
    cos, sin = paddle.to_tensor(np.cos(ang)), paddle.to_tensor(np.sin(ang))
    pos = paddle.to_tensor(np.array([[0, 1, 2, 0, 1, 0, 1, 2, 3], [5, 6, 7, 8, 0, 1, 2, 3, 4]], np.int64))
    for i in (0, 1):
        _check(lambda a, b: kernels.rope_cpu(a, b, cos, sin, pos)[i],
               lambda a, b: kernels.rope_reference(a, b, cos, sin, pos)[i], [q, k], grad_mask=[i == 0, i == 1])
    with pytest.raises(Exception, match="outside the cos/sin table"):
        kernels.rope_cpu(paddle.to_tensor(q), paddle.to_tensor(k), cos, sin, pos + 1)


def test_cross_entropy_matches_paddle_and_ignores_minus_100():
    logits = (RNG.standard_normal((13, 37)) * 4).astype("float32")
    labels = RNG.integers(0, 37, 13).astype("int64")
    labels[[3, 8]] = -100
    lab = paddle.to_tensor(labels)
    _check(lambda x: kernels.cross_entropy_cpu(x, lab, -100), lambda x: kernels.cross_entropy_reference(x, lab, -100),
           [logits], atol=1e-5)
    rows = kernels.cross_entropy_cpu(paddle.to_tensor(logits), lab, -100).numpy()
    assert rows[3] == 0.0 and rows[8] == 0.0


def test_strided_inputs_are_read_correctly():
    x = RNG.standard_normal((3, 40, 7)).astype("float32")
    w = (RNG.random(40) + 0.5).astype("float32")
    view = paddle.to_tensor(x).transpose([0, 2, 1])  # [3, 7, 40], not contiguous
    got = kernels.rms_norm_cpu(view, paddle.to_tensor(w), 1e-6).numpy()
    want = kernels.rms_norm_reference(paddle.to_tensor(np.ascontiguousarray(x.transpose(0, 2, 1))),
                                      paddle.to_tensor(w), 1e-6).numpy()
    np.testing.assert_allclose(got, want, atol=1e-6)
    # attention reads v token-major at its row stride: a transposed (non-contiguous) v reads as its contiguous copy
    q, k = (RNG.standard_normal((2, 6, h, 4)).astype("float32") for h in (4, 2))
    v = RNG.standard_normal((2, 2, 6, 4)).astype("float32")  # [bsz, kv_heads, seq, head_dim]
    v_view = paddle.to_tensor(v).transpose([0, 2, 1, 3])  # [bsz, seq, kv_heads, head_dim], not contiguous
    got = kernels.attention_cpu(paddle.to_tensor(q), paddle.to_tensor(k), v_view).numpy()
    want = kernels.attention_math(*(paddle.to_tensor(a) for a in (q, k, np.ascontiguousarray(v.transpose(0, 2, 1, 3)))))
    np.testing.assert_allclose(got, want.numpy(), atol=1e-5)


def test_nan_propagates_so_the_nan_policy_still_fires():
    logits = RNG.standard_normal((2, 37)).astype("float32")
    logits[0, 5] = np.nan
    rows = kernels.cross_entropy_cpu(paddle.to_tensor(logits), paddle.to_tensor(np.array([1, 2])), -100).numpy()
    assert np.isnan(rows[0]) and np.isfinite(rows[1])
    y = kernels.rms_norm_cpu(paddle.full([1, 8], float("nan")), paddle.ones([8]), 1e-6).numpy()
    assert np.isnan(y).all()
    k = RNG.standard_normal((1, 5, 1, 4)).astype("float32")
    k[0, 3, 0, 0] = np.nan  # key 3 is seen by queries 3 and 4 only
    v = np.ones((1, 5, 1, 4), "float32")
    out = kernels.attention_cpu(*(paddle.to_tensor(a) for a in (np.ones((1, 5, 1, 4), "float32"), k, v))).numpy()
    assert np.isfinite(out[0, :3]).all() and np.isnan(out[0, 3:]).all()


def test_degenerate_shapes_are_errors_not_crashes():
    with pytest.raises(Exception, match="last dimension must be > 0"):  # was a SIGFPE (numel / 0)
        kernels.rms_norm_cpu(paddle.zeros([3, 0]), paddle.zeros([0]), 1e-6)
    with pytest.raises(Exception, match="last dimension must be > 0"):
        kernels.cross_entropy_cpu(paddle.zeros([3, 0]), paddle.to_tensor(np.array([0, 0, 0])), -100)
    with pytest.raises(Exception, match="head_dim must be even"):  # would leave a column unwritten
        OPS.rope_heads_first(paddle.zeros([1, 2, 1, 5]), paddle.zeros([2, 5]), paddle.zeros([2, 5]))


def test_silu_of_huge_gates_saturates():
    gu = np.array([[-1e38, 1e38, 3.0, 2.0]], dtype="float32")  # gates [-1e38, 1e38], ups [3, 2]
    x = _t(gu)
    out = kernels.swiglu_packed_cpu(x)
    np.testing.assert_allclose(out.numpy(), [[0.0, 2e38]], rtol=1e-6)
    (g,) = paddle.grad([out], [x], [paddle.ones_like(out)])
    np.testing.assert_allclose(g.numpy()[0, [0, 2]], [0.0, 0.0])  # d gate and d up of the dead unit


def test_out_of_vocabulary_label_is_an_error_not_a_wild_read():
    with pytest.raises(Exception, match="outside the vocabulary"):
        kernels.cross_entropy_cpu(paddle.randn([2, 5]), paddle.to_tensor(np.array([1, 7])), -100)


def test_fused_adamw_is_paddles_adamw_and_independent_of_threads():
    """`adamw_cpu` with decay exclusions and a clipping coefficient against Paddle's AdamW after `scale_`
    (bit for bit where the code paths agree, as on the AVX-512 and reference paths checked here), and the
    global norm against float64; 1 and 3 threads give the same bits."""
    shapes = [(40, 37), (37,), (300, 70), (5,), (20000,)]  # odd sizes: vector tails; > one 16Ki chunk
    decay = [True, False, True, False, True]

    def params():
        return [paddle.create_parameter(list(s), "float32") for s in shapes]

    def run(threads):
        _threads(threads)
        ref, fused = params(), params()
        for a, b, s in zip(ref, fused, shapes):
            init = np.random.default_rng(s[0]).standard_normal(s).astype("float32")
            a.set_value(init)
            b.set_value(init)
        names = {p.name: d for p, d in zip(ref, decay)}
        opt_ref = paddle.optimizer.AdamW(learning_rate=0.0, parameters=ref, beta1=0.9, beta2=0.95, weight_decay=0.1,
                                         apply_decay_param_fun=lambda n: names[n])
        opt = paddle.optimizer.AdamW(learning_rate=0.0, parameters=fused, beta1=0.9, beta2=0.95, weight_decay=0.1)
        opt._create_accumulators(paddle.static.default_main_program().global_block(), fused)
        norms = []
        for step in range(6):
            lr, coef = 3e-3 * (step + 1), (0.37 if step % 2 else 1.0)
            grads = [np.random.default_rng(100 + 10 * step + i).standard_normal(s).astype("float32")
                     for i, s in enumerate(shapes)]
            for a, b, g in zip(ref, fused, grads):
                a.grad, b.grad = paddle.to_tensor(g), paddle.to_tensor(g)
            norms.append((float(kernels.global_sq_norm_cpu([b.grad for b in fused])),
                          sum(float(np.square(g.astype(np.float64)).sum()) for g in grads)))
            opt_ref.set_lr(lr)
            with paddle.no_grad():
                for a in ref:
                    a.grad.scale_(coef)
            opt_ref.step()
            state = [[opt._get_accumulator_master(key, p) for p in fused]
                     for key in ("moment1", "moment2", "beta1_pow_acc", "beta2_pow_acc")]
            kernels.adamw_cpu(fused, [p.grad for p in fused], *state, decay, lr, 0.9, 0.95, 1e-8, 0.1, coef)
        return [p.numpy() for p in ref], [p.numpy() for p in fused], norms

    before = int(os.environ.get("OMP_NUM_THREADS", "1"))  # what `runtime` set before the import
    try:
        want, got, norms = run(1)
        _, got3, norms3 = run(3)
    finally:
        _threads(before)
    for a, b, c in zip(want, got, got3):
        np.testing.assert_allclose(b, a, atol=1e-7, rtol=1e-6)
        assert np.array_equal(b, c)
    assert norms == norms3
    for mine, exact in norms:
        assert mine == pytest.approx(exact, rel=1e-6)
