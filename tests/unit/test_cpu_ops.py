"""The fused CPU kernels (csrc/) against the reference ops they replace, forward and backward.

Shapes are deliberately odd (hidden 40, head_dim 10, vocab 37) so vector tails and thread splits are
exercised; GQA, KV-cache-style q_len < k_len and strided (transposed) inputs are included.
"""
import os
import warnings

import numpy as np
import pytest

from pretrain_cli import runtime

paddle = runtime.import_paddle()

import paddle.nn.functional as F  # noqa: E402

from pretrain_cli.ops import cpu_ops, kernels, reference  # noqa: E402

OPS = cpu_ops.load()


def _t(a, grad=True):
    t = paddle.to_tensor(a)
    t.stop_gradient = not grad
    return t


def _check(fast, ref, arrays, atol=2e-6, grad_mask=None):
    """Same outputs and same input gradients for a random upstream gradient."""
    grad_mask = grad_mask or [True] * len(arrays)
    outs = []
    for fn in (fast, ref):
        ts = [_t(a, g) for a, g in zip(arrays, grad_mask)]
        y = fn(*ts)
        g = paddle.to_tensor(np.random.default_rng(9).standard_normal(y.shape).astype("float32"))
        grads = paddle.grad([y], [t for t, m in zip(ts, grad_mask) if m], [g])
        outs.append([y.numpy()] + [x.numpy() for x in grads])
    for a, b in zip(*outs):
        np.testing.assert_allclose(a, b, atol=atol, rtol=1e-5)


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


@pytest.mark.parametrize("q_len,k_len,heads,kv_heads", [
    (6, 6, 4, 2),  # one block, GQA
    (70, 70, 4, 2),  # two query blocks (64 + 6): the second multiplies all 70 keys, the first only 64
    (130, 130, 2, 1),  # three blocks, MQA
    (128, 128, 4, 2),  # rows of 128 keys are 64-byte aligned: the probabilities go out with non-temporal stores
    (67, 75, 4, 4),  # KV-cache prefill over cached keys: bottom-right aligned, blocks straddle the shift
    (1, 9, 4, 2),  # one-token decode step
])
def test_attention_matches_naive_attention(q_len, k_len, heads, kv_heads):
    q = RNG.standard_normal((2, q_len, heads, 10)).astype("float32")
    k = RNG.standard_normal((2, k_len, kv_heads, 10)).astype("float32")
    v = RNG.standard_normal((2, k_len, kv_heads, 10)).astype("float32")
    _check(kernels.attention_cpu, kernels.attention_math, [q, k, v], atol=1e-5)


def test_attention_after_rope_views_matches_reference_path():
    """The production pairing: `rope_cpu` hands attention views of its head-major buffers."""
    q = RNG.standard_normal((2, 70, 4, 8)).astype("float32")
    k = RNG.standard_normal((2, 70, 2, 8)).astype("float32")
    v = RNG.standard_normal((2, 70, 2, 8)).astype("float32")
    ang = RNG.standard_normal((70, 8)).astype("float32")
    cos, sin = paddle.to_tensor(np.cos(ang)), paddle.to_tensor(np.sin(ang))

    def fast(a, b, c):
        return kernels.attention_cpu(*kernels.rope_cpu(a, b, cos, sin), c)

    def ref(a, b, c):
        return kernels.attention_math(*kernels.rope_reference(a, b, cos, sin), c)

    _check(fast, ref, [q, k, v], atol=1e-5)


def _doc_start(seq_len, *cuts_per_row):
    """int64 [rows, seq_len]: for each row, the latest document start (from `cuts`, which include 0) <= i."""
    out = np.zeros((len(cuts_per_row), seq_len), np.int64)
    for b, cuts in enumerate(cuts_per_row):
        for c in sorted(cuts):
            out[b, c:] = c
    return out


@pytest.mark.parametrize("seq_len,heads,kv_heads,cuts", [
    (70, 4, 2, ([0, 5, 64, 66], [0, 1, 2, 40])),  # a document starting at the block edge 64; 1-token documents
    (130, 2, 1, ([0, 60, 129], [0, 63, 65, 127])),  # documents spanning two block edges, MQA, odd tails
    (67, 3, 3, ([0, 33], [0, 1, 2, 3, 4, 5, 66])),  # odd sizes, MHA, a run of 1-token documents
    (9, 4, 2, ([0], [0, 8])),  # one block; a row with one document (= causal) next to two
    (128, 4, 2, ([0, 16, 64, 100], [0, 3])),  # blocks of widths that are and are not multiples of 16 (stores)
])
def test_document_attention_matches_masked_math_forward_and_backward(seq_len, heads, kv_heads, cuts):
    q = RNG.standard_normal((2, seq_len, heads, 10)).astype("float32")
    k = RNG.standard_normal((2, seq_len, kv_heads, 10)).astype("float32")
    v = RNG.standard_normal((2, seq_len, kv_heads, 10)).astype("float32")
    start = paddle.to_tensor(_doc_start(seq_len, *cuts))
    _check(lambda a, b, c: kernels.attention_cpu_document(a, b, c, start),
           lambda a, b, c: kernels.attention_math(a, b, c, start), [q, k, v], atol=1e-5)


