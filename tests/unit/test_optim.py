"""The LR schedule against closed forms, and AdamW's weight-decay exclusions."""
import math
from pathlib import Path

import pytest

from pretrain_cli.run_config import OptimizerConfig, Schedule
from pretrain_cli.training.optim import no_decay


def test_paddlenlp_shipped_schedule_values():
    # PaddleNLP's shipped files (ARCHITECTURE.md facts: schedule): lr 3e-5, min 3e-6, warmup 30, linear decay to step 10,000.
    s = Schedule("linear", 3e-5, 3e-6, 30, 10_000)
    assert s.lr_at(1) == pytest.approx(1e-6)
    assert s.lr_at(30) == pytest.approx(3e-5)
    assert s.lr_at(10_000) == pytest.approx(3e-6)
    assert s.lr_at(20_000) == pytest.approx(3e-6)
    mid = 30 + (10_000 - 30) // 2
    assert s.lr_at(mid) == pytest.approx(3e-6 + (1 - (mid - 30) / 9970) * 2.7e-5)


def test_cosine_constant_and_no_warmup():
    c = Schedule("cosine", 1e-3, 1e-4, 10, 110)
    assert c.lr_at(5) == pytest.approx(5e-4)
    assert c.lr_at(60) == pytest.approx(1e-4 + 0.5 * (1 + math.cos(math.pi * 0.5)) * 9e-4)
    assert c.lr_at(110) == pytest.approx(1e-4)
    assert c.lr_at(111) == pytest.approx(1e-4)
    k = Schedule("constant_with_warmup", 1e-3, 1e-4, 4, 100)
    assert [k.lr_at(t) for t in (1, 4, 50, 500)] == pytest.approx([2.5e-4, 1e-3, 1e-3, 1e-3])
    n = Schedule("linear", 1e-3, 0.0, 0, 10)
    assert n.lr_at(1) == pytest.approx(1e-3 * 0.9)


def test_the_schedule_s_phrase_says_what_lr_at_does():
    """The resolved `schedule:` line and the resume note: a constant schedule, and a warmup that fills the run (the
    demo's warmup 20 clipped to --max_steps 10), decay to nothing, where the phrase said 'decay to 0.0003 by step
    10'; a restarted schedule counts its steps as the run does."""
    assert Schedule("cosine", 3e-3, 3e-4, 20, 400).describe() == \
        "cosine, warmup 20, peak 0.003, decay to 0.0003 by step 400"
    whole = Schedule("cosine", 3e-3, 3e-4, 10, 10)
    assert whole.describe() == "cosine, warmup 10: rises to 0.003 by step 10, no decay"
    assert [whole.lr_at(t) for t in (5, 10)] == pytest.approx([1.5e-3, 3e-3])  # what the phrase says
    assert Schedule("constant", 3e-3, 3e-4, 0, 400).describe() == "constant at 0.003"
    assert Schedule("constant_with_warmup", 3e-3, 3e-4, 20, 400).describe() == \
        "constant_with_warmup, warmup 20, then 0.003"
    restarted = Schedule("cosine", 3e-3, 3e-4, 5, 25, start_step=15)
    assert restarted.describe() == "cosine from step 15, warmup 5, peak 0.003, decay to 0.0003 by step 40"
    assert restarted.lr_at(40) == pytest.approx(3e-4) and restarted.lr_at(39) > 3e-4


def test_decay_exclusions_follow_structured_names():
    from pretrain_cli import runtime
    from pretrain_cli.models import build_model
    from pretrain_cli.models.config import ModelConfig
    from pretrain_cli.training.optim import build_optimizer

    runtime.import_paddle()
    cfg = ModelConfig.from_file(str(Path(__file__).resolve().parents[2] / "src/pretrain_cli/config/presets/micro-qwen2"))
    model = build_model(cfg)
    opt = build_optimizer(model, OptimizerConfig(weight_decay=0.1), Schedule("constant", 1e-3, 0, 0, 1))
    decided = {n: opt._apply_decay_param_fun(p.name) for n, p in model.named_parameters()}
    assert decided["model.layers.0.self_attn.q_proj.bias"] is False
    assert decided["model.layers.0.input_layernorm.weight"] is False
    assert decided["model.norm.weight"] is False
    assert decided["model.layers.0.self_attn.q_proj.weight"] is True
    assert decided["model.embed_tokens.weight"] is True
    assert no_decay("lm_head.weight") is False
