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
    assert "this run's learning_rate 0.001 not applied (the saved schedule goes on)" in note
    shorter = resolve_run(*SCHED, "--max_steps", "150")
    [note] = [n for n in resume_schedule(shorter, ckpt, "stretch").notes if n.startswith("schedule:")]
    assert "shortened to this run's: cosine, warmup 20, peak 0.003, decay to 0.0003 by step 150" in note
    longer = resolve_run(*SCHED, "--max_steps", "300")
    [note] = [n for n in resume_schedule(longer, ckpt, "stretch").notes if n.startswith("schedule:")]
    assert "stretched to this run's" in note and "not applied" not in note


def test_keep_names_every_setting_it_does_not_apply_and_wsd_says_its_stable_phase(tmp_path):
    """Under keep, another lr_scheduler_type, warmup_steps or decay end went unsaid (only the rates were named); a
    warmup_stable_decay resumed at a higher max_steps lengthens its stable phase, which 'stretched' did not say."""
    from pretrain_cli.orchestration.resumed import resume_schedule

    ckpt = _checkpoint(tmp_path, resolve_run(*SCHED, "--max_steps", "200"), 124)
    other = resolve_run("--lr_scheduler_type", "linear", "--warmup_steps", "10", "--learning_rate", "0.003",
                        "--min_learning_rate", "0.0003", "--max_steps", "300")
    [note] = [n for n in resume_schedule(other, ckpt, "keep").notes if n.startswith("schedule:")]
    assert ("this run's lr_scheduler_type linear, warmup_steps 10, decay end step 300 not applied (the saved "
            "schedule goes on)") in note, note
    wsd = ["--lr_scheduler_type", "warmup_stable_decay", "--warmup_steps", "10", "--learning_rate", "0.002",
           "--min_learning_rate", "0.0002", "--num_decay_steps", "20"]
    (tmp_path / "w").mkdir()
    ckpt = _checkpoint(tmp_path / "w", resolve_run(*wsd, "--max_steps", "100"), 50)
    [note] = [n for n in resume_schedule(resolve_run(*wsd, "--max_steps", "200"), ckpt, "stretch").notes
              if n.startswith("schedule:")]
    assert ("; stable phase lengthened to this run's: warmup_stable_decay, warmup 10, peak 0.002, stable to step "
            "180, cosine decay to 0.0002 by step 200 (") in note, note


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
    def __init__(self, valid):
        self.valid = valid

    def get(self, name):
        return self.valid if name == "valid" else None


class _Padded(list):
    mode = "padded"


def _resumed_on_one_rank(tmp_path, splits, eval_iters="3", valid_rows=()):
    """2 ranks x 4 x eval_iters 3 = 24 eval windows, resumed on 1 rank over `splits`: (run, its eval notes)."""
    from pretrain_cli.config.parser import parse_config
    from pretrain_cli.config.resolve import resolve
    from pretrain_cli.orchestration.eval_windows import eval_repeats
    from pretrain_cli.orchestration.resumed import keep_global_batch
    from pretrain_cli.run_config import Target

    cfg = model_config()
    common = ["--per_device_train_batch_size", "4", "--per_device_eval_batch_size", "4", "--do_eval", "true",
              "--eval_iters", eval_iters]
    if not (tmp_path / "checkpoint-5").exists():
        _checkpoint(tmp_path, resolve_run(*common, world=2), 5)
    args = parse_config(None, [*BASE, *common])
    run = keep_global_batch(args, resolve(args, cfg, Target("cpu", 1)), cfg, Target("cpu", 1),
                            tmp_path / "checkpoint-5", _Splits(splits))
    said = [n for n in (*run.notes, *eval_repeats(run, _Splits(splits)))
            if n.startswith("eval:") and not n.startswith("eval: eval_steps")]
    return run, said


