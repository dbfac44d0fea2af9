"""Tensors made from numpy batches leak nothing per call (ops.tensors.from_numpy).

`paddle.to_tensor` leaks one Python list per call in Paddle 3.3.1; a training step made its batch's tensors
with it, so a long run's host memory grew at every micro-batch. Counted, not timed: the gc-tracked objects
alive after N calls."""
from __future__ import annotations

import gc

import numpy as np
import paddle

from pretrain_cli.ops.tensors import from_numpy
from pretrain_cli.training.evaluation import model_inputs

N = 300


def _alive_after(fn, n: int = N) -> int:
    fn()  # anything made once (caches, imports) is not a leak
    gc.collect()
    before = len(gc.get_objects())
    for _ in range(n):
        fn()
    gc.collect()
    return len(gc.get_objects()) - before


def test_paddle_to_tensor_still_leaks_so_the_workaround_is_needed():
    a = np.zeros((2, 8), np.int64)
    # one list per call; if this fails, Paddle fixed it: ops/tensors.py can go
    assert _alive_after(lambda: paddle.to_tensor(a)) > N // 2


def test_a_steps_batch_tensors_leave_nothing_behind():
    rng = np.random.default_rng(0)
    batch = {"input_ids": rng.integers(0, 500, (2, 16)), "labels": rng.integers(0, 500, (2, 16)),
             "doc_start": np.zeros((2, 16), np.int64), "position_ids": np.tile(np.arange(16), (2, 1))}
    assert _alive_after(lambda: model_inputs(batch)) < 10  # was 4 lists per call: 1,200
    ids, extra, labels = model_inputs(batch)
    assert ids.dtype == paddle.int64 and ids.stop_gradient and labels.shape == [2, 16]
    np.testing.assert_array_equal(ids.numpy(), batch["input_ids"])
    np.testing.assert_array_equal(labels.numpy(), batch["labels"])
    np.testing.assert_array_equal(extra["position_ids"].numpy(), batch["position_ids"])


def test_from_numpy_is_to_tensor_for_what_the_code_passes_it():
    cases = [np.arange(6, dtype=np.int64).reshape(2, 3), np.arange(6, dtype=np.int64).reshape(2, 3)[:, -1:],
             [1.5], np.array([True, False]), np.float32(3.0), np.zeros((2, 0)), np.arange(4, dtype=np.uint16)]
    for a in cases:
        got, want = from_numpy(a), paddle.to_tensor(np.asarray(a))
        assert (got.dtype, list(got.shape), got.stop_gradient) == (want.dtype, list(want.shape), want.stop_gradient)
        np.testing.assert_array_equal(got.numpy(), want.numpy())
    a = np.arange(4, dtype=np.int64)
    t = from_numpy(a)
    a[0] = 9  # the tensor owns its memory: a later change of the array is not seen
    assert int(t.numpy()[0]) == 0
