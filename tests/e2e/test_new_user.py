"""What a new user runs into after a first training run (issue #42): re-running a finished run, continuing it
with a longer schedule, a second run in the same directory, and `check` agreeing with `train` about resumes."""
import json
import subprocess
import sys

from pretrain_cli.cli import main as cli_main
from pretrain_cli.training import run_lock

from e2e_helpers import write_config


def _rows(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_finished_run_rerun_continue_second_run_and_check(corpus, tmp_path, capsys):
    cfg = write_config(tmp_path, corpus, max_steps=6, save_steps=6, lr_scheduler_type="cosine", do_eval=True,
                       do_predict=True, eval_steps=6, learning_rate=0.004, min_learning_rate=0.0004)
    out = tmp_path / "out"
    assert cli_main(["train", cfg]) == 0
    rows = _rows(out)
    capsys.readouterr()

    # the same command again: one line, nothing trained, no duplicate eval/test rows
    assert cli_main(["train", cfg]) == 0
    assert "already at max_steps=6: nothing to train; raise max_steps to continue" in capsys.readouterr().out
    assert _rows(out) == rows and not (out / run_lock.LOCK_FILE).exists()
    # check of the finished run on a simulated launch: the launch before the advice (it printed "...; raise
    # max_steps to continue on 1 process (simulated)", as if that were how to continue)
    assert cli_main(["check", cfg, "--world_size", "1"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == ("check: OK on 1 process (simulated) — already at max_steps=6: "
                                                        "nothing to train; raise max_steps to continue")

    # check refuses what train refuses: another model type, another max_seq_length, an output_dir that is a file
    assert cli_main(["check", cfg, "--max_steps", "8", "--model_name_or_path", "micro-llama"]) == 2
    assert "model_type=qwen2" in capsys.readouterr().err
    assert cli_main(["check", cfg, "--max_steps", "8", "--max_seq_length", "48"]) == 2
    assert "max_seq_length=32" in capsys.readouterr().err
    assert cli_main(["check", cfg, "--output_dir", cfg]) == 2
    assert "is a file, not a directory" in capsys.readouterr().err

    # continuing it with a longer schedule says how the schedule changes, before training
    assert cli_main(["check", cfg, "--max_steps", "8"]) == 0
    note = [ln for ln in capsys.readouterr().out.splitlines() if "note: schedule:" in ln]
    assert len(note) == 1 and "checkpoint-6 was trained on cosine, warmup 2, peak 0.004, decay to 0.0004 by step 6" in note[0]
    assert "stretched to this run's: cosine, warmup 2, peak 0.004, decay to 0.0004 by step 8" in note[0]

    # a second run while another holds the directory: refused with one line naming it, nothing written
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (out / run_lock.LOCK_FILE).write_text(json.dumps({"host": __import__("socket").gethostname(),
                                                          "pid": holder.pid, "started": "now"}))
        assert cli_main(["train", cfg, "--max_steps", "8"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"in use by another run (pid {holder.pid} on this host" in err[0]
        assert _rows(out) == rows
    finally:
        holder.kill()
        holder.wait()

    # the holder is gone: its lock is stale; keep the saved schedule, so the extra steps run at min_learning_rate
    assert cli_main(["train", cfg, "--max_steps", "8", "--lr_schedule_on_resume", "keep"]) == 0
    assert "; kept: cosine, warmup 2, peak 0.004, decay to 0.0004 by step 6" in capsys.readouterr().out
    lrs = {r["step"]: r["learning_rate"] for r in _rows(out) if r["kind"] == "train"}
    assert lrs[7] == lrs[8] == 0.0004 and lrs[6] == 0.0004
    assert not (out / run_lock.LOCK_FILE).exists()

    # a schedule restarted at step 8: the resolved line counts its steps as the run and the note do (it said 'by
    # step 4', the schedule's own count, where the note said 'by step 12')
    assert cli_main(["check", cfg, "--max_steps", "12", "--warmup_steps", "1", "--lr_schedule_on_resume",
                     "restart"]) == 0
    printed = capsys.readouterr().out
    assert "restarted: cosine from step 8, warmup 1, peak 0.004, decay to 0.0004 by step 12" in printed
    assert "  schedule: cosine from step 8, warmup 1, peak 0.004, decay to 0.0004 by step 12; " in printed


def test_a_resume_with_another_batch_counts_the_tokens_the_run_reads(corpus, tmp_path, capsys):
    """A run of 4 steps of 4 sequences continued to 6 with per_device_train_batch_size 2: `check` said '6 steps = 384
    tokens' and 'the run's 24 train samples' (every step at the new batch); the run reads 16 + 2 x 2 = 20 sequences
    (640 tokens of 32), as train's consumed_samples says after it."""
    cfg = write_config(tmp_path, corpus, max_steps=4, save_steps=4)
    assert cli_main(["train", cfg]) == 0
    capsys.readouterr()
    more = ["--max_steps", "6", "--per_device_train_batch_size", "2"]
    assert cli_main(["check", cfg, *more]) == 0
    lines = capsys.readouterr().out.splitlines()
    batch = next(ln for ln in lines if ln.startswith("  batch: "))
    assert batch.endswith("6 steps = 640 tokens (checkpoint-4's 16 sequences, then 2 steps of 2)"), batch
    assert "the run's 20 train samples from it" in next(ln for ln in lines if ln.startswith("  data: "))
    assert cli_main(["check", cfg, *more, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["total_tokens"] == 640
    assert cli_main(["train", cfg, *more]) == 0
    assert json.loads((tmp_path / "out" / "trainer_state.json").read_text())["consumed_samples"] == 20
    capsys.readouterr()
    assert cli_main(["check", cfg, "--max_steps", "8", "--overwrite_output_dir", "true"]) == 0  # one batch throughout
    assert "tokens/step; 8 steps = 1,024 tokens\n" in capsys.readouterr().out
    assert cli_main(["check", cfg, "--max_steps", "5"]) == 0  # past it: nothing to train, the file's arithmetic
    assert "tokens/step; 5 steps = 640 tokens\n" in capsys.readouterr().out


def test_an_output_dir_holding_a_model_no_run_wrote_is_refused(corpus, tmp_path, capsys):
    """output_dir set to a downloaded or exported model's directory (the one continue_training reads, say): check and
    train said OK, and the run's final model replaced its weights. Refused in one line unless overwrite_output_dir;
    a run's own directory (its args.json) resumes as before."""
    model = tmp_path / "hf"
    model.mkdir()
    (model / "model.safetensors").write_bytes(b"weights")
    cfg = write_config(tmp_path, corpus, max_steps=2, save_steps=2, output_dir=str(model))
    for command in ("check", "train"):
        assert cli_main([command, cfg]) == 2
        assert capsys.readouterr().err == (f"error: output_dir: {model} holds a model no run wrote there "
                                           "(model.safetensors, no args.json), which this run's final model would "
                                           "replace; choose another output_dir, or set overwrite_output_dir: true to "
                                           "replace it\n")
    assert sorted(p.name for p in model.iterdir()) == ["model.safetensors"]  # nothing written
    assert cli_main(["check", cfg, "--overwrite_output_dir", "true"]) == 0
    run = write_config(tmp_path, corpus, max_steps=2, save_steps=2)  # a run's own directory: its final model
    assert cli_main(["train", run]) == 0
    assert cli_main(["check", run, "--max_steps", "3"]) == 0 and "resumes from" in capsys.readouterr().out