def test_eval_windows_past_the_valid_split_are_kept_unless_fewer_keep_the_same_average(tmp_path):
    """24 windows over a 12-window packed split were cut to 12: a packed split read past its length is packed anew
    (other windows of its documents), so the 12 averaged other samples than the checkpoint's run's 24. Kept, with
    the one repeat note; only whole passes of a padded split (the same documents again) are read once."""
    from pretrain_cli.data.samples import PaddedDataset, PackedDataset

    assert PaddedDataset.mode == "padded" and PackedDataset.mode == "packed"  # what `_whole_passes` reads
    run, said = _resumed_on_one_rank(tmp_path, list(range(12)))
    assert run.loop.eval_iters == 6, said
    assert said == ["eval: eval_iters 3 -> 6 keeps the 24 eval windows of checkpoint-5's run",
                    "eval: the valid split holds 12 samples, fewer than eval_iters 6 x per_device_eval_batch_size 4 x "
                    "1 data rank = 24, so evaluation repeats samples; as the checkpoint's run did (its eval windows "
                    "are kept, above, so the curve goes on comparable)"]
    run, said = _resumed_on_one_rank(tmp_path, list(range(20)))  # 24 over 20: kept too (16 were 2 of 3 iterations)
    assert run.loop.eval_iters == 6 and said[0].endswith("keeps the 24 eval windows of checkpoint-5's run"), said
    run, said = _resumed_on_one_rank(tmp_path, _Padded(range(12)))  # twice the padded split: once is the same mean
    assert run.loop.eval_iters == 3, said
    assert said == ["eval: checkpoint-5's run evaluated 24 windows: the valid split's 12, 2 times over (padded "
                    "windows repeat whole); eval_iters 3 reads each once: the same average, so the eval curve goes on "
                    "comparable"]
    run, said = _resumed_on_one_rank(tmp_path, _Padded(range(20)))  # not whole passes: kept
    assert run.loop.eval_iters == 6 and "keeps the 24 eval windows" in said[0], said
    run, said = _resumed_on_one_rank(tmp_path, list(range(100)))  # a split that holds them all: doubled, as before
    assert run.loop.eval_iters == 6 and said == ["eval: eval_iters 3 -> 6 keeps the 24 eval windows of "
                                                 "checkpoint-5's run"]


def test_a_padded_split_read_past_its_length_reads_its_documents_again(tmp_path):
    """What `_whole_passes` rests on: a padded split's second pass holds each document once more (another order),
    a packed split's second pass other windows."""
    from data_helpers import write_tokens

    from pretrain_cli.data.indexed import open_token_file
    from pretrain_cli.data.samples import PackedDataset, PaddedDataset

    src = open_token_file(write_tokens(tmp_path / "docs", n_docs=6, doc_len=20))
    padded = PaddedDataset(src, 0, 6, 32, 1, "valid", bos=0, eos=1, pad=2)

    def rows(ds, lo, hi):
        return sorted(tuple(ds[i]["input_ids"].tolist()) for i in range(lo, hi))

    assert len(padded) == 6 and rows(padded, 0, 6) == rows(padded, 6, 12)
    packed = PackedDataset(src, 0, 6, 16, 1, "valid")
    assert rows(packed, 0, len(packed)) != rows(packed, len(packed), 2 * len(packed))


def test_no_eval_iters_that_keeps_the_windows_says_the_curve_is_not_comparable(tmp_path):
    """24 windows (2 ranks x 4 x eval_iters 3) resumed on 4 ranks: eval_iters reads 16 or 32, never 24."""
    from pretrain_cli.config.parser import parse_config
    from pretrain_cli.config.resolve import resolve
    from pretrain_cli.orchestration.resumed import keep_global_batch
    from pretrain_cli.run_config import Target

    common = ["--per_device_train_batch_size", "2", "--gradient_accumulation_steps", "2",
              "--per_device_eval_batch_size", "4", "--do_eval", "true", "--eval_iters", "3"]
    ckpt = _checkpoint(tmp_path, resolve_run(*common, world=2), 5)
    cfg, args = model_config(), parse_config(None, [*BASE, *common])
    run = keep_global_batch(args, resolve(args, cfg, Target("cpu", 4)), cfg, Target("cpu", 4), ckpt,
                            _Splits(list(range(100))))
    [note] = [n for n in run.notes if n.startswith("eval: checkpoint-5")]
    assert note == ("eval: checkpoint-5's run evaluated 24 windows; this one evaluates 48 (eval_iters x "
                    "per_device_eval_batch_size x 4 data ranks), which no eval_iters makes 24; "
                    "per_device_eval_batch_size 2 does (2 x eval_iters 3 x 4 data ranks = 24, the windows of "
                    "checkpoint-5's run): set it, or the eval curve is not comparable across the resume (its losses "
                    "average other windows)"), note


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
    assert any(n == f"model_name_or_path: {trained} holds weights, which this run does not load: it builds the "
                    f"model from config.json alone, at a random init; continue_training: 1 loads them"
               for n in spec.run.notes), spec.run.notes
