"""`pretrain-cli eval`: window arithmetic, token-weighted loss, JSON output, errors."""
import argparse
import json
import math
from pathlib import Path

import numpy as np
import pytest

from pretrain_cli import runtime

paddle = runtime.import_paddle()

from pretrain_cli.models import convert  # noqa: E402
from pretrain_cli.commands import eval as evaluate  # noqa: E402
from pretrain_cli.training import evaluation  # noqa: E402
from pretrain_cli.data.indexed_writer import IndexedDatasetWriter  # noqa: E402
from pretrain_cli.errors import UserError  # noqa: E402
from pretrain_cli.models import build_model  # noqa: E402
from pretrain_cli.models.config import ModelConfig  # noqa: E402

CFG = dict(model_type="llama", vocab_size=64, hidden_size=16, intermediate_size=24, num_hidden_layers=1,
           num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32)


@pytest.fixture
def corpus(tmp_path):
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 64, 45)
    with IndexedDatasetWriter(str(tmp_path / "c"), dtype=np.uint16) as w:
        w.add_item(tokens[:20])
        w.end_document()
        w.add_item(tokens[20:])
        w.end_document()
        w.finalize()
    return str(tmp_path / "c"), tokens


@pytest.fixture
def model_dir(tmp_path):
    cfg = ModelConfig(**CFG)
    paddle.seed(0)
    m = build_model(cfg)
    convert.save_hf(m, cfg, str(tmp_path / "m"))
    return str(tmp_path / "m"), m


def _ns(**kw):
    parser = argparse.ArgumentParser()
    evaluate.add_arguments(parser)
    argv = []
    for k, v in kw.items():
        argv += [f"--{k}"] if v is True else [f"--{k}", str(v)]
    return parser.parse_args(argv)


def test_windows_share_one_boundary_token():
    toks = np.arange(23)
    batches = list(evaluation.window_batches(toks, 5, 3))
    assert [b["input_ids"].shape for b in batches] == [(3, 5), (1, 5)]  # (23-1)//5 = 4 windows
    assert batches[0]["input_ids"][1].tolist() == [5, 6, 7, 8, 9] and batches[0]["labels"][1].tolist() == [6, 7, 8, 9, 10]
    assert batches[1]["input_ids"][0].tolist() == [15, 16, 17, 18, 19]
    assert batches[0]["input_ids"].dtype == np.int64
    assert len(list(evaluation.window_batches(toks, 5, 3, max_batches=1))) == 1
    assert evaluation.window_count(23, 5, 3, max_batches=1) == (3, 1)


def test_loss_is_mean_over_every_predicted_token(corpus, model_dir, capsys):
    prefix, tokens = corpus
    path, model = model_dir
    assert evaluate.main(_ns(model=path, data=prefix, max_seq_length=8, batch_size=4, json=True)) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["tokens"] == 5 * 8 and out["windows"] == 5  # (45-1)//8 = 5; the last batch is short
    model.eval()
    losses = []
    for k in range(5):
        w = tokens[k * 8: k * 8 + 9]
        logits = model(paddle.to_tensor(w[None, :-1].astype("int64"))).numpy()[0].astype("float64")
        lse = np.log(np.exp(logits).sum(-1))
        losses += list(lse - logits[np.arange(8), w[1:]])
    assert out["loss"] == pytest.approx(np.mean(losses), abs=1e-5)
    assert out["ppl"] == pytest.approx(math.exp(out["loss"]), rel=1e-9)
    assert out["model_weights"] == "trained weights"


def test_text_output_says_what_was_measured(corpus, model_dir, capsys):
    prefix, _ = corpus
    evaluate.main(_ns(model=model_dir[0], data=prefix, max_seq_length=8, batch_size=2, max_batches=1))
    captured = capsys.readouterr()
    assert captured.out.startswith(f"eval: 2 windows of 8 tokens from {prefix}; loss ")
    assert "; perplexity " in captured.out and "(16 predicted tokens; " in captured.out
    assert "trained weights" in captured.out and captured.out.count("\n") == 1
    assert "eval" not in captured.err  # no progress bar when stderr is not a terminal


def test_progress_bar_on_a_terminal_keeps_json_clean(corpus, model_dir, capsys, monkeypatch):
    prefix, _ = corpus
    monkeypatch.setattr(evaluate.sys.stderr, "isatty", lambda: True)
    assert evaluate.main(_ns(model=model_dir[0], data=prefix, max_seq_length=8, batch_size=2, json=True)) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["windows"] == 5  # stdout is the JSON object and nothing else
    assert "eval:   0%" in captured.err and "0/3 " in captured.err  # ceil(5 / 2) batches; erased when done


def test_preset_random_init_is_seeded(corpus, capsys):
    prefix, _ = corpus
    tiny_vocab = "micro-llama"
    runs = []
    for _ in range(2):
        evaluate.main(_ns(model=tiny_vocab, data=prefix, max_seq_length=8, json=True, seed=3))
        runs.append(json.loads(capsys.readouterr().out))
    assert runs[0]["loss"] == runs[1]["loss"] and runs[0]["model_weights"] == "random init (seed 3)"


