"""`lr_scheduler_type: warmup_stable_decay` (config/schedule.py → run_config.Schedule) against transformers'
`get_wsd_schedule`: our step t (counted from 1, PaddleNLP's convention) is transformers' scheduler after t steps."""
import pytest
import torch
from run_helpers import resolve_run
from transformers.optimization import get_wsd_schedule

from pretrain_cli.errors import UserError

KEYS = ["--lr_scheduler_type", "warmup_stable_decay", "--learning_rate", "0.01", "--warmup_steps", "10"]


def _hf(steps: int, **kw) -> list[float]:
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=0.01)
    sched = get_wsd_schedule(opt, 10, **kw)
    lrs = []
    for _ in range(steps + 1):
        lrs.append(sched.get_last_lr()[0])
        opt.step()
        sched.step()
    return lrs


@pytest.mark.parametrize("shape", ["linear", "cosine", "1-sqrt"])
def test_rates_equal_transformers(shape):
    run = resolve_run(*KEYS, "--max_steps", "200", "--num_decay_steps", "40", "--min_lr_ratio", "0.1",
                      "--decay_type", shape)
    want = _hf(210, num_decay_steps=40, num_training_steps=200, decay_type=shape, min_lr_ratio=0.1)
    got = [run.schedule.lr_at(t) for t in range(211)]
    assert got == pytest.approx(want, rel=1e-12, abs=1e-15)
    assert [run.schedule.phase(t) for t in (9, 10, 159, 160, 199, 200)] == \
           ["warmup", "stable", "stable", "decay", "decay", "annealed"]


def test_explicit_stable_steps_and_the_min_learning_rate_default():
    """num_stable_steps fixes where the decay starts whatever max_steps is; without min_lr_ratio the floor is
    min_learning_rate (the PaddleNLP key) as a ratio of learning_rate."""
    run = resolve_run(*KEYS, "--max_steps", "500", "--num_stable_steps", "100", "--num_decay_steps", "50",
                      "--min_learning_rate", "0.002")
    want = _hf(500, num_decay_steps=50, num_stable_steps=100, min_lr_ratio=0.2)
    assert [run.schedule.lr_at(t) for t in range(501)] == pytest.approx(want, rel=1e-12, abs=1e-15)
    assert "stable to step 110, cosine decay to 0.002 by step 160" in run.schedule.describe()


def test_defaults_and_refusals():
    run = resolve_run(*KEYS, "--max_steps", "200")
    assert run.schedule.decay_start == 180 and any("num_decay_steps not set" in n for n in run.notes)
    with pytest.raises(UserError, match="num_decay_steps: warmup 10 \\+ stable -10"):
        resolve_run(*KEYS, "--max_steps", "100", "--num_decay_steps", "100")
    with pytest.raises(UserError, match="min_lr_ratio: must be in"):
        resolve_run(*KEYS, "--max_steps", "100", "--min_lr_ratio", "1.5")
