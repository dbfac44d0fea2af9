"""Tensors made from numpy batches leak nothing per call (ops.tensors.from_numpy).

`paddle.to_tensor` leaks one Python list per call in Paddle 3.3.1; a training step made its batch's tensors
with it, so a long run's host memory grew at every micro-batch. Counted, not timed: the gc-tracked objects
alive after N calls."""
from __future__ import annotations

import numpy as np
import paddle

from object_leaks import N, alive_after
from pretrain_cli.ops.tensors import from_numpy
from pretrain_cli.training.evaluation import model_inputs


def test_paddle_to_tensor_still_leaks_so_the_workaround_is_needed():
    a = np.zeros((2, 8), np.int64)
    # one list per call; if this fails, Paddle fixed it: ops/tensors.py can go
    assert alive_after(lambda: paddle.to_tensor(a)) > N // 2


def test_a_steps_batch_tensors_leave_nothing_behind():
    rng = np.random.default_rng(0)
    batch = {"input_ids": rng.integers(0, 500, (2, 16)), "labels": rng.integers(0, 500, (2, 16)),
             "doc_start": np.zeros((2, 16), np.int64), "position_ids": np.tile(np.arange(16), (2, 1))}
    assert alive_after(lambda: model_inputs(batch)) < 10  # was 4 lists per call: 1,200
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


def test_the_log_lines_all_reduces_leave_nothing_behind(monkeypatch):
    """Each log line of a multi-process run all-reduces the logged losses (`Strategy.share_logged`) and a MoE model's
    per-layer load (`whole_model_rows`; a pipeline's two all-reduces): their tensors were `paddle.to_tensor`'s, a
    list left behind each. The all-reduce here is a group of one (each tensor as it is), recorded."""
    from types import SimpleNamespace

    import paddle.distributed as dist

    from pretrain_cli.distributed.strategies.pipeline import Pipeline
    from pretrain_cli.distributed.strategies.strategy import LOGGED, Strategy

    reduced, made, to_tensor = [], [0], paddle.to_tensor
    sums = {"aux_loss": (paddle.full([], 1.5), 3)}  # a sum of scalar tensors, as `moe_loss.add_logged` keeps it

    def counted_to_tensor(*args, **kwargs):
        made[0] += 1
        return to_tensor(*args, **kwargs)

    monkeypatch.setattr(dist, "all_reduce", lambda t, op=None, **kw: reduced.append((t.dtype, t.shape)))
    monkeypatch.setattr(paddle, "to_tensor", counted_to_tensor)

    def strategy(cls):
        s = object.__new__(cls)  # the parts these methods read: two ranks, a pipeline's last stage of two
        s.parallel, s.topology = SimpleNamespace(world_size=2, pp_degree=2), SimpleNamespace(stage=1)
        return s

    rows = np.arange(12, dtype=np.float32).reshape(3, 4)  # [layers, experts + 1]
    plain, piped = strategy(Strategy), strategy(Pipeline)
    plain.share_logged(sums)
    assert sums == {"aux_loss": (1.5, 3)} and reduced == [(paddle.float32, [2 * len(LOGGED)])]
    np.testing.assert_array_equal(plain.whole_model_rows(rows), rows)
    np.testing.assert_array_equal(piped.whole_model_rows(rows), rows)  # the last stage's rows after none of the first's
    assert reduced[1:] == [(paddle.float32, [3, 4]), (paddle.float32, [2]), (paddle.float32, [3, 4])]

    def log_line():
        plain.share_logged(dict(sums))
        plain.whole_model_rows(rows)
        piped.whole_model_rows(rows)

    monkeypatch.setattr(dist, "all_reduce", lambda t, op=None, **kw: None)  # (the records would stay alive)
    assert alive_after(log_line) < 10  # was 4 lists per call: 1,200
    assert made == [0]
