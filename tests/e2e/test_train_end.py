"""How `train` ends: its last lines are the final export's (said as it starts and once written), PaddleNLP's
`***** train metrics *****` block and one line saying where the model is and what to run on it; a stop by signal and
a re-run of a complete run end the same way with what is true of them (`training/closing.py`). The closing metrics
are recorded once (metrics.jsonl's `train_metrics` record, the end of trainer_state.json's log_history)."""
import json
import os
import re
import shlex
import signal

import pytest

from pretrain_cli.cli import main as cli_main

from e2e_helpers import write_config

KEYS = ["progress_or_epoch", "train_loss", "train_runtime", "train_samples_per_second", "train_steps_per_second"]
LINE = re.compile(r"^\[[^\]]+\] \[ *(\w+)\] - (.*)$")  # PaddleNLP's format: [time] [   LEVEL] - message


def _said(text):
    """The log's messages, in order (a line without the log format is kept as it is: nothing must follow the end)."""
    return [LINE.match(ln).group(2) if LINE.match(ln) else ln for ln in text.splitlines() if ln.strip()]


def _block(lines, results=None):
    """`lines` are PaddleNLP's block of `results`' closing metrics: keys sorted, aligned, its formats. Returns the
    values shown."""
    assert lines[0] == "***** train metrics *****"
    rows = [re.fullmatch(r"  (\S+) +=( +)(\S+)", ln) for ln in lines[1:]]
    assert all(rows), lines
    assert [m.group(1) for m in rows] == KEYS
    assert len({ln.index("=") for ln in lines[1:]}) == 1 and len({len(ln) for ln in lines[1:]}) == 1  # aligned
    shown = {m.group(1): m.group(3) for m in rows}
    if results is None:
        return shown
    secs = results["train_runtime"]
    assert shown["train_runtime"] == f"0:00:{int(secs):02d}.{int((secs - int(secs)) * 100):02d}"
    for key in ("train_loss", "train_samples_per_second", "train_steps_per_second", "progress_or_epoch"):
        assert float(shown[key]) == round(results[key], 4), key
    return shown


def _ips(said, results, tokens):
    """PaddleNLP's last two lines just before the line saying where the model is, with our figure: every launch's
    `tokens` (`tokens_seen`, which the test knows) over every launch's `train_runtime`, train_results.json's
    `train_tokens_per_second`. Returns `said` without them."""
    assert results["tokens_seen"] == tokens
    rate = results["train_tokens_per_second"]
    assert rate == pytest.approx(tokens / results["train_runtime"], rel=1e-3)
    assert said[-3] == f"Effective Tokens per second: {rate:.2f}" and said[-2] == f"ips: {rate:.2f} tokens/s", \
        said[-4:]
    return said[:-3] + said[-1:]


def _records(out, kind):
    return [r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if r["kind"] == kind]


def _signal_after(monkeypatch, n):
    """SIGTERM to this process once its `n`-th step of this launch is taken."""
    from pretrain_cli.training import trainer as trainer_mod

    real, steps = trainer_mod.Trainer.train_step, []

    def step_then_signal(self, batches):
        result = real(self, batches)
        steps.append(1)
        if len(steps) == n:
            os.kill(os.getpid(), signal.SIGTERM)
        return result

    monkeypatch.setattr(trainer_mod.Trainer, "train_step", step_then_signal)