def test_document_attention_rows_at_document_starts_and_single_documents():
    q, k, v = (RNG.standard_normal((1, 70, 2, 8)).astype("float32") for _ in range(3))
    every_row = paddle.to_tensor(np.arange(70, dtype=np.int64)[None])  # each token its own document
    out = kernels.attention_cpu_document(*(paddle.to_tensor(a) for a in (q, k, v)), every_row).numpy()
    np.testing.assert_array_equal(out, v)  # a row that sees only itself returns its own value exactly
    one_doc = paddle.to_tensor(np.zeros((1, 70), np.int64))
    same = kernels.attention_cpu_document(*(paddle.to_tensor(a) for a in (q, k, v)), one_doc).numpy()
    np.testing.assert_array_equal(same, kernels.attention_cpu(*(paddle.to_tensor(a) for a in (q, k, v))).numpy())


def test_document_attention_rejects_inconsistent_starts():
    q = paddle.zeros([1, 6, 1, 4])
    with pytest.raises(Exception, match="neither continues the previous document"):
        kernels.attention_cpu_document(q, q, q, paddle.to_tensor(np.array([[0, 0, 1, 1, 1, 1]], np.int64)))
    with pytest.raises(Exception, match="must be 0"):
        kernels.attention_cpu_document(q, q, q, paddle.to_tensor(np.array([[2, 2, 2, 3, 3, 3]], np.int64)))


