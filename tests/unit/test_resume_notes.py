"""What a resume changes that its arguments alone do not show, said in a note: another peak learning rate (the
schedule phrase names it), the rates `lr_schedule_on_resume: keep` does not apply, a shorter decay, the optimizer's
settings, and eval windows the valid split cannot hold; a run from a trained directory that does not load it."""
import json

from run_helpers import BASE, model_config, resolve_run

from pretrain_cli.run_config import Schedule

SCHED = ["--lr_scheduler_type", "cosine", "--warmup_steps", "20", "--learning_rate", "0.003",
         "--min_learning_rate", "0.0003"]


def _checkpoint(tmp_path, run, step: int):
    ckpt = tmp_path / f"checkpoint-{step}"
    ckpt.mkdir()
    (ckpt / "args.json").write_text(json.dumps({"run": run.to_dict()}))
    (ckpt / "trainer_state.json").write_text(json.dumps({"global_step": step, "consumed_samples": 8 * step}))
    return ckpt


def test_every_schedule_phrase_names_its_peak_rate():
    """Two schedules differing only in learning_rate read the same: the resume note said 'cosine, warmup 20, decay
    to 0.0003 by step 200' on both sides of a --learning_rate 0.001 resume."""
    assert Schedule("cosine", 3e-3, 3e-4, 20, 200).describe() == \
        "cosine, warmup 20, peak 0.003, decay to 0.0003 by step 200"
    assert Schedule("cosine", 1e-3, 3e-4, 20, 200).describe() != Schedule("cosine", 3e-3, 3e-4, 20, 200).describe()
    assert Schedule("linear", 1e-3, 0.0, 0, 50).describe() == "linear, warmup 0, peak 0.001, decay to 0 by step 50"
    wsd = Schedule("warmup_stable_decay", 2e-3, 2e-4, 10, 100, decay_start=80).describe()
    assert wsd == "warmup_stable_decay, warmup 10, peak 0.002, stable to step 80, cosine decay to 0.0002 by step 100"


def test_a_new_learning_rate_on_resume_is_named_whichever_the_choice(tmp_path):
    from pretrain_cli.orchestration.resumed import resume_schedule

    ckpt = _checkpoint(tmp_path, resolve_run(*SCHED, "--max_steps", "200"), 124)
    lower = resolve_run(*SCHED, "--max_steps", "200", "--learning_rate", "0.001")
    [note] = [n for n in resume_schedule(lower, ckpt, "stretch").notes if n.startswith("schedule:")]
    # the same max_steps: neither stretched nor shortened, the rates changed
    assert "trained on cosine, warmup 20, peak 0.003, decay to 0.0003 by step 200; changed to this run's: cosine, " \
           "warmup 20, peak 0.001, decay to 0.0003 by step 200 (LR at step 125: " in note, note
    kept = resume_schedule(lower, ckpt, "keep")
    assert kept.schedule.max_lr == 0.003  # keep: the saved schedule, this run's learning_rate dropped, and said
    [note] = [n for n in kept.notes if n.startswith("schedule:")]
    assert "; kept: cosine, warmup 20, peak 0.003," in note
    assert "this run's learning_rate 0.001 not applied (the saved schedule's rates go on)" in note
    shorter = resolve_run(*SCHED, "--max_steps", "150")
    [note] = [n for n in resume_schedule(shorter, ckpt, "stretch").notes if n.startswith("schedule:")]
    assert "shortened to this run's: cosine, warmup 20, peak 0.003, decay to 0.0003 by step 150" in note
    longer = resolve_run(*SCHED, "--max_steps", "300")
    [note] = [n for n in resume_schedule(longer, ckpt, "stretch").notes if n.startswith("schedule:")]
    assert "stretched to this run's" in note and "not applied" not in note


