"""Training runs end to end (in-process through the real CLI entry, tiny model, CPU)."""
import json
import math

import numpy as np
import pytest
from safetensors.numpy import load_file

from pretrain_cli.cli import main as cli_main

from e2e_helpers import train_losses, write_config


def weights(d):
    return load_file(str(d / "model.safetensors"))


def test_a_finished_run_draws_its_loss_curve_once_at_the_end(corpus, tmp_path, monkeypatch):
    """The checkpoint saved at max_steps leaves the loss curve to the final export, which draws it right after with
    the run's last evaluation (a drawing is a third of a short CPU run); a checkpoint before max_steps draws one
    (tests/e2e/test_cli.py's stopped run)."""
    import threading

    import pretrain_cli.training.plot as plot

    drawn, real = [], plot.write_loss_curve

    def counted(output_dir):
        drawn.append(threading.current_thread().name)
        return real(output_dir)

    monkeypatch.setattr(plot, "write_loss_curve", counted)
    cfg = write_config(tmp_path, corpus, max_steps=3, save_steps=1000, do_eval=True, eval_steps=3)
    assert cli_main(["train", cfg]) == 0
    assert drawn == ["MainThread"]
    assert (tmp_path / "out" / "checkpoint-3").is_dir() and (tmp_path / "out" / "loss_curve.png").is_file()