def test_errors(corpus, model_dir):
    prefix, _ = corpus
    with pytest.raises(UserError, match="fewer than one window"):
        evaluate.main(_ns(model=model_dir[0], data=prefix, max_seq_length=64))


def test_windows_past_the_models_range_are_evaluated_with_a_note(corpus, model_dir, capsys):
    """RoPE has no table to run out of: windows of 40 on a model of max_position_embeddings 32 are evaluated (as
    transformers runs them), with one note naming the positions past the model's range."""
    prefix, _ = corpus
    evaluate.main(_ns(model=model_dir[0], data=prefix, max_seq_length=40, json=True))
    captured = capsys.readouterr()
    assert json.loads(captured.out)["windows"] == 1  # (45 - 1) // 40
    assert ("note: --max_seq_length: 40 is past the model's max_position_embeddings (32): positions 32-39 take RoPE "
            "angles") in captured.err


def test_a_zero_window_length_is_refused_not_read_as_the_runs_own(corpus, model_dir, capsys):
    """A directory a run wrote (its args.json) gives --max_seq_length a default; an explicit 0 is no "not given"."""
    from pretrain_cli.cli import main

    prefix, _ = corpus
    record = {"version": 1, "arguments": {"max_seq_length": 8}, "run": {}}  # the shape of a run's record
    (Path(model_dir[0]) / "args.json").write_text(json.dumps(record))
    assert main(["eval", "--model", model_dir[0], "--data", prefix, "--max_seq_length", "0"]) == 2
    assert capsys.readouterr().err.splitlines() == ["error: --max_seq_length: must be >= 1, got 0"]
    assert main(["eval", "--model", model_dir[0], "--data", prefix, "--json"]) == 0  # left out: the run's 8
    assert json.loads(capsys.readouterr().out)["max_seq_length"] == 8


def test_cli_subcommand_json(corpus, model_dir, run_cli):
    prefix, _ = corpus
    r = run_cli("eval", "--model", model_dir[0], "--data", prefix, "--max_seq_length", "8", "--json", timeout=120)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)  # the whole of stdout: nothing else is printed there
    assert {"loss", "ppl", "tokens", "model_weights"} <= set(out) and out["tokens"] == 40
    r = run_cli("eval", "--model", model_dir[0], "--data", prefix + "x", "--max_seq_length", "8", timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr


def test_document_windows_equal_evaluating_each_document_piece_alone(corpus, model_dir, capsys):
    """Documents of 20 and 25 tokens: window 2 (tokens 16..24) holds the boundary at 20. With
    --attention_mask_type document every prediction equals the model run on its document piece alone
    (positions from 0), including the last token of a document predicting the next document's first."""
    prefix, tokens = corpus
    path, model = model_dir
    assert evaluate.main(_ns(model=path, data=prefix, max_seq_length=8, batch_size=2, json=True,
                             attention_mask_type="document")) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["attention_mask_type"] == "document" and doc["tokens"] == 40
    assert evaluate.main(_ns(model=path, data=prefix, max_seq_length=8, batch_size=2, json=True)) == 0
    causal = json.loads(capsys.readouterr().out)
    assert causal["attention_mask_type"] == "causal" and causal["loss"] != doc["loss"]
    model.eval()
    losses = []
    for k in range(5):
        lo, hi = k * 8, k * 8 + 8  # the window's inputs; targets are tokens lo+1 .. hi
        for a, b in ((lo, min(hi, 20)), (max(lo, 20), hi)):
            if a >= b:
                continue
            logits = model(paddle.to_tensor(tokens[None, a:b].astype("int64"))).numpy()[0].astype("float64")
            lse = np.log(np.exp(logits).sum(-1))
            losses += list(lse - logits[np.arange(b - a), tokens[a + 1:b + 1]])
    assert doc["loss"] == pytest.approx(np.mean(losses), abs=1e-5)
    batches = list(evaluation.window_batches(tokens, 8, 5, doc_starts=evaluation.document_starts(prefix)))
    assert batches[0]["doc_start"][2].tolist() == [0, 0, 0, 0, 4, 4, 4, 4]  # window 2: document 2 starts at 20
    assert batches[0]["position_ids"][2].tolist() == [0, 1, 2, 3, 0, 1, 2, 3]
    kept = list(evaluation.window_batches(tokens, 8, 5, doc_starts=evaluation.document_starts(prefix),
                                          reset_position_ids=False))
    assert set(kept[0]) == {"input_ids", "labels", "doc_start"}


def test_data_of_another_tokenizer_than_the_models_is_refused(corpus, model_dir, tmp_path, capsys):
    """The tokenizer beside the model against the token file's sidecar, as `train` checks the run's."""
    import shutil

    from data_helpers import make_tokenizer
    from pretrain_cli.data.indexed import SIDECAR_FORMAT
    from pretrain_cli.data.tokenizer import load_tokenizer

    prefix, _ = corpus
    tok = load_tokenizer(make_tokenizer(tmp_path / "tok"))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tmp_path / "tok" / name, model_dir[0])
    sidecar = {"format": SIDECAR_FORMAT, "tokens": 45, "vocab_size": tok.vocab_size, "eos_token_id": tok.eos_token_id}
    (tmp_path / "c.json").write_text(json.dumps({**sidecar, "tokenizer_fingerprint": "0" * 64}))
    with pytest.raises(UserError, match=r"^--data: .*c\.json: made by another tokenizer than .*\(fingerprint 000000000000;"):
        evaluate.main(_ns(model=model_dir[0], data=prefix, max_seq_length=8, json=True))
    (tmp_path / "c.json").write_text(json.dumps({**sidecar, "tokenizer_fingerprint": tok.fingerprint}))
    assert evaluate.main(_ns(model=model_dir[0], data=prefix, max_seq_length=8, json=True)) == 0
    assert json.loads(capsys.readouterr().out)["tokens"] > 0