def test_optimizer_settings_changed_on_resume_are_named_old_to_new(tmp_path):
    from pretrain_cli.orchestration.resumed import optimizer_changes

    ckpt = _checkpoint(tmp_path, resolve_run("--weight_decay", "0.01", "--max_grad_norm", "1.0"), 5)
    same = resolve_run("--weight_decay", "0.01", "--max_grad_norm", "1.0")
    assert optimizer_changes(same, ckpt) is same
    run = optimizer_changes(resolve_run("--weight_decay", "0.1", "--max_grad_norm", "0.5", "--adam_beta2", "0.95",
                                        "--adam_epsilon", "1e-6"), ckpt)
    assert run.notes[-1] == ("optimizer: weight_decay 0.01 -> 0.1, max_grad_norm 1 -> 0.5, adam_beta2 0.999 -> 0.95, "
                             "adam_epsilon 1e-08 -> 1e-06 from checkpoint-5's run, in effect from the first step "
                             "resumed")


class _Splits:
    def __init__(self, valid: int):
        self.valid = list(range(valid))

    def get(self, name):
        return self.valid if name == "valid" else None


def test_kept_eval_windows_stop_at_what_the_valid_split_holds(tmp_path):
    """2 ranks x 4 x eval_iters 3 = 24 windows resumed on 1 rank doubled eval_iters to 6 (24 windows) over a valid
    split of 12 samples, then a second note said the split is too small: the windows the split holds, said once."""
    from pretrain_cli.config.parser import parse_config
    from pretrain_cli.config.resolve import resolve
    from pretrain_cli.orchestration.prepare import eval_repeats
    from pretrain_cli.orchestration.resumed import keep_global_batch
    from pretrain_cli.run_config import Target

    cfg = model_config()
    common = ["--per_device_train_batch_size", "4", "--per_device_eval_batch_size", "4", "--do_eval", "true",
              "--eval_iters", "3"]
    ckpt = _checkpoint(tmp_path, resolve_run(*common, world=2), 5)
    args = parse_config(None, [*BASE, *common])
    run = keep_global_batch(args, resolve(args, cfg, Target("cpu", 1)), cfg, Target("cpu", 1), ckpt, _Splits(12))
    assert run.loop.eval_iters == 3  # 12 windows: the split, each sample once
    said = [n for n in (*run.notes, *eval_repeats(run, _Splits(12)))
            if n.startswith("eval:") and not n.startswith("eval: eval_steps")]
    assert said == ["eval: checkpoint-5's run evaluated 24 windows, more than the valid split's 12 samples (some read "
                    "more than once); eval_iters 3 reads 12 windows here"]
    args = parse_config(None, [*BASE, *common])  # a split that holds them all: doubled, as before
    run = keep_global_batch(args, resolve(args, cfg, Target("cpu", 1)), cfg, Target("cpu", 1), ckpt, _Splits(100))
    assert run.loop.eval_iters == 6 and any("eval_iters 3 -> 6 keeps the 24 eval windows" in n for n in run.notes)


def test_a_trained_directory_without_continue_training_says_its_weights_are_not_loaded(tmp_path):
    """PaddleNLP's meaning is kept (model_name_or_path alone gives config.json), and said: the model line's 'random
    init' alone read as a mistake or went unseen."""
    import shutil

    from pretrain_cli.config.presets import resolve_model_dir
    from pretrain_cli.orchestration.prepare import prepare
    from pretrain_cli.run_config import Target
    from data_helpers import write_tokens

    trained = tmp_path / "trained"
    trained.mkdir()
    shutil.copy(resolve_model_dir("micro-qwen2") / "config.json", trained / "config.json")
    (trained / "model.safetensors").write_bytes(b"")  # (not read: the note is about the file being there)
    spec = prepare(None, ["--model_name_or_path", str(trained), "--input_dir", write_tokens(tmp_path / "docs"),
                          "--output_dir", str(tmp_path / "out"), "--do_train", "--max_steps", "2", "--device", "cpu",
                          "--continue_training", "0"], Target("cpu", 1))
    assert any(n == f"model_name_or_path: {trained} holds weights, which this run does not load (it takes the "
                    f"directory's config.json alone, from a random init); continue_training: 1 loads them"
               for n in spec.run.notes), spec.run.notes