@pytest.mark.parametrize("q_len,k_len", [(256, 256), (70, 70), (5, 40), (64, 64), (1, 300), (130, 131)])
def test_attention_keeps_only_its_blocks_probabilities(q_len, k_len):
    """The buffer the forward hands its backward holds each 64-row query block's keys only: its size is
    `cpu_ops.attention_probs_per_head` (what the planner counts), about half of [q_len, k_len] for long ones."""
    from paddle import _C_ops

    q, k = paddle.zeros([2, 3, q_len, 8]), paddle.zeros([2, 1, k_len, 8])
    v = paddle.zeros([2, k_len, 1, 8])
    probs = _C_ops._run_custom_op("pcl_causal_attention", q, k, v, 0.5)[1]
    assert probs.shape == [2, 3, cpu_ops.attention_probs_per_head(q_len, k_len)]
    assert cpu_ops.attention_probs_per_head(q_len, k_len) <= q_len * k_len
    starts = paddle.to_tensor(_doc_start(k_len, [0, k_len // 3], [0]))
    if q_len == k_len:
        probs = _C_ops._run_custom_op("pcl_document_attention", q, k, v, starts, 0.5)[1]
        assert probs.shape == [2, 3, cpu_ops.attention_probs_per_head(q_len, k_len)]


def test_the_kept_probabilities_closed_form_is_the_sum():
    """`attention_probs_per_head` (closed form, for the planner) equals attention.cc's row-by-row sum."""
    for q_len in range(0, 200):
        for k_len in (q_len, q_len + 1, q_len + 63, q_len + 64, q_len + 139):
            assert cpu_ops.attention_probs_per_head(q_len, k_len) == sum(
                min(k_len, k_len - q_len + i + cpu_ops.ATTENTION_BLOCK) for i in range(q_len)), (q_len, k_len)


def test_every_document_blocking_fits_the_kept_probabilities():
    """attention.cc cuts query blocks at document starts (`block_rows`), each multiplying its document's keys up to
    its last row: for any documents the blocks' rows × keys stay within `attention_probs_per_head`, the buffer's
    size (else the forward would write past a head's share)."""
    rng = np.random.default_rng(3)
    for _ in range(300):
        s = int(rng.integers(1, 300))
        cuts = sorted({0, *rng.integers(0, s, int(rng.integers(0, 12))).tolist()})
        st = _doc_start(s, cuts)[0]
        used, i0 = 0, 0
        while i0 < s:
            m = 1
            while m < cpu_ops.ATTENTION_BLOCK and i0 + m < s and st[i0 + m] == st[i0]:
                m += 1
            used += m * (i0 + m - st[i0])
            i0 += m
        assert used <= cpu_ops.attention_probs_per_head(s, s), (s, cuts)


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


# ------------------------------------------------------------------------------ selection
def _threads(n: int) -> None:
    paddle.base.core.set_num_threads(n)  # the OpenMP runtime the kernels share with MKL


def test_attention_backward_with_one_kv_head_is_parallel_and_the_same_on_any_thread_count():
    """Batch 1 with one KV head is one (batch, KV head) item: its query blocks are sliced over the threads
    (each slice with its own dK/dV, added in a fixed order), so 1, 2 and 3 threads give the same bits."""
    q = RNG.standard_normal((1, 300, 4, 10)).astype("float32")  # 5 query blocks, GQA 4:1
    k = RNG.standard_normal((1, 300, 1, 10)).astype("float32")
    v = RNG.standard_normal((1, 300, 1, 10)).astype("float32")
    start = paddle.to_tensor(_doc_start(300, [0, 3, 64, 200]))
    paths = {"causal": kernels.attention_cpu, "document": lambda a, b, c: kernels.attention_cpu_document(a, b, c, start)}
    before = int(os.environ.get("OMP_NUM_THREADS", "1"))  # what `runtime` set before the import
    try:
        for name, fn in paths.items():
            grads = []
            for n in (1, 2, 3):
                _threads(n)
                ts = [_t(a) for a in (q, k, v)]
                y = fn(*ts)
                g = paddle.to_tensor(np.random.default_rng(9).standard_normal(y.shape).astype("float32"))
                grads.append([x.numpy() for x in paddle.grad([y], ts, [g])])
            for other in grads[1:]:
                assert all(np.array_equal(a, b) for a, b in zip(grads[0], other)), name
    finally:
        _threads(before)
    ref = lambda a, b, c: kernels.attention_math(a, b, c, start)  # noqa: E731
    _check(paths["document"], ref, [q, k, v], atol=1e-5)
    _check(paths["causal"], kernels.attention_math, [q, k, v], atol=1e-5)


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


def test_cpu_selection_uses_the_fused_kernels_silently():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        k = kernels.select(kernels.KernelConfig(attention="flash"), "cpu")
        fused_requests = kernels.select(kernels.KernelConfig(rms_norm="fused", rope="fused", swiglu="fused"), "cpu")
    assert (k.attention, k.rms_norm, k.rope, k.cross_entropy, k.swiglu_packed) == (
        kernels.attention_cpu, kernels.rms_norm_cpu, kernels.rope_cpu, kernels.cross_entropy_cpu,
        kernels.swiglu_packed_cpu)
    assert k.attention_cached is kernels.attention_cpu and k.add_rms_norm is kernels.add_rms_norm_cpu
    assert k.mlp_in is kernels.mlp_in_cpu and "gate|up GEMM + SwiGLU as one op" in k.describe()
    assert k.attention_document is kernels.attention_cpu_document and "documents: cpu_document" in k.describe()
    assert fused_requests.rms_norm is kernels.rms_norm_cpu  # a fused request is served by the CPU kernel
    assert "attention=cpu" in k.describe()


def test_cpu_ops_off_is_the_paddle_only_path(monkeypatch):
    """`cpu_fused_ops: false` is the one switch (no environment variable): nothing loads the fused CPU kernels."""
    from run_helpers import resolve_run

    assert resolve_run("--use_flash_attention").kernels.cpu_ops is True
    off = resolve_run("--use_flash_attention", "--cpu_fused_ops", "false").kernels
    assert off.cpu_ops is False
    k = kernels.select(off, "cpu")
    assert (k.attention, k.rms_norm, k.cross_entropy, k.add_rms_norm, k.mlp_in) == (
        kernels.attention_sdpa_mask, kernels.rms_norm_reference, kernels.cross_entropy_reference, None, None)
    assert k.attention_document is kernels.attention_sdpa_mask  # with the per-sample document mask
    monkeypatch.setattr(cpu_ops, "load", lambda: pytest.fail("cpu_fused_ops false loaded the fused CPU kernels"))
    h = paddle.randn([6, 8])
    h.stop_gradient = False
    w = paddle.randn([8, 11])
    w.stop_gradient = False
    k.linear_cross_entropy(h, w, paddle.to_tensor(np.arange(6) % 11), -100, False).backward()  # the chunked path
    assert k.linear_cross_entropy_name == "chunked" and h.grad is not None and w.grad is not None


def test_failed_build_falls_back_with_one_warning_naming_why(monkeypatch):
    monkeypatch.setattr(cpu_ops, "_STATE", {"error": "compiler failed: g++ not found"})
    with pytest.warns(RuntimeWarning) as rec:
        k = kernels.select(kernels.KernelConfig(), "cpu")
    msgs = [str(w.message) for w in rec if str(w.message).startswith("kernels on")]
    assert len(msgs) == 1 and "g++ not found" in msgs[0]
    assert k.attention is kernels.attention_sdpa_mask and k.rms_norm is kernels.rms_norm_reference
    with pytest.warns(RuntimeWarning, match="fused AdamW step needs the fused CPU kernels.*g\\+\\+ not found"):
        step = kernels.select_step(kernels.KernelConfig(), "cpu")
    assert step.adamw is None and step.global_sq_norm is kernels.global_sq_norm_reference


def test_step_selection_follows_the_run_configuration():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fused = kernels.select_step(kernels.KernelConfig(), "cpu")
        paddle_step = kernels.select_step(kernels.KernelConfig(optimizer="paddle"), "cpu")
        no_cpu_ops = kernels.select_step(kernels.KernelConfig(cpu_ops=False), "cpu")
    assert (fused.name, fused.adamw, fused.global_sq_norm) == ("fused_cpu", kernels.adamw_cpu,
                                                               kernels.global_sq_norm_cpu)
    assert paddle_step.adamw is None and no_cpu_ops.adamw is None