def test_a_finished_run_ends_with_its_metrics_then_where_its_model_is(corpus, tmp_path, capsys):
    cfg = write_config(tmp_path, corpus, max_steps=3, save_steps=10)
    out = tmp_path / "out"
    assert cli_main(["train", cfg]) == 0
    captured = capsys.readouterr()
    said = _said(captured.out)
    results = json.loads((out / "train_results.json").read_text())
    assert results["progress_or_epoch"] == 1.0 and results["train_steps_per_second"] > 0
    said = _ips(said, results, 3 * 4 * 32)
    assert said[-9].startswith("final export: writing float32 weights (export_dtype;") and said[-9].endswith(str(out))
    assert re.fullmatch(rf"final export: written to {re.escape(str(out))} in \d+\.\d s \(model\.safetensors, "
                        r"\d+\.\d MiB\)", said[-8]), said[-8]
    _block(said[-7:-1], results)
    assert said[-1] == (f"train: done at step 3; the final model, Hugging Face format (float32 weights), is in {out}: "
                        f"pretrain-cli eval --model {out}; pretrain-cli generate --model {out} --prompt 'Hello'; in "
                        f"Python, transformers.AutoModelForCausalLM.from_pretrained(\"{out}\")")
    assert "train metrics" not in captured.err
    # recorded once, as the log history's last entry, with the values the block shows
    closing = {k: results[k] for k in KEYS}
    assert [{k: r[k] for k in KEYS} for r in _records(out, "train_metrics")] == [closing]
    history = json.loads((out / "trainer_state.json").read_text())["log_history"]
    assert history[-1]["kind"] == "train_metrics" and {k: history[-1][k] for k in KEYS} == closing
    assert [r["step"] for r in _records(out, "train")] == [1, 2, 3]  # the log lines' records as they were

    # the same command again: nothing trained; the run's metrics as recorded, where its model is; recorded no more
    before = (out / "metrics.jsonl").read_text()
    assert cli_main(["train", cfg]) == 0
    said = _ips(_said(capsys.readouterr().out), results, 3 * 4 * 32)
    assert said[-8] == "already at max_steps=3: nothing to train; raise max_steps to continue"
    _block(said[-7:-1], results)
    assert said[-1].startswith(f"train: nothing trained now; the final model of step 3 (Hugging Face format, written "
                               f"by an earlier launch) is in {out}: pretrain-cli eval --model {out}; ")
    assert (out / "metrics.jsonl").read_text() == before

    # continued past its end (a larger max_steps): that end's record stays where it was, this end adds its own
    assert cli_main(["train", cfg, "--max_steps", "4"]) == 0
    assert _said(capsys.readouterr().out)[-1].startswith("train: done at step 4; ")
    assert [r["step"] for r in _records(out, "train_metrics")] == [3, 4]
    history = json.loads((out / "trainer_state.json").read_text())["log_history"]
    assert [e["step"] for e in history if e["kind"] == "train_metrics"] == [4]  # (checkpoint-3's state had none)


def test_a_stopped_run_ends_with_its_metrics_so_far_and_how_to_go_on(corpus, tmp_path, monkeypatch, capsys):
    """SIGTERM at step 2 of 4: the block of the two steps trained, then the stop's line; nothing recorded until the
    resumed run ends, which records its closing metrics once."""
    _signal_after(monkeypatch, 2)
    cfg = write_config(tmp_path, corpus, max_steps=4, save_steps=10)
    out = tmp_path / "out"
    assert cli_main(["train", cfg]) == 0
    said = _said(capsys.readouterr().out)
    state = json.loads((out / "checkpoint-2" / "trainer_state.json").read_text())
    shown = _block(said[-7:-1])  # (its runtime counts the stop's save too, which the checkpoint's state cannot)
    assert float(shown["progress_or_epoch"]) == 0.5 and float(shown["train_loss"]) == round(state["loss_sum"] / 2, 4)
    h, m, s = shown["train_runtime"].split(":")
    assert int(h) == int(m) == 0 and float(s) == pytest.approx(2 / float(
        shown["train_steps_per_second"]), abs=0.02)
    assert float(shown["train_samples_per_second"]) == pytest.approx(4 * float(shown["train_steps_per_second"]),
                                                                     abs=1e-3)  # 4 sequences a step
    assert said[-1] == (f"stopped at step 2 and saved; re-run the same command to resume from checkpoint-2; no final "
                        f"model yet: pretrain-cli eval --model {out} and pretrain-cli generate --model {out} read "
                        f"checkpoint-2 meanwhile")
    assert not _records(out, "train_metrics") and not (out / "train_results.json").exists()
    monkeypatch.undo()
    # resumed at another batch (2 sequences a step): the figure counts the tokens trained, 2 steps of 4 x 32 and 2 of
    # 2 x 32, not max_steps x this launch's 2 x 32 (which train_tokens_per_second contradicted), and a re-run of the
    # complete run gives it again
    assert cli_main(["train", cfg, "--per_device_train_batch_size", "2"]) == 0
    results = json.loads((out / "train_results.json").read_text())
    said = _ips(_said(capsys.readouterr().out), results, 2 * 4 * 32 + 2 * 2 * 32)  # all launches' tokens and time
    _block(said[-7:-1], results)
    assert said[-1].startswith("train: done at step 4; ")
    assert [r["step"] for r in _records(out, "train_metrics")] == [4]
    assert cli_main(["train", cfg, "--per_device_train_batch_size", "2"]) == 0
    said = _ips(_said(capsys.readouterr().out), results, 2 * 4 * 32 + 2 * 2 * 32)
    assert said[-1].startswith("train: nothing trained now; the final model of step 4 ")


