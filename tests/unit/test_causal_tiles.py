"""The attention kernel's diagonal-square tiles (ops/csrc/causal_tiles.h): with head_dim a multiple of 16 each query
block's square is multiplied over its lower triangle by AVX-512 tiles, the keys before it by MKL. These shapes put
the tiles through every case against the reference attention, forward and all three gradients: full and partial
tiles, blocks with and without keys before the square, KV-cache prefill and decode, GQA and MQA, every tile width
(head_dim 16 … 128 and 256), and documents cut inside and at the edges of blocks."""
import numpy as np
import pytest

from pretrain_cli import runtime

runtime.import_paddle()
import paddle  # noqa: E402

from pretrain_cli.ops import cpu_ops, kernels  # noqa: E402

assert cpu_ops.load() is not None, cpu_ops.load_error()
RNG = np.random.default_rng(11)


def _check(fast, ref, arrays, atol=2e-5):
    outs = []
    for fn in (fast, ref):
        ts = [paddle.to_tensor(a, stop_gradient=False) for a in arrays]
        y = fn(*ts)
        g = paddle.to_tensor(np.random.default_rng(9).standard_normal(y.shape).astype("float32"))
        outs.append([y.numpy()] + [x.numpy() for x in paddle.grad([y], ts, [g])])
    for name, a, b in zip(("out", "dq", "dk", "dv"), *outs):
        np.testing.assert_allclose(a, b, atol=atol, rtol=1e-5, err_msg=name)


def _qkv(q_len, k_len, heads, kv_heads, head_dim, bsz=2):
    return [RNG.standard_normal((bsz, n, h, head_dim)).astype("float32")
            for n, h in ((q_len, heads), (k_len, kv_heads), (k_len, kv_heads))]


@pytest.mark.parametrize("q_len,k_len,heads,kv_heads,head_dim", [
    (6, 6, 4, 2, 16),  # one block smaller than a tile: the square is all there is
    (70, 70, 4, 2, 32),  # a full square, then a 6-row one with 64 keys before it
    (130, 130, 2, 1, 48),  # three widths of 16 (tiles of 4 rows), MQA, a 2-row last block
    (128, 128, 4, 2, 64),
    (100, 100, 2, 2, 128),  # tiles of 2 rows
    (40, 40, 2, 1, 256),  # tiles of 1 row
    (67, 75, 4, 4, 32),  # KV-cache prefill: the squares sit 8 keys right of the rows
    (1, 9, 4, 2, 16),  # a decode step: a 1 x 1 square after 8 keys
    (256, 256, 8, 4, 32),  # bench's attention
])
def test_causal_attention_with_tiles_matches_the_reference(q_len, k_len, heads, kv_heads, head_dim):
    _check(kernels.attention_cpu, kernels.attention_math, _qkv(q_len, k_len, heads, kv_heads, head_dim))


@pytest.mark.parametrize("seq_len,cuts", [
    (150, ([0, 10, 11, 80, 149], [0, 64, 100])),  # 1-token documents, a start at a block edge, a 1-row last block
    (70, ([0, 5, 64, 66], [0, 1, 2, 40])),
])
def test_document_attention_with_tiles_matches_the_reference(seq_len, cuts):
    start = np.zeros((2, seq_len), np.int64)
    for b, row in enumerate(cuts):
        for c in sorted(row):
            start[b, c:] = c
    st = paddle.to_tensor(start)
    _check(lambda q, k, v: kernels.attention_cpu_document(q, k, v, st),
           lambda q, k, v: kernels.attention_math(q, k, v, st), _qkv(seq_len, seq_len, 4, 2, 32))


def test_a_non_finite_key_reaches_only_the_rows_that_see_it():
    """Tiles read entries above the diagonal as exact zeros: a NaN key must not leak into rows before it."""
    q, k, v = _qkv(40, 40, 2, 1, 16, bsz=1)
    k[0, 20, 0, 3] = np.nan
    out = kernels.attention_cpu(*(paddle.to_tensor(a) for a in (q, k, v))).numpy()
    assert np.isfinite(out[0, :20]).all() and np.isnan(out[0, 20:]).all()
