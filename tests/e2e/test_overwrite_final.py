"""A run that starts over in its output_dir (overwrite_output_dir) and the earlier run's final model there: left in
place, `eval --model OUT` and `generate` took it for the new run's model until the new run exported its own."""
import json

from pretrain_cli.cli import main as cli_main

from e2e_helpers import write_config


def _interrupted_at(monkeypatch, step: int) -> None:
    """Ctrl-C during step `step` (the checkpoints before it saved), as a terminal's SIGINT stops a run mid-step."""
    from pretrain_cli.training import trainer as trainer_mod

    real, calls = trainer_mod.Trainer.train_step, []

    def step_or_interrupt(self, *a, **k):
        calls.append(1)
        if len(calls) == step:
            raise KeyboardInterrupt
        return real(self, *a, **k)

    monkeypatch.setattr(trainer_mod.Trainer, "train_step", step_or_interrupt)


def test_starting_over_removes_the_earlier_runs_final_model(corpus, tmp_path, monkeypatch, capsys):
    cfg = write_config(tmp_path, corpus, max_steps=4, save_steps=2)
    assert cli_main(["train", cfg]) == 0
    out = tmp_path / "out"
    (out / "notes.txt").write_text("mine")  # a file of the user's: no export wrote it
    assert (out / "model.safetensors").is_file() and (out / "config.json").is_file()
    capsys.readouterr()
    _interrupted_at(monkeypatch, 3)  # the new run saves checkpoint-2, then is stopped before its export
    assert cli_main(["train", cfg, "--overwrite_output_dir", "true"]) == 130
    left = sorted(p.name for p in out.iterdir())
    for name in ("model.safetensors", "config.json", "generation_config.json", "trainer_state.json",
                 "train_results.json", "all_results.json", "tokenizer.json"):
        assert name not in left, left
    assert "notes.txt" in left and "args.json" in left and "checkpoint-2" in left
    logged = capsys.readouterr().out  # (the run's log lines are on stdout)
    assert "overwrite_output_dir: removed the final model of step 4 an earlier run exported to" in logged, logged
    monkeypatch.undo()
    # eval on the directory takes the new run's newest checkpoint, and says it is not a final model
    assert cli_main(["eval", "--model", str(out), "--max_batches", "1"]) == 0
    captured = capsys.readouterr()
    assert f"note: {out} holds no final model yet (its run stopped before the export): using its newest " \
           f"checkpoint, {out / 'checkpoint-2'}" in captured.err, captured.err
    assert f"{out / 'checkpoint-2'}, trained weights" in captured.out, captured.out


def test_starting_over_keeps_a_model_no_run_exported_until_its_export(corpus, tmp_path, monkeypatch, capsys):
    """A directory without args.json (a downloaded model the run may replace at its end) is nobody's final export:
    args.json records its weights as there before the run, so until the run's export eval takes the run's newest
    checkpoint (it took the download for the run's trained weights), and nothing of it goes when a run starts over
    (a second start removed it as 'the final model an earlier run exported'). The run's export replaces it: its
    weights under transformers' names go (pytorch_model.bin was left, and read by
    from_pretrained(use_safetensors=False)), others are named."""
    out = tmp_path / "out"
    out.mkdir()
    download = {n: b"someone's weights" for n in ("model.safetensors", "pytorch_model.bin", "consolidated.safetensors")}
    download["config.json"] = json.dumps({"model_type": "qwen2"}).encode()
    for name, data in download.items():
        (out / name).write_bytes(data)
    cfg = write_config(tmp_path, corpus, max_steps=4, save_steps=2)
    for start in range(2):  # each stopped in step 3, after checkpoint-2
        _interrupted_at(monkeypatch, 3)
        assert cli_main(["train", cfg, "--overwrite_output_dir", "true"]) == 130
        monkeypatch.undo()
        assert {n: (out / n).read_bytes() for n in download} == download
        assert "removed the final model" not in capsys.readouterr().out
    recorded = json.loads((out / "args.json").read_text())["weights_before_the_run"]
    assert sorted(e["name"] for e in recorded) == ["consolidated.safetensors", "model.safetensors",
                                                   "pytorch_model.bin"]
    assert cli_main(["eval", "--model", str(out), "--max_batches", "1"]) == 0
    captured = capsys.readouterr()
    assert f"using its newest checkpoint, {out / 'checkpoint-2'} (consolidated.safetensors, model.safetensors, " \
           f"pytorch_model.bin there are the model {out} held before the run, not trained by it" in captured.err, \
        captured.err
    assert f"{out / 'checkpoint-2'}, trained weights" in captured.out, captured.out
    assert cli_main(["train", cfg, "--overwrite_output_dir", "true"]) == 0
    logged = capsys.readouterr().out
    assert (out / "model.safetensors").read_bytes() != b"someone's weights"
    assert not (out / "pytorch_model.bin").exists() and (out / "consolidated.safetensors").is_file()
    assert f"final export: removed pytorch_model.bin from {out}:" in logged, logged
    assert f"final export: {out} also holds consolidated.safetensors: weights under names no export" in logged, logged
    assert cli_main(["eval", "--model", str(out), "--max_batches", "1"]) == 0
    assert f"{out}, trained weights" in capsys.readouterr().out


def test_a_final_model_older_than_the_runs_newest_checkpoint_is_named_so(corpus, tmp_path, monkeypatch, capsys):
    """A finished run resumed with a higher max_steps and stopped before its export: its final model (step 4) is still
    the directory's, and eval on the directory used it without a word about the newer checkpoint."""
    cfg = write_config(tmp_path, corpus, max_steps=4, save_steps=2)
    assert cli_main(["train", cfg]) == 0
    out = tmp_path / "out"
    _interrupted_at(monkeypatch, 3)  # steps 5 and 6 (checkpoint-6 saved), then Ctrl-C in step 7
    assert cli_main(["train", cfg, "--max_steps", "8"]) == 130
    monkeypatch.undo()
    capsys.readouterr()
    assert cli_main(["eval", "--model", str(out), "--max_batches", "1"]) == 0
    captured = capsys.readouterr()
    assert f"note: {out} holds the final model of step 4; its run trained on to checkpoint-6, not exported yet: " \
           f"pass {out / 'checkpoint-6'} for that one" in captured.err, captured.err
    assert f"{out}, trained weights" in captured.out, captured.out
