"""The lines a PaddleNLP user greps or parses, as PaddleNLP writes them (its Trainer's log lines, its run_pretrain's
last lines): its keys first in its order and adjacent in the train and eval lines, our keys after them; its device
memory keys on a GPU (the device emulated: the suite has none); its closing `Effective Tokens per second` and `ips`
lines. The whole runs that print them are in tests/e2e/test_train_end.py."""
import sys
from types import SimpleNamespace as NS

from log_lines import product_log_lines

from pretrain_cli.training import closing, evaluation, metrics, train_log

GIB = 2**30


def _train_line(device: str, monkeypatch) -> str:
    """The line `TrainLog._log` logs for a dense model's step 60 of 400 on `device`, a GPU's allocator faked."""
    cuda = NS(memory_allocated=lambda: 1 * GIB, memory_reserved=lambda: 3 * GIB,
              max_memory_allocated=lambda: 2 * GIB, max_memory_reserved=lambda: 4 * GIB)
    monkeypatch.setitem(sys.modules, "paddle", NS(device=NS(cuda=cuda)))

    class Trainer(train_log.TrainLog):
        def _record(self, kind, values):
            pass

    t = Trainer()
    t.state = NS(interval_loss=6.4, interval_steps=1, loss_sum=0.0, global_step=60, tokens_seen=122880,
                 consumed_samples=480, last_batch_hash="858f61f5dfd5")
    t.comm, t.schedule = NS(mean=lambda x: x), NS(lr_at=lambda step: 2.9e-3, phase=lambda step: "stable")
    t.throughput = metrics.Throughput(256, 8, 1, 1, 1e8, 1.3e8, 0.3323)
    t.throughput.step()
    t.throughput.last -= 10.0  # (a 10 s step: an mfu below 1, no warning line)
    t.loop, t.device = NS(max_steps=400, memory_metrics=True), device
    t.layout = NS(raw_model=NS(config=NS(sparse_layers=None, num_nextn_predict_layers=0)))
    with product_log_lines() as lines:
        t._log(0.46)
    (line,) = lines
    return line


def test_paddlenlp_keys_lead_the_train_line_adjacent_and_ours_follow(monkeypatch):
    """`eta` sat between `global_step` and `interval_runtime`: a grep for `global_step: 60, interval_runtime` found
    nothing. Now PaddleNLP's keys are the line's first, adjacent; `progress_or_epoch`, its last, precedes ours."""
    line = _train_line("cpu", monkeypatch)
    assert line.startswith("loss: 6.4, learning_rate: 2.900e-03, global_step: 60, interval_runtime: "), line
    keys = [kv.split(": ", 1)[0] for kv in line.split(", ")]
    at = keys.index("progress_or_epoch")
    assert keys[at - 1] == "interval_steps_per_second" and keys[at + 1:at + 3] == ["lr_phase", "eta"]
    assert "progress_or_epoch: 0.15, lr_phase: stable, eta: " in line
    assert not any(k.startswith(("current_memory", "max_memory")) for k in keys)  # a CPU has none, as in PaddleNLP


def test_a_gpu_line_has_the_devices_current_and_peak_memory_where_paddlenlp_logs_them(monkeypatch):
    line = _train_line("gpu", monkeypatch)
    assert ("global_step: 60, current_memory_allocated: 1.0, current_memory_reserved: 3.0, max_memory_allocated: 2.0, "
            "max_memory_reserved: 4.0, interval_runtime: ") in line, line
    assert line.count("memory_allocated") == 2  # (once each: not also beside the host memory)


def test_the_eval_line_has_paddlenlps_keys_in_its_order_and_the_test_line_its_predict_ones():
    """PaddleNLP's eval line: eval_loss, eval_runtime, eval_samples_per_second, eval_steps_per_second,
    progress_or_epoch; 3 batches of 8 samples (4 on each of 2 data ranks) in 2 s: 12 samples/s, 1.5 steps/s."""
    values = evaluation.line_values("eval", 6.25, 768, 2.0, 3, 24, 30, 40)
    assert metrics.format_line(values) == ("eval_loss: 6.25, eval_runtime: 2.0, eval_samples_per_second: 12.0, "
                                           "eval_steps_per_second: 1.5, progress_or_epoch: 0.75, eval_ppl: 518.0128, "
                                           "eval_tokens: 768, global_step: 30")
    test = evaluation.line_values("test", 6.25, 768, 2.0, 3, 24, 30, 40)
    assert list(test) == ["test_loss", "test_runtime", "test_samples_per_second", "test_steps_per_second",
                          "test_ppl", "test_tokens", "global_step"]  # its predict: no progress_or_epoch
    # an evaluation-only run without a max_steps has no progress to give
    assert "progress_or_epoch" not in evaluation.line_values("eval", 6.25, 768, 2.0, 3, 24, 0, -1)


def test_the_run_ends_with_the_blocks_then_effective_tokens_per_second_and_ips():
    """After its blocks PaddleNLP's run_pretrain prints tokens per second twice; ours is every launch's tokens over
    every launch's time, train_results.json's train_tokens_per_second: 4 steps, 2 at 4 x 32 tokens then (resumed with
    another batch) 2 at 8 x 32, over 2 s are 768 tokens / 2 s = 384 tokens/s (max_steps x this launch's tokens a step
    gave 4 x 256 / 2 = 512, which train_results.json's figure contradicted)."""
    results = {"train_runtime": 2.0, "train_loss": 6.5, "progress_or_epoch": 1.0, "train_samples_per_second": 8.0,
               "train_steps_per_second": 2.0, "global_step": 4, "tokens_seen": 768, "train_tokens_per_second": 384.0,
               "eval_loss": 6.7, "test_loss": 6.6}
    with product_log_lines() as lines:
        closing.log_blocks(results)
    assert lines[0] == "***** train metrics *****" and lines.index("***** test metrics *****") == 6
    assert lines[-2:] == ["Effective Tokens per second: 384.00", "ips: 384.00 tokens/s"]
    # results without train_tokens_per_second: tokens_seen over train_runtime, the same figure
    assert closing.effective_tokens_lines({k: v for k, v in results.items() if k != "train_tokens_per_second"}) == \
        ["Effective Tokens per second: 384.00", "ips: 384.00 tokens/s"]
    # an evaluation-only run (its eval keys hold a progress_or_epoch): no train block, no throughput lines
    with product_log_lines() as lines:
        closing.log_blocks({"eval_loss": 6.7, "progress_or_epoch": 0.75, "global_step": 30})
    assert lines == []
