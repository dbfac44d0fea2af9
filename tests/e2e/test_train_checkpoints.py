"""A run's checkpoints across runs: rotation, overwrite, leftovers, refused and changed resumes, extending a finished run, and the records (time, metrics, trackers) a resume keeps."""
import json

import pytest

from pretrain_cli.cli import main as cli_main

from e2e_helpers import write_config


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
    err = capsys.readouterr().err
    assert "model_type=qwen2" in err and "set overwrite_output_dir: true to start over" in err
    # a checkpoint named by resume_from_checkpoint: overwrite_output_dir does not drop it, so the fix is another
    assert cli_main(["train", cfg, "--max_steps", "8", "--model_name_or_path", "micro-llama", "--output_dir",
                     str(tmp_path / "other"), "--resume_from_checkpoint", str(tmp_path / "out" / "checkpoint-4"),
                     "--overwrite_output_dir", "true"]) == 2
    err = capsys.readouterr().err
    assert "drop resume_from_checkpoint to start over" in err and "overwrite_output_dir" not in err


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
    assert results["train_runtime"] > results["tokens_this_launch"] / results["effective_tokens_per_second_this_launch"]
    # this launch's steps 3-4, every rank's tokens (the global batch's), named so: not "this process"
    state = json.loads((out / "trainer_state.json").read_text())
    assert results["tokens_this_launch"] == state["tokens_seen"] // 2 and "tokens_this_process" not in results


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
    # check says it before the run does (it said nothing: the warning came only once train had loaded the checkpoint)
    assert cli_main(["check", cfg, "--max_steps", "5", "--seed", "12"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-2].startswith("warning: resuming with seed 12, where checkpoint-4 was trained with 11: its ") and \
        out[-1] == "check: OK — training would start"


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
                                                      ("train", 6), ("checkpoint", 6), ("train_metrics", 6)]
    assert cli_main(["train", cfg, "--do_train", "false", "--do_eval", "true"]) == 0
    kinds = [json.loads(x)["kind"] for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert kinds == ["startup"] + ["train"] * 3 + ["checkpoint", "startup"] + ["train"] * 3 + ["checkpoint",
                                                                                            "train_metrics", "eval"]
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
    assert cli_main(["check", cfg, "--max_steps", "8"]) == 0  # `train` would train nothing: check says so
    assert "check: OK — already at max_steps=8: nothing to train" in capsys.readouterr().out


def test_check_and_a_lower_max_steps_say_what_train_will_do(corpus, tmp_path, capsys):
    """`check` said "training would start" where `train` would be refused (a live run holds the directory's lock);
    a run stopped at step 4 of 8 and given max_steps 3 trained nothing and exported step 4 without a word."""
    import os
    import socket

    from pretrain_cli.training import run_lock

    cfg = write_config(tmp_path, corpus, max_steps=8, save_steps=4)
    out = tmp_path / "out"
    assert cli_main(["train", cfg, "--max_steps", "4"]) == 0
    (out / "all_results.json").unlink()  # as if stopped at step 4 before its export
    capsys.readouterr()
    (out / run_lock.LOCK_FILE).write_text(json.dumps({"host": socket.gethostname(), "pid": os.getpid(),
                                                      "started": "then"}))
    assert cli_main(["check", cfg]) == 2
    assert "is in use by another run" in capsys.readouterr().err
    (out / run_lock.LOCK_FILE).unlink()
    assert cli_main(["train", cfg, "--max_steps", "3"]) == 0
    said = capsys.readouterr().out
    assert "already at step 4, past max_steps=3: nothing to train; raise max_steps above 4 to continue; evaluating " \
           "and writing the final model of step 4" in said
    # the line that says which checkpoint it resumed comes first (it came after the verdict on it)
    assert said.index(f"resumed from {out / 'checkpoint-4'} at step 4") < said.index("already at step 4")


def test_every_tracker_keeps_the_whole_run_across_resumes(corpus, tmp_path, monkeypatch, capsys):
    """`report_to: all` (VisualDL, TensorBoard, wandb offline): each holds the same loss series as
    metrics.jsonl, as one curve across two resumes and a killed run's stray line, and the run's configuration.
    VisualDL's file and TensorBoard's first one are cut back to the checkpoint's mark and kept, not written anew."""
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
    assert [p.name for p in files] == first  # VisualDL shows the newest file: the first run's, written on
    reader = LogReader(file_path=str(files[0]))
    steps = [r.id for r in reader.get_data("scalar", "train/loss")]
    assert steps == list(range(1, 10))  # one continuous curve: no gap at a resume, no step twice
    assert [r.id for r in reader.get_data("scalar", "eval/eval_loss")] == [2, 4, 6, 8, 9]
    records = [json.loads(line) for line in (out / "metrics.jsonl").open()]
    losses = [r["loss"] for r in records if r["kind"] == "train"]
    eval_losses = [(r["step"], r["eval_loss"]) for r in records if r["kind"] == "eval"]
    assert [r.value for r in reader.get_data("scalar", "train/loss")] == pytest.approx(losses)
    configs = reader.get_data("text", "config")
    assert [c.id for c in configs] == [0, 4, 6]  # each start's configuration, at the step it started from
    assert json.loads(configs[-1].text.encoded_text_string)["arguments"]["max_steps"] == 9

    assert len(list(runs.glob("events.out.tfevents.*"))) == 3  # TensorBoard reads every file: one per start
    scalars, texts = tracker_readers.tensorboard(runs)
    assert [s for s, _ in scalars["train/loss"]] == steps
    assert [v for _, v in scalars["train/loss"]] == pytest.approx(losses)
    assert [(s, pytest.approx(v)) for s, v in scalars["eval/eval_loss"]] == eval_losses
    assert json.loads(texts["config"])["arguments"]["max_steps"] == 9
    # the per-rank startup records stay in metrics.jsonl: not live, and not replayed by a resume either
    assert [r["kind"] for r in records].count("startup") == 3
    assert not [tag for tag in scalars if tag.startswith("startup")]
    assert not [tag for tag in reader.get_tags().get("scalar", []) if tag.startswith("startup")]

    wandb_runs = sorted((out / "wandb").glob("offline-run-*"))
    assert len(wandb_runs) == 3  # a directory per process, all of one run: each resume rewinds it to its checkpoint
    assert tracker_readers.wandb_run(wandb_runs[-1])[0][0]["train/global_step"] == 6  # from checkpoint-6: no history
    ((rows, config),) = tracker_readers.wandb_runs(out / "wandb").values()  # the run as `wandb sync` leaves it
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
    skipped = said.index(f"not resuming from checkpoint-4: {f} does not match its checksum; trying the previous "
                         f"checkpoint")
    assert "checkpoint-2 at step 2" in said
    # what the run keeps from its checkpoint is decided again for the one it resumes: the schedule's note names it
    assert "schedule: checkpoint-4 was trained on" in said[:skipped]
    assert "note: schedule: checkpoint-2 was trained on" in said[skipped:] and "(LR at step 3:" in said[skipped:]
    assert json.loads((out / "trainer_state.json").read_text())["global_step"] == 6


def test_check_verify_reads_the_checksums_train_would_and_names_the_fallback(corpus, tmp_path, capsys):
    """`check` checks presence and sizes only, as train's start does; `--verify` reads the files against their
    checksums and shows the checkpoint train would fall back to, and the run it would resume (its schedule note)."""
    cfg = write_config(tmp_path, corpus, max_steps=4, save_steps=2)
    assert cli_main(["train", cfg]) == 0
    out = tmp_path / "out"
    capsys.readouterr()
    assert cli_main(["check", cfg, "--max_steps", "6", "--verify"]) == 0
    said = capsys.readouterr().out
    assert "verify: checkpoint-4 matches its checksums" in said and "resumes from" in said
    for name in ("checkpoint-4", "checkpoint-2"):  # a flipped byte, same size: only the checksum finds it
        f = next((out / name).glob("model*.safetensors"))
        data = f.read_bytes()
        f.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
        if name == "checkpoint-4":
            assert cli_main(["check", cfg, "--max_steps", "6"]) == 0
            assert "verify:" not in capsys.readouterr().out
            assert cli_main(["check", cfg, "--max_steps", "6", "--verify"]) == 0
            said = capsys.readouterr().out
            assert f"warning: not resuming from checkpoint-4: {f} does not match its checksum" in said
            assert "verify: checkpoint-2 matches its checksums; train would resume from it" in said
            assert "schedule: checkpoint-2 was trained on" in said and f"resumes from {out / 'checkpoint-2'}" in said
            # --json: stdout is the one JSON object (of the run resuming checkpoint-2), the verify lines on stderr
            assert cli_main(["check", cfg, "--max_steps", "6", "--verify", "--json"]) == 0
            said = capsys.readouterr()
            assert json.loads(said.out)["resume"] == str(out / "checkpoint-2"), said.out
            assert "verify: checkpoint-2 matches its checksums; train would resume from it" in said.err
    assert cli_main(["check", cfg, "--max_steps", "6", "--verify"]) == 2
    assert "every checkpoint is damaged" in capsys.readouterr().err


def test_resuming_an_older_checkpoint_beside_later_ones_is_refused_without_overwrite(corpus, tmp_path, capsys):
    """resume_from_checkpoint of checkpoint-4 in a directory that holds checkpoint-8: rotation removed the run's own
    new save (it sorts by step) and a plain re-run resumed the other branch's checkpoint-8. Refused in one line,
    naming the fix; with overwrite_output_dir the later ones go."""
    cfg = write_config(tmp_path, corpus, max_steps=8, save_steps=4)
    assert cli_main(["train", cfg]) == 0
    out = tmp_path / "out"
    capsys.readouterr()
    older = ["--resume_from_checkpoint", str(out / "checkpoint-4"), "--learning_rate", "0.001"]
    assert cli_main(["train", cfg, *older]) == 2
    err = capsys.readouterr().err
    assert "resume_from_checkpoint: checkpoint-4 is step 4, but" in err and "holds checkpoint-8 past it" in err
    assert cli_main(["train", cfg, *older, "--overwrite_output_dir", "true"]) == 0
    assert json.loads((out / "trainer_state.json").read_text())["global_step"] == 8  # retrained 5..8
    capsys.readouterr()
    # a mistyped one: missing (it said "is not a directory"), with the checkpoints the directory holds
    assert cli_main(["check", cfg, "--resume_from_checkpoint", str(out / "checkpoint-80")]) == 2
    assert capsys.readouterr().err == (f"error: resume_from_checkpoint: {out / 'checkpoint-80'} does not exist; name a "
                                       f"checkpoint-N directory ({out} holds checkpoint-4, checkpoint-8)\n")


def test_a_training_run_takes_the_final_exports_mark_until_it_writes_its_own(corpus, tmp_path, monkeypatch):
    """all_results.json marks a complete final export (`run_end.exported`): an earlier run's, at the step a new run's
    checkpoint will also reach, made a re-run after a kill during the new export keep the old model."""
    from pretrain_cli.training import trainer as trainer_mod
    from pretrain_cli.training.run_end import exported

    cfg = write_config(tmp_path, corpus, max_steps=4, save_steps=4)
    assert cli_main(["train", cfg]) == 0
    out = tmp_path / "out"
    assert exported(out, 4)

    def killed(self, batches):
        raise KeyboardInterrupt

    monkeypatch.setattr(trainer_mod.Trainer, "train_step", killed)
    assert cli_main(["train", cfg, "--overwrite_output_dir", "true"]) == 130
    assert not (out / "all_results.json").exists() and not exported(out, 4)


def test_a_tracker_that_fails_to_start_changes_no_file(corpus, tmp_path, monkeypatch):
    """wandb not logged in fails at its start: the run had already rewritten args.json, metrics.jsonl and the other
    trackers' files. The trackers now start first, wandb first among them."""
    from pretrain_cli.errors import UserError
    from pretrain_cli.training import trackers_wandb

    cfg = write_config(tmp_path, corpus, max_steps=4, save_steps=4, report_to=["visualdl"])
    assert cli_main(["train", cfg]) == 0
    out = tmp_path / "out"
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}

    def not_logged_in(*args, **kwargs):
        raise UserError("report_to: wandb: not logged in; run `wandb login` or set WANDB_MODE=offline")

    monkeypatch.setattr(trackers_wandb, "Wandb", not_logged_in)
    assert cli_main(["train", cfg, "--max_steps", "6", "--report_to", "visualdl", "wandb"]) == 2
    after = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert after == before


def test_finishing_an_interrupted_export_records_its_last_evaluations_once(corpus, tmp_path):
    """Killed during its final export (after the last checkpoint and its evaluations), a run re-run to finish it
    evaluated again and appended eval and test records of that step a second time (metrics.jsonl, trainer_state)."""
    cfg = write_config(tmp_path, corpus, max_steps=4, save_steps=4, eval_steps=4, do_eval=True, do_predict=True)
    assert cli_main(["train", cfg]) == 0
    out = tmp_path / "out"
    (out / "all_results.json").unlink()  # as a kill during the export leaves it: not exported
    assert cli_main(["train", cfg]) == 0
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    final = ("eval", "test", "train_metrics")  # (train_metrics: the closing metrics, training/closing.py)
    at_end = [r["kind"] for r in records if r["step"] == 4 and r["kind"] in final]
    assert sorted(at_end) == sorted(final), at_end
    history = json.loads((out / "trainer_state.json").read_text())["log_history"]
    assert sorted(e["kind"] for e in history if e["step"] == 4 and e["kind"] in final) == sorted(final)
