"""Every rank takes the same branch of a step (`training.step.Step`): the non-finite verdict comes from the ranks'
summed loss, one scalar all-reduce a step (the spike guard's mean rides on it), the same number on every rank. Before,
a rank's NaN loss with a finite global gradient norm was judged on that rank alone: it skipped (or stopped) while the
others stepped. Two ranks as threads over a fake all-reduce; the step's layout is fakes that only count."""
from __future__ import annotations

import math
import threading
from types import SimpleNamespace as NS

from pretrain_cli.training.step import Step


class ThreadComm:
    """`Comm.sum` over thread-ranks: each puts its value in, all wait, each reads the sum; `calls` counts them."""

    def __init__(self, hub: dict, rank: int, world: int):
        self.hub, self.rank, self.world, self.calls = hub, rank, world, 0

    def sum(self, value: float) -> float:
        self.calls += 1
        self.hub["values"][self.rank] = value
        self.hub["barrier"].wait()
        total = sum(self.hub["values"][r] for r in range(self.world))
        self.hub["barrier"].wait()  # every rank has read before the next sum writes
        return total

    def mean(self, value: float) -> float:
        return self.sum(value) / self.world


class Fake:
    """The layout's strategy and optimizer: the step's loss and (global) norm given, the update counted."""

    def __init__(self, loss: float, norm: float):
        self.loss, self.norm, self.updates = loss, norm, 0

    def forward_backward(self, model, taken, amp, forward_loss):
        return self.loss

    def to_host(self, x):
        return x

    def grad_norm(self, model):
        return self.norm

    def step(self, optimizer):
        self.updates += 1

    def __getattr__(self, name):  # set_lr, clear_grad, sync_grads: nothing to do
        return lambda *a, **k: None


class Amp:
    """fp32: no scaler; the update goes through the strategy's step."""

    def unscale(self, optimizer):
        pass

    def overflowed(self, loss, norm):
        return False

    def skip(self, optimizer, overflow=False):
        pass

    def step(self, optimizer, step_fn, overflow=False):
        step_fn(optimizer)


class Guard:
    def __init__(self):
        self.seen = []

    def check(self, stats, loss, norm):
        self.seen.append(loss)
        return None

    def accept(self, stats, loss, norm):
        pass


def _steps(losses: list, norm: float = 1.0, guard: bool = False) -> list:
    """One step on each of len(losses) thread-ranks, rank r's loss `losses[r]`: (outcome, loss reported, its comm's
    all-reduces, the update applied, the loss the guard judged) per rank."""
    world = len(losses)
    hub = {"values": {}, "barrier": threading.Barrier(world, timeout=30)}  # a rank that skips the sum times out
    run = NS(loop=NS(grad_accum=1), schedule=NS(lr_at=lambda t: 1e-3), optimizer=NS(max_grad_norm=0.0),
             moe=NS(bias_update_rate=0.0))
    out, errors = [None] * world, []

    def rank(r):
        try:
            comm, fake, g = ThreadComm(hub, r, world), Fake(losses[r], norm), Guard() if guard else None
            layout = NS(model=None, optimizer=fake, amp=Amp(), strategy=fake, raw_model=None)
            result = Step(run, comm, g)(layout, iter([{"input_ids": [[r]]}]), NS(global_step=4, spike_stats={}))
            out[r] = (result.outcome, result.loss, comm.calls, fake.updates, g.seen if g else None)
        except BaseException as e:  # noqa: BLE001 - the thread's error, for the assertion
            errors.append(e)
            hub["barrier"].abort()

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    return out


def test_one_ranks_nan_loss_with_a_finite_norm_sends_every_rank_down_the_non_finite_branch():
    out = _steps([2.5, math.nan])
    assert [o[0] for o in out] == ["non_finite", "non_finite"], out  # before: "applied" on rank 0 alone
    assert [o[3] for o in out] == [0, 0], out  # no rank updated
    assert all(math.isnan(o[1]) for o in out), out  # each says the loss that was not finite: the same words
    assert [o[2] for o in out] == [1, 1], out  # one scalar all-reduce a step


def test_one_ranks_inf_loss_is_agreed_too_and_finite_losses_step_everywhere():
    assert [o[0] for o in _steps([math.inf, 2.0])] == ["non_finite", "non_finite"]
    assert [o[0] for o in _steps([2.0, 3.0])] == ["applied", "applied"]
    assert [o[0] for o in _steps([2.0, 3.0], norm=math.nan)] == ["non_finite", "non_finite"]


def test_the_spike_guard_judges_the_ranks_mean_loss_from_the_same_all_reduce():
    out = _steps([2.0, 4.0], guard=True)
    assert [o[0] for o in out] == ["applied", "applied"]
    assert [o[4] for o in out] == [[3.0], [3.0]] and [o[2] for o in out] == [1, 1], out  # no second all-reduce
