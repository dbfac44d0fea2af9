"""The fused CPU attention kernel (csrc/attention.cc) against the naive math it replaces, forward and backward:
causal (GQA, MQA, KV-cache prefill, one-token decode, after RoPE's views) and document-masked (documents at and
across the 64-row block edges, 1-token documents); the probabilities it keeps for its backward, at the size the
planner counts (`cpu_ops.attention_probs_per_head`); its backward the same bits on any thread count.

Shapes are deliberately odd (head_dim 10, lengths off the 64-row blocks) so vector tails and thread splits are
exercised.
"""
import os

import numpy as np
import pytest

from pretrain_cli import runtime

paddle = runtime.import_paddle()

from cpu_kernel_checks import _check, _doc_start, _t, _threads  # noqa: E402
from pretrain_cli.ops import cpu_ops, kernels  # noqa: E402

RNG = np.random.default_rng(0)


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