def test_outputs_eval_predict_and_falling_loss(corpus, tmp_path, capsys):
    cfg = write_config(tmp_path, corpus, max_steps=24, do_eval=True, do_predict=True, eval_steps=12, disable_tqdm=False,
                       logging_steps=4, save_steps=12, report_to=["visualdl"], learning_rate=0.01)
    assert cli_main(["train", cfg]) == 0
    captured = capsys.readouterr()
    assert "train: 100%" in captured.err and "24/24" in captured.err  # progress bar (disable_tqdm false)
    assert "mfu: " in captured.out and "interval_tokens_per_second_per_device" in captured.out
    out = tmp_path / "out"
    for name in ("model.safetensors", "config.json", "generation_config.json", "tokenizer.json",
                 "tokenizer_config.json", "special_tokens_map.json", "train_results.json", "all_results.json",
                 "trainer_state.json", "args.json", "metrics.jsonl", "loss_curve.png", "checkpoint-12",
                 "checkpoint-24", "runs"):
        assert (out / name).exists(), name
    for name in ("model.safetensors", "config.json", "optimizer.safetensors", "trainer_state.json", "args.json",
                 "tokenizer.json", "generation_config.json"):
        assert (out / "checkpoint-12" / name).exists(), name
    assert not list(out.glob("**/*.pdparams")) and not list(out.glob("**/*.pdopt"))  # no pickle
    assert (out / "loss_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert list((out / "runs").iterdir())
    results = json.loads((out / "all_results.json").read_text())
    assert math.isfinite(results["eval_loss"]) and math.isfinite(results["test_loss"])
    assert results["eval_ppl"] == pytest.approx(math.exp(results["eval_loss"]), rel=1e-3)
    losses = train_losses(out)
    assert len(losses) == 7 and losses[-1] < losses[0] - 0.5  # steps 1, 4, ..., 24; starts near ln(512) = 6.24
    assert abs(losses[0] - math.log(512)) < 0.5
    logged = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in logged if r["kind"] == "train"] == [1, 4, 8, 12, 16, 20, 24]  # step 1 is visible
    mfus = [r["mfu"] for r in logged if r["kind"] == "train"]  # against the CPU's stated peak, never above it
    assert all(isinstance(m, float) and 0 < m <= 1 for m in mfus), mfus
    assert "mfu against an assumed fp32 peak of" in captured.out
    assert cli_main(["eval", "--config", cfg, "--json"]) == 0  # the run's own valid batches, its final model
    evaluated = capsys.readouterr()
    again = json.loads(evaluated.out)
    assert again["loss"] == pytest.approx(results["eval_loss"], abs=1e-5) and again["split"] == "valid"
    # the same kernels as the training run of the file (use_flash_attention: the CPU block-causal kernel), printed
    trained = next(line for line in captured.out.splitlines() if "kernels: " in line).split("kernels: ", 1)[1]
    assert again["kernels"] == trained and f"kernels: {trained}" in evaluated.err and "attention=cpu " in trained
    assert cli_main(["eval", "--config", cfg, "--split", "test", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["loss"] == pytest.approx(results["test_loss"], abs=1e-5)
    # --max_seq_length and --batch_size apply to the run's split, as its keys would (they were ignored)
    assert cli_main(["eval", "--config", cfg, "--json", "--max_seq_length", "16", "--batch_size", "2"]) == 0
    shorter = json.loads(capsys.readouterr().out)
    assert shorter["tokens"] < again["tokens"] and shorter["loss"] != pytest.approx(again["loss"], abs=1e-4)
    kinds = [json.loads(line)["kind"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert kinds.count("eval") == 2 and kinds.count("test") == 1  # steps 12 and 24; the final eval reuses step 24
    train_results = json.loads((out / "train_results.json").read_text())
    assert train_results["tokens_this_process"] == 96 * 32 and train_results["effective_tokens_per_second_this_process"] > 0
    state = json.loads((out / "trainer_state.json").read_text())
    assert state["global_step"] == 24 and state["consumed_samples"] == 96 and state["tokens_seen"] == 96 * 32
    args = json.loads((out / "checkpoint-12" / "args.json").read_text())
    assert args["arguments"]["max_seq_length"] == 32 and args["run"]["data"]["max_seq_length"] == 32


@pytest.mark.parametrize("logging_steps", [1, 3])  # 3: a log interval straddles the checkpoint
def test_resume_is_bitwise_identical_and_extends_without_reshuffle(corpus, tmp_path, logging_steps):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    common = dict(max_steps=10, save_steps=5, decay_steps=10, logging_steps=logging_steps)
    assert cli_main(["train", write_config(a, corpus, **common)]) == 0
    cfg_b = write_config(b, corpus, **common)
    # run b also reads batches ahead in a background thread: the order must not change
    assert cli_main(["train", cfg_b, "--max_steps", "5", "--dataloader_num_workers", "2"]) == 0  # stops at 5
    assert cli_main(["train", cfg_b, "--dataloader_num_workers", "2"]) == 0  # auto-resumes from checkpoint-5
    wa, wb = weights(a / "out"), weights(b / "out")
    assert all(np.array_equal(wa[k], wb[k]) for k in wa)

    def records(run):
        lines = [json.loads(x) for x in (run / "out" / "metrics.jsonl").read_text().splitlines()]
        return {r["step"]: (r["loss"], r["batch_hash"]) for r in lines if r["kind"] == "train"}

    ra, rb = records(a), records(b)
    if logging_steps == 1:
        assert ra == rb  # same loss and batch at every step, bit for bit
    else:  # the stopped run logged its last step 5 (max_steps); lines after the next log agree exactly
        assert sorted(ra) == [1, 3, 6, 9, 10] and sorted(rb) == [1, 3, 5, 6, 9, 10]
        assert ra[1] == rb[1] and ra[3] == rb[3] and ra[9] == rb[9] and ra[10] == rb[10]


def _micro_qwen3(path):
    """micro-qwen2's shape as a Qwen3 (q/k norms, head_dim 32 != 64 / 4 heads) in a local model directory."""
    from pretrain_cli.config.presets import PRESET_DIR

    cfg = json.loads((PRESET_DIR / "micro-qwen2" / "config.json").read_text())
    cfg.update(model_type="qwen3", architectures=["Qwen3ForCausalLM"], head_dim=32)
    path.mkdir()
    (path / "config.json").write_text(json.dumps(cfg))
    return str(path)


def _short_documents(corpus, path):
    """The demo corpus cut into ~40-token documents (tokenized), so most 32-token samples hold a boundary."""
    texts = [json.loads(line)["text"] for line in (corpus / "corpus.jsonl").read_text().splitlines()]
    with open(path / "short.jsonl", "w", encoding="utf-8") as f:
        for t in texts[:20]:
            for i in range(0, len(t), 150):
                f.write(json.dumps({"text": t[i:i + 150]}) + "\n")
    assert cli_main(["preprocess", "--input_path", str(path / "short.jsonl"), "--output_prefix",
                     str(path / "data" / "short"), "--tokenizer", str(corpus / "tokenizer"), "--append_eos"]) == 0
    return str(path / "data")


def test_document_masked_qwen3_trains_resumes_bitwise_and_evaluates_as_trained(corpus, tmp_path, capsys):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    common = dict(model_name_or_path=_micro_qwen3(tmp_path / "qwen3"), attention_mask_type="document",
                  input_dir=_short_documents(corpus, tmp_path), max_steps=6, save_steps=3, decay_steps=6,
                  do_eval=True, eval_steps=6)
    assert cli_main(["train", write_config(a, corpus, **common)]) == 0
    cfg_b = write_config(b, corpus, **common)
    assert cli_main(["train", cfg_b, "--max_steps", "3"]) == 0
    assert cli_main(["train", cfg_b]) == 0  # resumes from checkpoint-3
    wa, wb = weights(a / "out"), weights(b / "out")
    assert all(np.array_equal(wa[k], wb[k]) for k in wa) and "model.layers.0.self_attn.q_norm.weight" in wa
    assert json.loads((a / "out" / "config.json").read_text())["architectures"] == ["Qwen3ForCausalLM"]
    args = json.loads((a / "out" / "args.json").read_text())
    assert args["run"]["data"]["attention_mask_type"] == "document" and args["run"]["data"]["reset_position_ids"]
    capsys.readouterr()
    cfg_a = str(a / "cfg.json")
    results = json.loads((a / "out" / "all_results.json").read_text())
    assert cli_main(["eval", "--config", cfg_a, "--json"]) == 0  # follows the run's document masking
    again = json.loads(capsys.readouterr().out)
    assert again["attention_mask_type"] == "document" and again["loss"] == pytest.approx(results["eval_loss"], abs=1e-5)
    assert cli_main(["eval", "--config", cfg_a, "--json", "--attention_mask_type", "causal"]) == 0
    causal = json.loads(capsys.readouterr().out)
    assert causal["attention_mask_type"] == "causal" and causal["tokens"] == again["tokens"]
    # the neighbours' tokens change the predictions: far above the rounding of one eval (~1e-7); 4.4e-5 here
    assert abs(causal["loss"] - again["loss"]) > 1e-5


def test_gradient_accumulation_matches_bigger_batch(corpus, tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    # AdamW divides by sqrt(v): near-zero gradients turn summation-order noise into visible weight
    # differences at high learning rates, so compare weights at a moderate one.
    assert cli_main(["train", write_config(a, corpus, per_device_train_batch_size=2, gradient_accumulation_steps=4,
                                          max_steps=4, learning_rate=1e-3, min_learning_rate=1e-4)]) == 0
    assert cli_main(["train", write_config(b, corpus, per_device_train_batch_size=8, max_steps=4,
                                          learning_rate=1e-3, min_learning_rate=1e-4)]) == 0
    np.testing.assert_allclose(train_losses(a / "out"), train_losses(b / "out"), atol=1e-6)
    wa, wb = weights(a / "out"), weights(b / "out")
    assert max(float(np.abs(wa[k] - wb[k]).max()) for k in wa) < 1e-5


def test_rotation_keeps_newest(corpus, tmp_path):
    cfg = write_config(tmp_path, corpus, max_steps=8, save_steps=2, save_total_limit=2)
    assert cli_main(["train", cfg]) == 0
    kept = sorted(p.name for p in (tmp_path / "out").glob("checkpoint-*"))
    assert kept == ["checkpoint-6", "checkpoint-8"]


def test_overwrite_replaces_an_earlier_runs_later_checkpoints(corpus, tmp_path):
    """overwrite_output_dir starts at step 0: the earlier run's checkpoints past it go when it starts, so rotation
    keeps this run's saves and a later plain re-run resumes this run, not the earlier one."""
    cfg = write_config(tmp_path, corpus, max_steps=8, save_steps=4, save_total_limit=2)
    assert cli_main(["train", cfg]) == 0
    out = tmp_path / "out"
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-4", "checkpoint-8"]
    assert cli_main(["train", cfg, "--overwrite_output_dir", "true", "--max_steps", "3", "--save_steps", "1"]) == 0
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-3"]
    assert json.loads((out / "checkpoint-3" / "trainer_state.json").read_text())["global_step"] == 3
    # resuming a checkpoint of its own with overwrite keeps that one and what came before it
    assert cli_main(["train", cfg, "--overwrite_output_dir", "true", "--max_steps", "3", "--save_steps", "1",
                     "--resume_from_checkpoint", str(out / "checkpoint-2")]) == 0
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-3"]


def test_leftover_tmp_checkpoint_is_ignored_on_resume(corpus, tmp_path):
    cfg = write_config(tmp_path, corpus, max_steps=4, save_steps=4)
    assert cli_main(["train", cfg]) == 0
    out = tmp_path / "out"
    junk = out / "checkpoint-6.tmp"
    junk.mkdir()
    (junk / "model.safetensors").write_bytes(b"half a file")
    assert cli_main(["train", cfg, "--max_steps", "6", "--save_steps", "2"]) == 0
    assert not junk.exists() and (out / "checkpoint-6" / "trainer_state.json").is_file()
    assert json.loads((out / "trainer_state.json").read_text())["global_step"] == 6


def test_incompatible_resume_is_refused(corpus, tmp_path, capsys):
    cfg = write_config(tmp_path, corpus, max_steps=4, save_steps=4)
    assert cli_main(["train", cfg]) == 0
    assert cli_main(["train", cfg, "--max_steps", "8", "--max_seq_length", "48"]) == 2
    assert "max_seq_length=32" in capsys.readouterr().err
    assert cli_main(["train", cfg, "--max_steps", "8", "--model_name_or_path", "micro-llama"]) == 2
    assert "model_type=qwen2" in capsys.readouterr().err


def test_training_time_is_summed_over_a_resume(corpus, tmp_path):
    """A checkpoint written mid-loop carries the time spent so far, so a resumed run's train_runtime (and its
    tokens/s) counts both processes (it counted the last one alone: checkpoints said 0.0)."""
    cfg = write_config(tmp_path, corpus, max_steps=2, save_steps=1)
    assert cli_main(["train", cfg]) == 0
    out = tmp_path / "out"
    first = json.loads((out / "checkpoint-1" / "trainer_state.json").read_text())["train_seconds"]
    whole = json.loads((out / "checkpoint-2" / "trainer_state.json").read_text())["train_seconds"]
    assert 0 < first < whole
    assert cli_main(["train", cfg, "--max_steps", "4"]) == 0
    results = json.loads((out / "train_results.json").read_text())
    assert results["train_runtime"] > whole
    assert results["train_runtime"] > results["tokens_this_process"] / results["effective_tokens_per_second_this_process"]


@pytest.mark.parametrize("at_step", [2, 3])  # 3 = max_steps: the loop ends anyway, then the final export
def test_a_signal_stop_puts_the_processs_handlers_back_when_the_run_ends(corpus, tmp_path, monkeypatch, at_step):
    """A run stopped by SIGTERM ignores further signals while it saves (and exports), then leaves the handlers as
    they were: SIG_IGN stayed for good when the signal came in the last step."""
    import os
    import signal

    from pretrain_cli.training import trainer as trainer_mod

    real, steps = trainer_mod.Trainer.train_step, []

    def step_then_signal(self, batches):
        result = real(self, batches)
        steps.append(1)
        if len(steps) == at_step:
            os.kill(os.getpid(), signal.SIGTERM)  # the trainer's handler: finish the step, save, stop
        return result

    monkeypatch.setattr(trainer_mod.Trainer, "train_step", step_then_signal)
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    assert cli_main(["train", write_config(tmp_path, corpus, max_steps=3, save_steps=10)]) == 0
    assert {s: signal.getsignal(s) for s in before} == before
    state = json.loads((tmp_path / "out" / f"checkpoint-{at_step}" / "trainer_state.json").read_text())
    assert state["global_step"] == at_step


def test_a_resume_on_other_data_is_said(corpus, tmp_path, capsys):
    """Allowed (a new data mix halfway is a choice), but one warning per changed key names both values."""
    cfg = write_config(tmp_path, corpus, max_steps=2, save_steps=2)
    assert cli_main(["train", cfg]) == 0
    capsys.readouterr()
    assert cli_main(["train", cfg, "--max_steps", "3", "--seed", "11"]) == 0
    out = capsys.readouterr().out  # the run's log lines
    assert "resuming with seed 11, where checkpoint-2 was trained with 7: its 8 consumed samples now index" in out
    assert "resuming with input_dir" not in out and "resuming with split" not in out
    assert cli_main(["train", cfg, "--max_steps", "4", "--seed", "11"]) == 0
    assert "resuming with" not in capsys.readouterr().out  # checkpoint-3 was trained with seed 11


def _poison_step(monkeypatch, bad_steps):
    """Make the loss NaN on the given (1-based) micro-batch calls."""
    import pretrain_cli.training.step as step_mod  # where the step computes its loss

    real = step_mod.mean_loss
    calls = {"n": 0}

    def loss(total, count):
        calls["n"] += 1
        value = real(total, count)
        return value * float("nan") if calls["n"] in bad_steps else value

    monkeypatch.setattr(step_mod, "mean_loss", loss)


def test_nan_policy_stop_saves_nothing_corrupt(corpus, tmp_path, monkeypatch, capsys):
    _poison_step(monkeypatch, {3})
    cfg = write_config(tmp_path, corpus, max_steps=6, save_steps=2)
    assert cli_main(["train", cfg]) == 2
    err = capsys.readouterr().err
    assert "step 3" in err and "not finite" in err
    out = tmp_path / "out"
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-2"]
    assert not (out / "model.safetensors").exists()


def test_nan_policy_skip_counts_and_limits(corpus, tmp_path, monkeypatch, capsys):
    _poison_step(monkeypatch, {3, 4})
    cfg = write_config(tmp_path, corpus, max_steps=5, nan_policy="skip")
    assert cli_main(["train", cfg]) == 0
    state = json.loads((tmp_path / "out" / "trainer_state.json").read_text())
    assert state["global_step"] == 5 and state["skipped_steps"] == 2
    assert state["consumed_samples"] == 7 * 4  # skipped batches are consumed, not replayed
    assert state["skipped_batches"] == [8, 12]
    # inspect-data --config --step K shows the batch step K really trained on, skips included
    logged = {r["step"]: r["batch_hash"] for r in map(json.loads, (tmp_path / "out" / "metrics.jsonl").open())
              if r["kind"] == "train"}
    capsys.readouterr()
    for step in (2, 3, 5):
        assert cli_main(["inspect-data", "--config", cfg, "--step", str(step)]) == 0
        out = capsys.readouterr().out
        assert f"rank 0: samples [{4 * (step + 1 if step >= 3 else step - 1)}," in out, out
        assert f"hash {logged[step]}" in out, (step, out)
    monkeypatch.undo()
    _poison_step(monkeypatch, set(range(3, 100)))
    cfg = write_config(tmp_path, corpus, max_steps=9, nan_policy="skip", nan_skip_limit=3,
                       output_dir=str(tmp_path / "out2"))
    assert cli_main(["train", cfg]) == 2
    assert "3 consecutive non-finite steps" in capsys.readouterr().err


@pytest.mark.parametrize("model", ["micro-qwen2", "micro-llama"])
def test_checkpoint_loads_in_transformers_with_same_eval_loss(corpus, tmp_path, model):
    """The output directory and its checkpoint-N load in transformers: the model with our eval loss, and the
    tokenizer (AutoTokenizer) with exactly the ids the token files were made with."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from pretrain_cli.data.tokenizer import load_tokenizer

    from pretrain_cli.data.indexed import open_token_file
    from pretrain_cli.models.config import ModelConfig
    from pretrain_cli.training.weight_source import load_for_inference
    from pretrain_cli.training.evaluation import loss_sum, read_tokens, window_batches

    cfg = write_config(tmp_path, corpus, max_steps=6, model_name_or_path=model)
    assert cli_main(["train", cfg]) == 0
    out = tmp_path / "out"
    prefix = str(corpus / "data" / "docs")
    ours = load_tokenizer(corpus / "tokenizer")
    texts = ["a\n\nb", "  x  ", "p\r\nq\r\n\r\n", "\tx\t\ty", "def f(x):\n    return x\n\n\n", "日本語 中文",
             "café cafe\u0301", json.loads((corpus / "corpus.jsonl").read_text(encoding="utf-8").splitlines()[3])["text"]]
    for d in (out, out / "checkpoint-6"):
        hf_tok = AutoTokenizer.from_pretrained(str(d))
        assert [hf_tok.encode(t, add_special_tokens=False) for t in texts] == [ours.encode(t) for t in texts], d
    model, _ = load_for_inference(out, ModelConfig.from_file(str(out)), 0)
    total, count, _ = loss_sum(model, window_batches(read_tokens(prefix)[0], 32, 4, max_batches=3))
    ours = {"loss": total / count}
    hf = AutoModelForCausalLM.from_pretrained(str(out)).eval()
    tokens = open_token_file(prefix)
    flat = np.asarray(tokens.tokens(0, 3 * 4 * 32 + 1), dtype=np.int64)
    windows = np.stack([flat[k * 32:k * 32 + 33] for k in range(12)])
    with torch.no_grad():
        logits = hf(torch.from_numpy(windows[:, :-1])).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                 torch.from_numpy(windows[:, 1:]).reshape(-1))
    assert ours["loss"] == pytest.approx(float(loss), abs=1e-4)


def test_eval_and_generate_take_the_runs_settings_and_overrides(corpus, tmp_path, capsys):
    """eval/generate on a run's directory use its args.json (window length, kernels) with train's overrides;
    eval --config takes train's overrides and a run's args.json; --data with --config and another window
    length than training's each get a note; overrides without a run are one line."""
    cfg = write_config(tmp_path, corpus, max_steps=2, save_steps=2)
    assert cli_main(["train", cfg, "--num_hidden_layers", "1"]) == 0
    trained = next(line for line in capsys.readouterr().out.splitlines() if "kernels: " in line).split("kernels: ")[1]
    out, data = str(tmp_path / "out"), str(corpus / "data" / "docs")

    def run(*argv):
        assert cli_main(list(argv)) == 0, argv
        printed = capsys.readouterr()
        return json.loads(printed.out), printed.err

    by_config, _ = run("eval", "--config", cfg, "--json", "--num_hidden_layers", "1")
    by_record, _ = run("eval", "--config", f"{out}/args.json", "--json")
    by_model, _ = run("eval", "--model", out, "--json")  # a run's directory: its own valid split
    assert by_config["loss"] == by_record["loss"] == by_model["loss"] and by_model["split"] == "valid"
    assert by_config["kernels"] == by_model["kernels"] == trained
    windows, err = run("eval", "--model", out, "--data", data, "--max_batches", "2", "--json")
    assert windows["max_seq_length"] == 32 and windows["kernels"] == trained and "note:" not in err
    _, err = run("eval", "--model", out, "--data", data, "--max_batches", "2", "--max_seq_length", "16", "--json")
    assert "note: 16-token windows; the model was trained on 32-token ones" in err
    _, err = run("eval", "--config", cfg, "--num_hidden_layers", "1", "--data", data, "--max_batches", "1", "--json")
    assert f"note: --data {data}: its windows, in {cfg}'s settings" in err
    generated, err = run("generate", "--model", out, "--prompt", "The", "--max_new_tokens", "2", "--json")
    assert generated["kernels"] == trained
    flash_off, _ = run("generate", "--model", out, "--prompt", "The", "--max_new_tokens", "2", "--json",
                       "--use_flash_attention", "false")  # train's key, train's meaning
    assert flash_off["kernels"] != trained and "attention=cpu" in trained
    assert cli_main(["eval", "--model", "micro-qwen2", "--data", data, "--max_seq_length", "16", "--max_steps",
                     "3"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--max_steps 3: --key value overrides change a run's settings" in err[0]


def test_eval_and_generate_on_a_run_stopped_before_its_export_take_its_newest_checkpoint(corpus, tmp_path, capsys):
    """A run's output_dir with args.json and checkpoint-N/ but no final model (stopped before its export): eval
    and generate --model take its newest checkpoint and say so in a note, as eval --config does."""
    cfg = write_config(tmp_path, corpus, max_steps=4, save_steps=2)
    assert cli_main(["train", cfg]) == 0
    out = tmp_path / "out"
    for p in out.iterdir():  # what the run had written before its final export
        if p.is_file() and p.name not in ("args.json", "metrics.jsonl"):
            p.unlink()
    capsys.readouterr()
    newest = out / "checkpoint-4"
    note = f"note: {out} holds no final model (its run stopped before the export): using its newest checkpoint, {newest}"
    results = []
    for argv in (["eval", "--model", str(out)], ["generate", "--model", str(out), "--prompt", "The",
                 "--max_new_tokens", "3"], ["eval", "--config", str(out / "args.json")]):
        assert cli_main([*argv, "--json"]) == 0, argv
        printed = capsys.readouterr()
        results.append(json.loads(printed.out))
        assert note in printed.err.splitlines(), argv
    by_model, generated, by_config = results
    assert by_model["model"] == by_config["model"] == str(newest) and by_model["loss"] == by_config["loss"]
    assert by_model["split"] == "valid" and generated["model"] == str(newest)
    assert generated["model_weights"] == "trained weights"


def test_generate_is_seeded_and_greedy_is_deterministic(corpus, tmp_path, capsys):
    cfg = write_config(tmp_path, corpus, max_steps=4)
    assert cli_main(["train", cfg]) == 0
    capsys.readouterr()
    out = str(tmp_path / "out")
    runs = []
    for extra in ([], [], ["--temperature", "1.0", "--seed", "5"], ["--temperature", "1.0", "--seed", "5"],
                  ["--temperature", "1.0", "--seed", "6", "--top_k", "50", "--top_p", "0.9"]):
        assert cli_main(["generate", "--model", out, "--prompt", "The", "--max_new_tokens", "12", "--json",
                         *extra]) == 0
        printed = capsys.readouterr()
        runs.append(json.loads(printed.out)["tokens"])
    # the kernels of the run that wrote the directory (its args.json: use_flash_attention, the CPU kernel), printed
    assert "kernels: attention=cpu " in printed.err and "head+loss=cpu" in printed.err
    assert runs[0] == runs[1] and runs[2] == runs[3]
    assert len(runs[2]) <= 12 and all(0 <= t < 512 for r in runs for t in r)


def test_metrics_after_resume_and_eval_only_run_keep_history(corpus, tmp_path):
    import shutil

    cfg = write_config(tmp_path, corpus, max_steps=6, save_steps=3, split="90,5,5")
    assert cli_main(["train", cfg]) == 0
    out = tmp_path / "out"
    shutil.rmtree(out / "checkpoint-6")  # as if killed after step 6 was logged but before it was saved
    assert cli_main(["train", cfg]) == 0  # resumes from checkpoint-3 and re-logs steps 4..6
    recs = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [(r["kind"], r["step"]) for r in recs] == [("startup", 0), ("train", 1), ("train", 2), ("train", 3),
                                                      ("checkpoint", 3), ("startup", 3), ("train", 4), ("train", 5),
                                                      ("train", 6), ("checkpoint", 6)]
    assert cli_main(["train", cfg, "--do_train", "false", "--do_eval", "true"]) == 0
    kinds = [json.loads(x)["kind"] for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert kinds == ["startup"] + ["train"] * 3 + ["checkpoint", "startup"] + ["train"] * 3 + ["checkpoint", "eval"]
    results = json.loads((out / "all_results.json").read_text())
    assert "train_loss" in results and "eval_loss" in results


def test_finished_run_saves_its_last_step_and_extends_from_there(corpus, tmp_path, capsys):
    cfg = write_config(tmp_path, corpus, max_steps=6, save_steps=4)
    assert cli_main(["train", cfg]) == 0
    out = tmp_path / "out"
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-4", "checkpoint-6"]
    capsys.readouterr()
    assert cli_main(["check", cfg, "--max_steps", "8"]) == 0  # the resolved run says where it starts
    text = capsys.readouterr().out
    assert f"resumes from {out / 'checkpoint-6'}" in text and "random init" not in text
    assert cli_main(["train", cfg, "--max_steps", "8"]) == 0
    assert f"resumed from {out / 'checkpoint-6'} at step 6" in capsys.readouterr().out
    steps = [r["step"] for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if r["kind"] == "train"]
    assert steps == list(range(1, 9))  # steps 5 and 6 were not trained twice
    assert json.loads((out / "trainer_state.json").read_text())["global_step"] == 8


def test_stop_message_says_how_to_continue():
    from types import SimpleNamespace

    from pretrain_cli.training.run import stop_message

    def output(overwrite):
        return SimpleNamespace(overwrite=overwrite, output_dir="o")

    assert "re-run the same command to resume from checkpoint-7" in stop_message(output(False), 7)
    text = stop_message(output(True), 7)
    assert "re-run the same command" not in text and "resume_from_checkpoint to o/checkpoint-7" in text


def test_every_tracker_keeps_the_whole_run_across_resumes(corpus, tmp_path, monkeypatch, capsys):
    """`report_to: all` (VisualDL, TensorBoard, wandb offline): each holds the same loss series as
    metrics.jsonl, as one curve across two resumes and a killed run's stray line, and the run's configuration."""
    import tracker_readers
    from visualdl import LogReader

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.delenv("WANDB_DIR", raising=False)
    cfg = write_config(tmp_path, corpus, max_steps=4, save_steps=2, report_to="all", do_eval=True, eval_steps=2)
    out = tmp_path / "out"
    runs = out / "runs"
    assert cli_main(["check", cfg]) == 0
    assert "  report_to: metrics.jsonl + visualdl, tensorboard, wandb" in capsys.readouterr().out.splitlines()
    assert cli_main(["train", cfg]) == 0
    first = sorted(p.name for p in runs.glob("vdlrecords.*"))
    assert cli_main(["train", cfg, "--max_steps", "6"]) == 0  # resumes from checkpoint-4
    (out / "metrics.jsonl").open("a").write('{"kind": "train", "step": 7, "loss": 1.0}\n')  # killed run
    assert cli_main(["train", cfg, "--max_steps", "9"]) == 0  # resumes from checkpoint-6
    files = sorted(runs.glob("vdlrecords.*"))
    assert len(files) == 1 and files[0].name > first[-1]  # VisualDL shows the newest file: the only one
    reader = LogReader(file_path=str(files[0]))
    steps = [r.id for r in reader.get_data("scalar", "train/loss")]
    assert steps == list(range(1, 10))  # one continuous curve: no gap at a resume, no step twice
    assert [r.id for r in reader.get_data("scalar", "eval/eval_loss")] == [2, 4, 6, 8, 9]
    records = [json.loads(line) for line in (out / "metrics.jsonl").open()]
    losses = [r["loss"] for r in records if r["kind"] == "train"]
    eval_losses = [(r["step"], r["eval_loss"]) for r in records if r["kind"] == "eval"]
    assert [r.value for r in reader.get_data("scalar", "train/loss")] == pytest.approx(losses)
    assert json.loads(reader.get_data("text", "config")[0].text.encoded_text_string)["arguments"]["max_steps"] == 9

    assert len(list(runs.glob("events.out.tfevents.*"))) == 1  # TensorBoard reads every file: only the newest
    scalars, texts = tracker_readers.tensorboard(runs)
    assert [s for s, _ in scalars["train/loss"]] == steps
    assert [v for _, v in scalars["train/loss"]] == pytest.approx(losses)
    assert [(s, pytest.approx(v)) for s, v in scalars["eval/eval_loss"]] == eval_losses
    assert json.loads(texts["config"])["arguments"]["max_steps"] == 9
    # the per-rank startup records stay in metrics.jsonl: not live, and not replayed by a resume either
    assert [r["kind"] for r in records].count("startup") == 3
    assert not [tag for tag in scalars if tag.startswith("startup")]
    assert not [tag for tag in reader.get_tags().get("scalar", []) if tag.startswith("startup")]

    wandb_runs = sorted((out / "wandb").glob("offline-run-*"), key=lambda p: p.stat().st_mtime)
    assert len(wandb_runs) == 3  # one per process; the last holds the whole run (`wandb sync` uploads it)
    rows, config = tracker_readers.wandb_run(wandb_runs[-1])
    train = [(row["train/global_step"], row["train/loss"]) for row in rows if "train/loss" in row]
    assert [s for s, _ in train] == steps and [v for _, v in train] == pytest.approx(losses)
    assert [(row["train/global_step"], pytest.approx(row["eval/eval_loss"])) for row in rows
            if "eval/eval_loss" in row] == eval_losses
    assert config["arguments"]["max_steps"] == 9 and config["run"]["output"]["report_to"] == ["visualdl", "tensorboard", "wandb"]


def test_resume_verifies_the_files_it_reads_and_falls_back_past_an_altered_one(corpus, tmp_path, capsys):
    """Rank 0 checks only presence and sizes before choosing; the checksums are checked by whoever reads the
    files. A flipped byte (same size) in the newest checkpoint is found while reading it: one warning, and the
    run resumes from the previous checkpoint instead."""
    cfg = write_config(tmp_path, corpus, max_steps=4, save_steps=2)
    assert cli_main(["train", cfg]) == 0
    out = tmp_path / "out"
    f = next((out / "checkpoint-4").glob("model*.safetensors"))
    data = f.read_bytes()
    f.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    capsys.readouterr()
    assert cli_main(["train", cfg, "--max_steps", "6"]) == 0
    said = "".join(capsys.readouterr())
    assert f"not resuming from checkpoint-4: {f} does not match its checksum; trying the previous checkpoint" in said
    assert "checkpoint-2 at step 2" in said
    assert json.loads((out / "trainer_state.json").read_text())["global_step"] == 6


# what Paddle raised when an allocation failed in the backward of our fused loss's PyLayer (an `(External)` error,
# which Python sees as an OSError), and what it raises for a failed allocation anywhere else
PYLAYER_OOM = OSError("(External) { ==== Error message in backward of GradNodePyLayer__Fused ==== MemoryError: "
                      "(ResourceExhausted) Fail to alloc memory of 544538624 size, error code is 12.\n  At: "
                      "/x/ops/cpu_ops.py(197): scale_by\n  /x/ops/linear_loss.py(77): backward }")


@pytest.mark.parametrize("where", ["step", "start-up"])
def test_out_of_memory_on_cpu_is_one_line_with_step_peak_and_suggestion(corpus, tmp_path, capsys, monkeypatch, where):
    """An allocation failing at step 2 (the PyLayer backward's OSError) or while the model is built (MemoryError):
    `error: out of memory at step N (process peak X GiB) on 1 x cpu: top plan suggestion …`, exit 1, no stack."""
    from pretrain_cli.distributed.strategies.strategy import Strategy
    from pretrain_cli.training import run

    if where == "step":
        calls, real = [], Strategy.forward_backward

        def failing(self, *a, **k):
            calls.append(1)
            if len(calls) == 2:
                raise PYLAYER_OOM
            return real(self, *a, **k)

        monkeypatch.setattr(Strategy, "forward_backward", failing)
    else:
        def no_memory(*a, **k):
            raise MemoryError("(ResourceExhausted) Fail to alloc memory of 4294967296 size, error code is 12.")

        monkeypatch.setattr(run, "build_model", no_memory)
    cfg = write_config(tmp_path, corpus, max_steps=4)
    assert cli_main(["train", cfg]) == 1
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error: ")]
    assert len(err) == 1, err
    at = "at step 2" if where == "step" else "before the first step (building the run)"
    assert err[0].startswith(f"error: out of memory {at} (process peak "), err[0]
    assert " GiB) on 1 x cpu: top plan suggestion for this run: " in err[0] or "no layout" in err[0], err[0]
    assert "External" not in err[0] and "cpu_ops.py" not in err[0] and "ResourceExhausted" not in err[0]
