"""Evaluation under the resolved run configuration: a split smaller than its eval batches is noted (with the test
pass's factor), and one perplexity rule serves the trainer's evaluation and `eval` (the decisions themselves:
test_run_config.py)."""
import math

import pytest
from run_helpers import model_config, resolve_run


def test_an_eval_split_smaller_than_its_batches_is_noted():
    from types import SimpleNamespace

    from pretrain_cli.orchestration.eval_windows import eval_repeats

    run = resolve_run("--do_eval", "true", "--do_predict", "true", "--eval_iters", "4",
                      "--per_device_eval_batch_size", "8")
    splits = SimpleNamespace(get={"valid": list(range(22)), "test": list(range(40))}.get)
    notes = eval_repeats(run, splits)
    # the test pass's factor 10 is named where it comes from (it read "10 x eval_iters 4", unexplained)
    assert notes == ["eval: the valid split holds 22 samples, fewer than eval_iters 4 x per_device_eval_batch_size 8 "
                     "x 1 data rank = 32, so evaluation repeats samples; eval_iters 2 reads each once",
                     "eval: the test split holds 40 samples, fewer than test_iters 40 (10 x eval_iters 4: the test pass "
                     "reads ten times as many batches, as PaddleNLP's run_pretrain.py) x per_device_eval_batch_size 8 "
                     "x 1 data rank = 320, so evaluation repeats samples; even eval_iters 1 reads 80 samples here "
                     "(test_iters 10 x per_device_eval_batch_size 8 x 1 data rank): give the test split a larger share "
                     "of `split`, or lower per_device_eval_batch_size"]
    on_two = resolve_run("--do_eval", "true", "--eval_iters", "4", "--per_device_eval_batch_size", "8", world=2)
    assert "x 2 data ranks = 64," in eval_repeats(on_two, splits)[0]
    one = SimpleNamespace(get={"valid": [0], "test": [0]}.get)  # (a max_seq_length the split holds once)
    assert eval_repeats(run, one)[0].startswith("eval: the valid split holds 1 sample, fewer than")
    assert run.loop.test_iters == 40  # PaddleNLP's run_pretrain.py: test_iters = eval_iters * 10
    # a resume that raised eval_iters to keep its checkpoint's eval windows is not told to lower it again
    import dataclasses

    kept = dataclasses.replace(run, notes=("eval: eval_iters 2 -> 4 keeps the 32 eval windows of checkpoint-5's run",))
    assert eval_repeats(kept, splits)[0].endswith("so evaluation repeats samples; as the checkpoint's run did (its "
                                                  "eval windows are kept, above, so the curve goes on comparable)")


def test_a_blend_s_eval_split_is_judged_per_source_by_its_weight():
    """Weights 3:1, eval_iters 4 x 8 = 32 samples read: 24 from a, 8 from b. a holding 30 and b 3 is 33 samples in
    all, more than 32, and said nothing; b's 3 are fewer than its 8, so its samples repeat. The eval_iters named
    reads none twice (eval_iters 1: a 6, b 2). a holding 20 and b 8 repeat a's."""
    from types import SimpleNamespace

    from pretrain_cli.data.blend import BlendedDataset
    from pretrain_cli.orchestration.eval_windows import eval_repeats

    run = resolve_run("--do_eval", "true", "--eval_iters", "4", "--per_device_eval_batch_size", "8")
    blend = BlendedDataset([list(range(30)), list(range(3))], [3.0, 1.0], ["a", "b"])
    assert eval_repeats(run, SimpleNamespace(get={"valid": blend, "test": None}.get)) == [
        "eval: the valid split of the blend reads eval_iters 4 x per_device_eval_batch_size 8 x 1 data rank = 32 "
        "samples: b gives 8 of them by its weight and holds 3 samples, so evaluation repeats samples; eval_iters 1 "
        "reads each once"]
    other = BlendedDataset([list(range(20)), list(range(8))], [3.0, 1.0], ["a", "b"])
    assert eval_repeats(run, SimpleNamespace(get={"valid": other, "test": None}.get))[0].split(": ", 2)[2].startswith(
        "a gives 24 of them by its weight and holds 20 samples, so")
    enough = BlendedDataset([list(range(24)), list(range(8))], [3.0, 1.0], ["a", "b"])
    assert eval_repeats(run, SimpleNamespace(get={"valid": enough, "test": None}.get)) == []


def test_one_perplexity_rule_for_every_evaluation():
    """The trainer capped perplexity at exp(50) and `eval` at exp(700): one rule now."""
    from pretrain_cli import runtime

    paddle = runtime.import_paddle()
    import numpy as np

    from pretrain_cli.distributed.comms.comm import NoComm
    from pretrain_cli.models import build_model
    from pretrain_cli.training.evaluation import perplexity
    from pretrain_cli.training.run import lay_out
    from pretrain_cli.training.trainer import Trainer

    assert perplexity(60.0) == math.exp(60.0) and perplexity(800.0) == math.exp(700.0)
    cfg = model_config("micro-llama")
    paddle.seed(0)
    model = build_model(cfg)
    with paddle.no_grad():
        model.lm_head.weight.set_value(model.lm_head.weight * 400.0)  # a confidently wrong model: loss > 50

    class Split:
        def __getitem__(self, i):
            t = np.random.default_rng(i).integers(0, cfg.vocab_size, 9)
            return {"input_ids": t[:-1], "labels": t[1:]}

    class Splits:
        def get(self, name):
            return Split()

    run = resolve_run("--eval_iters", "1", "--per_device_eval_batch_size", "2")
    trainer = Trainer(lay_out(run, model, NoComm()), Splits(), run, NoComm())
    values = trainer.evaluate("valid")
    assert values["eval_loss"] > 50
    assert values["eval_ppl"] == pytest.approx(math.exp(values["eval_loss"]), rel=1e-6)


def test_the_quickstart_run_reads_no_sample_twice():
    """configs/demo_cpu.json on the quickstart's corpus (valid 24 samples, test 37: split 96,2,2 of the pydoc
    documents) noted at every start that its test pass, 10 x eval_iters batches of 8 = 240 samples, repeats the 37;
    the quickstart evaluates the test split itself, once through (`eval --split test --max_batches 4`)."""
    from pathlib import Path
    from types import SimpleNamespace

    from pretrain_cli.config.parser import parse_config
    from pretrain_cli.config.resolve import resolve
    from pretrain_cli.orchestration.eval_windows import eval_repeats
    from pretrain_cli.run_config import Target

    repo = Path(__file__).resolve().parents[2]
    run = resolve(parse_config(str(repo / "configs" / "demo_cpu.json")), model_config("tiny-qwen2"), Target("cpu", 1))
    splits = SimpleNamespace(get={"valid": list(range(24)), "test": list(range(37))}.get)
    assert run.loop.do_eval and eval_repeats(run, splits) == []
    quickstart = (repo / "scripts" / "quickstart.sh").read_text()
    assert "eval --model demo/output --split test --max_batches 4" in quickstart
    assert 4 * run.loop.eval_batch <= 37  # the quickstart's eval: 32 of the test split's 37 windows, each once