def test_a_run_continued_past_its_end_and_stopped_names_its_checkpoint(corpus, tmp_path, monkeypatch, capsys):
    """Final model at step 2, continued to max_steps 4, SIGTERM at step 3: `eval --model out` reads the final model
    of step 2 there, so the stop's line names checkpoint-3 (quoted as typed) and says whose the final model is."""
    out = tmp_path / "run out"  # (a space: the commands quote it)
    cfg = write_config(tmp_path, corpus, max_steps=2, save_steps=10, output_dir=str(out))
    assert cli_main(["train", cfg]) == 0
    capsys.readouterr()
    _signal_after(monkeypatch, 1)
    assert cli_main(["train", cfg, "--max_steps", "4"]) == 0
    said = _said(capsys.readouterr().out)
    ckpt = shlex.quote(str(out / "checkpoint-3"))
    assert said[-1] == (f"stopped at step 3 and saved; re-run the same command to resume from checkpoint-3; {out} "
                        f"holds the final model of step 2 (exported when the run ended there): pretrain-cli eval "
                        f"--model {ckpt} and pretrain-cli generate --model {ckpt} read step 3's weights meanwhile"), \
        said[-1]
    assert float(_block(said[-7:-1])["progress_or_epoch"]) == 0.75
    assert cli_main(["eval", "--model", str(out / "checkpoint-3")]) == 0  # the command named reads step 3
    assert f"; {out / 'checkpoint-3'}, trained weights;" in capsys.readouterr().out


def _test_block(said, results):
    """The `***** test metrics *****` block just before the last line: all_results.json's test keys, sorted."""
    test_keys = sorted(k for k in results if k.startswith("test_"))
    assert said[-len(test_keys) - 2] == "***** test metrics *****", said[-12:]
    rows = [re.fullmatch(r"  (\S+) +=( +)(\S+)", ln) for ln in said[-len(test_keys) - 1:-1]]
    assert [m.group(1) for m in rows] == test_keys
    assert float(rows[test_keys.index("test_loss")].group(3)) == round(results["test_loss"], 4)


def test_do_predict_ends_with_the_test_block_and_an_eval_only_run_with_its_eval_line(corpus, tmp_path, capsys):
    """PaddleNLP's run_pretrain ends do_predict with `log_metrics("test", ...)` after the train block: so does train,
    before the line saying where the model is, rank 0, once. It prints no eval block (it evaluates only inside
    training): an evaluation-only run (do_train false) ends with its eval line."""
    out = tmp_path / "out"
    cfg = write_config(tmp_path, corpus, max_steps=2, save_steps=10, do_eval=True, eval_steps=10, do_predict=True,
                       eval_iters=1)
    assert cli_main(["train", cfg]) == 0
    results = json.loads((out / "all_results.json").read_text())
    said = _ips(_said(capsys.readouterr().out), results, 2 * 4 * 32)
    test_keys = sorted(k for k in results if k.startswith("test_"))
    # PaddleNLP's predict block: test_loss, test_runtime, test_samples_per_second, test_steps_per_second; ours adds
    # perplexity and the tokens scored (docs/TRAINING.md, "How `train` ends")
    assert test_keys == ["test_loss", "test_ppl", "test_runtime", "test_samples_per_second", "test_steps_per_second",
                         "test_tokens"]
    # the eval line: PaddleNLP's keys first, in its order (its Trainer's `evaluate`, then `log`), then ours
    (evals,) = [ln for ln in said if ln.startswith("eval_loss: ")]
    assert [kv.split(": ")[0] for kv in evals.split(", ")] == [
        "eval_loss", "eval_runtime", "eval_samples_per_second", "eval_steps_per_second", "progress_or_epoch",
        "eval_ppl", "eval_tokens", "global_step"], evals
    assert results["eval_steps_per_second"] == pytest.approx(results["eval_samples_per_second"] / 4, rel=1e-3)
    _test_block(said, results)
    _block(said[-len(test_keys) - 8:-len(test_keys) - 2], results)  # the train block just before it
    assert said[-1].startswith("train: done at step 2; ")
    assert sum(ln == "***** test metrics *****" for ln in said) == 1

    # the same command again: the blocks it printed, read back from all_results.json, then where its model is
    assert cli_main(["train", cfg]) == 0
    said = _ips(_said(capsys.readouterr().out), results, 2 * 4 * 32)
    _test_block(said, results)
    _block(said[-len(test_keys) - 8:-len(test_keys) - 2], results)
    assert said[-1].startswith("train: nothing trained now; the final model of step 2 ")

    assert cli_main(["train", cfg, "--do_train", "false", "--do_predict", "false"]) == 0
    said = _said(capsys.readouterr().out)
    assert said[-1].startswith("eval_loss: "), said[-3:]
    assert not any("metrics *****" in ln or ln.startswith(("Effective Tokens", "ips: ")) for ln in said)