def test_split_with_data_is_refused_not_ignored(corpus, model_dir, capsys):
    """--split picks a run's own split; with --data the file's windows would be evaluated instead, silently."""
    from pretrain_cli.cli import main

    prefix, _ = corpus
    assert main(["eval", "--model", model_dir[0], "--data", prefix, "--max_seq_length", "8", "--split", "test"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: --split test: picks a split of a run's own data, but --data")
    assert main(["eval", "--model", model_dir[0], "--data", prefix, "--max_seq_length", "8", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["windows"] == 5  # without --split: the windows, as before


def test_seed_outside_trains_range_is_one_line(corpus, model_dir, capsys):
    from pretrain_cli.cli import main

    prefix, _ = corpus
    for seed in ("-1", str(2**32)):
        assert main(["eval", "--model", model_dir[0], "--data", prefix, "--max_seq_length", "8", "--seed", seed]) == 2
        assert capsys.readouterr().err.splitlines() == [f"error: --seed: must be in [0, 2^32), got {seed}"]


def test_a_run_dir_without_a_model_or_checkpoint_is_one_line(corpus, tmp_path, capsys):
    """A run's output_dir before its first checkpoint: nothing to evaluate yet, said in one line."""
    from pretrain_cli.cli import main

    prefix, _ = corpus
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "args.json").write_text(json.dumps({"version": 1, "arguments": {}, "run": {}}))
    for command in (["eval", "--data", prefix], ["generate", "--prompt", "x"]):
        assert main([command[0], "--model", str(tmp_path / "run"), *command[1:]]) == 2
        assert capsys.readouterr().err.splitlines() == [
            f"error: --model: {tmp_path / 'run'} is a run's output_dir with neither a final model nor a checkpoint-N "
            f"yet; wait for its first checkpoint (save_steps) or point --model at a model directory"]


def test_a_model_that_is_no_runs_directory_asks_for_data_naming_why():
    """`eval --model DIR` of an export or a download (no args.json: no split of its own) names why --data is needed,
    not the generic usage line that reads as if --model were missing."""
    with pytest.raises(UserError) as e:
        evaluate.main(_ns(model="micro-qwen2"))
    line = str(e.value)
    assert "\n" not in line and "--model micro-qwen2 is not a run's directory (no args.json of a run)" in line, line
    assert "pass --data PREFIX" in line, line


def test_a_kernel_override_on_a_model_no_run_wrote_brings_no_windows(corpus, model_dir):
    """The kernel overrides' made-up arguments were read as a run's: `--use_flash_attention false` without
    --max_seq_length evaluated 1024-token windows ("the run's max_seq_length"), where without it eval asked."""
    prefix, _ = corpus
    for overrides in ([], ["--use_flash_attention", "false"]):
        ns = _ns(model=model_dir[0], data=prefix)
        ns.overrides = overrides
        with pytest.raises(UserError, match=r"^eval: pass --max_seq_length \(--model is no directory a run wrote"):
            evaluate.main(ns)


def test_the_vocab_refusal_names_the_files_output_dir(corpus, model_dir, tmp_path, capsys):
    """`eval --config FILE` of the file's output_dir: its vocab_size refusal began "--model:", never given."""
    from data_helpers import write_tokens

    from pretrain_cli.cli import main

    out = tmp_path / "out"
    cfg = ModelConfig(**{**CFG, "vocab_size": 96})
    convert.save_hf(build_model(cfg), cfg, str(out))
    config = tmp_path / "run.json"
    config.write_text(json.dumps({"model_name_or_path": model_dir[0], "output_dir": str(out), "max_seq_length": 8,
                                  "input_dir": write_tokens(tmp_path / "t", n_docs=4, doc_len=64, vocab_size=64),
                                  "split": "50,50,0", "per_device_eval_batch_size": 1, "eval_iters": 1}))
    assert main(["eval", "--config", str(config)]) == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"error: {config}: output_dir: vocab_size 96 differs from the config's model (64); evaluate the model this "
        f"config trains")
