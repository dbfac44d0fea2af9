"""training.spike: the running means, the verdict, and the rule that stops a second rollback at one step."""
from types import SimpleNamespace

import pytest

from run_helpers import resolve_run
from pretrain_cli.run_config import SpikeGuardConfig
from pretrain_cli.errors import UserError
from pretrain_cli.training.spike import SpikeError, SpikeGuard, SpikePolicy


def test_means_are_plain_until_the_window_fills_then_exponential():
    g, stats = SpikeGuard(SpikeGuardConfig("skip", 2.0, 10.0, warmup_steps=2, window=2)), {}
    g.accept(stats, 4.0, 1.0)
    g.accept(stats, 2.0, 3.0)
    assert stats == {"loss": 3.0, "grad_norm": 2.0, "n": 2}
    g.accept(stats, 1.0, 2.0)  # weight 1/2 from now on
    assert stats["loss"] == 2.0 and stats["n"] == 3


def test_verdict_waits_for_warmup_and_names_what_spiked():
    g = SpikeGuard(SpikeGuardConfig("skip", 2.0, 10.0, warmup_steps=3, window=5))
    stats = {"loss": 1.0, "grad_norm": 1.0, "n": 2}
    assert g.check(stats, 100.0, 100.0) is None  # still warming up
    stats["n"] = 3
    assert g.check(stats, 1.9, 9.0) is None
    assert g.check(stats, 2.5, 1.0) == "loss 2.5 > 2 x mean 1"
    assert "grad norm 11 > 10 x mean 1" in g.check(stats, 1.0, 11.0)
    off = SpikeGuard(SpikeGuardConfig("skip", 0.0, 10.0, warmup_steps=0, window=5))
    assert off.check({"loss": 1.0, "grad_norm": 1.0, "n": 1}, 50.0, 1.0) is None  # factor 0: loss not checked


def test_second_rollback_at_the_same_step_stops():
    events = []  # the policy's whole view of the run: `spike.Recoverable`
    run = SimpleNamespace(state=SimpleNamespace(global_step=16, rollbacks=[{"spike_step": 17}],
                                                spike_stats={"loss": 1.0, "grad_norm": 1.0}),
                          newest_checkpoint=lambda: None, reload=lambda path: pytest.fail("nothing to reload"),
                          record_event=lambda kind, values, step=None: events.append((step, values["action"])))
    policy = SpikePolicy(SpikeGuardConfig("rollback"), skip_limit=3, global_batch=4)
    with pytest.raises(SpikeError, match="step 17: loss spike .* again after a rollback to the same step"):
        policy.handle(run, "loss 9 > 2 x mean 1", 9.0, 1.0, 64)
    assert events == [(17, "stop")]
    run.state.rollbacks = []
    with pytest.raises(SpikeError, match="no checkpoint to roll back to"):
        policy.handle(run, "loss 9 > 2 x mean 1", 9.0, 1.0, 64)


def test_the_policy_books_a_skip_through_the_trainer_and_changes_no_counter_itself():
    """`skip` asks the run to book the skipped step (`Recoverable.skip`, the trainer's one bookkeeping, shared
    with the non-finite policy) and words its line and its limit from what that returns; the state it reads is
    frozen here, so a counter changed by the policy itself would raise."""
    from dataclasses import dataclass, field

    @dataclass(frozen=True)
    class State:
        global_step: int = 9
        spike_stats: dict = field(default_factory=lambda: {"loss": 1.0, "grad_norm": 1.0})

    booked, events = [], []

    def skip(first_sample):
        booked.append(first_sample)
        return len(booked), len(booked) + 5  # in a row, in total

    run = SimpleNamespace(state=State(), skip=skip, record_event=lambda kind, values, step=None: events.append(step))
    policy = SpikePolicy(SpikeGuardConfig("skip"), skip_limit=2, global_batch=4)
    assert policy.handle(run, "loss 9 > 2 x mean 1", 9.0, 1.0, 36) is False
    assert booked == [36] and events == [10]
    with pytest.raises(SpikeError, match="step 10: 2 consecutive skipped steps .*nan_skip_limit 2"):
        policy.handle(run, "loss 9 > 2 x mean 1", 9.0, 1.0, 40)
    assert booked == [36, 40]


def test_resolved_keys_and_their_checks():
    assert resolve_run().spike == SpikeGuardConfig() and not SpikeGuardConfig().enabled  # default: today's loop
    r = resolve_run("--spike_policy", "rollback", "--spike_loss_factor", "3", "--spike_window", "20",
                    "--async_save", "true")
    assert (r.spike.policy, r.spike.loss_factor, r.spike.window, r.loop.async_save) == ("rollback", 3.0, 20, True)
    with pytest.raises(UserError) as e:
        resolve_run("--spike_grad_norm_factor", "0.5", "--spike_window", "0")
    assert "spike_grad_norm_factor: must be 0 (off) or a finite factor > 1" in str(e.value)
    assert "spike_window: must be >= 1" in str(e.value)
    # the semi-auto engine (TP, ZeRO-2/3) rebuilds the model and its layout from the checkpoint; the others reload
    assert resolve_run("--spike_policy", "rollback", "--tensor_parallel_degree", "2", world=2).spike.rollback_rebuilds
    assert resolve_run("--spike_policy", "rollback", "--sharding", "stage2", world=2).spike.rollback_rebuilds
    assert not resolve_run("--spike_policy", "rollback", "--sharding", "stage1", world=2).spike.rollback_rebuilds
    assert not resolve_run("--spike_policy", "rollback", world=2).spike.rollback_rebuilds
    assert not resolve_run("--spike_policy", "skip", "--sharding", "stage3", world=2).spike.rollback_rebuilds
    # expert parallelism holds only its rank's experts (on data parallelism): whole tensors would not fit it
    assert resolve_run("--spike_policy", "rollback", "--expert_parallel_degree", "2", world=2,
                       model="micro-qwen3-moe").spike.rollback_rebuilds
