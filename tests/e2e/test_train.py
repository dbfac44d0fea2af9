"""Training runs end to end: outputs, the falling loss, bitwise resume, document masking, accumulation (in-process through the real CLI entry, tiny model, CPU)."""
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
    assert results["test_tokens"] == 10 * results["eval_tokens"]  # PaddleNLP's test_iters = 10 x eval_iters
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
    assert train_results["tokens_this_launch"] == 96 * 32  # all of it: the run's one launch
    assert train_results["effective_tokens_per_second_this_launch"] > 0
    state = json.loads((out / "trainer_state.json").read_text())
    assert state["global_step"] == 24 and state["consumed_samples"] == 96 and state["tokens_seen"] == 96 * 32
    args = json.loads((out / "checkpoint-12" / "args.json").read_text())
    assert args["arguments"]["max_seq_length"] == 32 and args["run"]["data"]["max_seq_length"] == 32


def test_epoch_strategies_evaluate_and_save_once_after_the_last_step(corpus, tmp_path, capsys):
    """PaddleNLP's `evaluation_strategy` / `save_strategy: epoch` (its ChatGLM2 file; refused before): its Trainer's
    one epoch is the whole run, so one evaluation and one checkpoint, both at the last step, whatever eval_steps and
    save_steps say. Two epochs of the data (the log names the wrap) change nothing."""
    cfg = write_config(tmp_path, corpus, max_steps=6, eval_steps=1, save_steps=2, evaluation_strategy="epoch",
                       save_strategy="epoch", split="2,49,49", per_device_train_batch_size=8)
    assert cli_main(["train", cfg]) == 0
    out_text = capsys.readouterr().out
    assert "evaluation_strategy: epoch evaluates once, after the last step (6)" in out_text
    assert "starts epoch 2 of" in out_text, out_text  # the train split wrapped: still one evaluation
    out = tmp_path / "out"
    logged = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in logged if r["kind"] == "eval"] == [6]
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-6"]
    assert math.isfinite(json.loads((out / "all_results.json").read_text())["eval_loss"])


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
