"""The CPU kernel tests' shared pieces: a tensor with or without its gradient, a kernel against the reference it
replaces (outputs and input gradients for one random upstream gradient), each token's document start from a row's
cuts, and the OpenMP thread count the kernels share with MKL (test_cpu_ops.py, test_cpu_attention.py)."""
import numpy as np

from pretrain_cli import runtime

paddle = runtime.import_paddle()


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


def _doc_start(seq_len, *cuts_per_row):
    """int64 [rows, seq_len]: for each row, the latest document start (from `cuts`, which include 0) <= i."""
    out = np.zeros((len(cuts_per_row), seq_len), np.int64)
    for b, cuts in enumerate(cuts_per_row):
        for c in sorted(cuts):
            out[b, c:] = c
    return out


def _threads(n: int) -> None:
    paddle.base.core.set_num_threads(n)  # the OpenMP runtime the kernels share with MKL
