"""What a resume makes of the resolved run configuration and its checkpoint's: the global batch kept on another
number of data ranks (or the keys to set named), the learning-rate schedule stretched, kept or restarted, each
said in a note (the decisions themselves: test_run_config.py)."""
import pytest
from run_helpers import model_config, resolve_run

from pretrain_cli.errors import UserError


def _checkpoint_of(tmp_path, run):
    """A checkpoint directory whose args.json records `run` (all `keep_global_batch` reads)."""
    import json

    ckpt = tmp_path / "checkpoint-5"
    ckpt.mkdir()
    (ckpt / "args.json").write_text(json.dumps({"run": run.to_dict()}))
    return ckpt


def test_resume_on_fewer_data_ranks_keeps_the_global_batch_or_says_which_keys(tmp_path):
    """2 ranks x 4 sequences resumed on 1 rank: accumulation 2 keeps 8 a step (and eval_iters doubles to keep
    the eval windows), with notes; a batch no accumulation makes is one line naming the keys."""
    from run_helpers import BASE

    from pretrain_cli.config.parser import parse_config
    from pretrain_cli.orchestration.resumed import keep_global_batch
    from pretrain_cli.config.resolve import resolve
    from pretrain_cli.run_config import Target

    cfg = model_config()
    common = ["--per_device_train_batch_size", "4", "--do_eval", "true", "--eval_iters", "3"]
    ckpt = _checkpoint_of(tmp_path, resolve_run(*common, world=2))
    args = parse_config(None, [*BASE, *common])
    run = keep_global_batch(args, resolve(args, cfg, Target("cpu", 1)), cfg, Target("cpu", 1), ckpt)
    assert (run.loop.grad_accum, run.global_batch_size, run.loop.eval_iters) == (2, 8, 6)
    assert any("gradient_accumulation_steps 1 -> 2 keeps 8 sequences a step" in n for n in run.notes), run.notes
    assert any("eval_iters 3 -> 6 keeps the" in n for n in run.notes)
    # the same run resumed on 2 ranks again: nothing changes, nothing is said
    same = resolve_run(*common, world=2)
    assert keep_global_batch(parse_config(None, [*BASE, *common]), same, cfg, Target("cpu", 2), ckpt) == same
    # on the same 2 ranks with another micro-batch: the global batch changes, said once (it was silent)
    args = parse_config(None, [*BASE, *common, "--per_device_train_batch_size", "2"])
    run = keep_global_batch(args, resolve(args, cfg, Target("cpu", 2)), cfg, Target("cpu", 2), ckpt)
    assert [n for n in run.notes if n.startswith("batch:")] == [
        "batch: checkpoint-5 was trained on 8 sequences a step (4 x acc 1 x 2 data ranks); this run takes 4 "
        "from here on"]
    # the user changed the batch keys: their choice, named
    args = parse_config(None, [*BASE, *common, "--per_device_train_batch_size", "2"])
    run = keep_global_batch(args, resolve(args, cfg, Target("cpu", 1)), cfg, Target("cpu", 1), ckpt)
    assert run.global_batch_size == 2 and any("2 sequences a step from here on" in n for n in run.notes)
    # 2 ranks x 3 = 6 sequences on 3 ranks of 3: no accumulation makes 6, a micro-batch of 2 would
    odd = tmp_path / "odd"
    odd.mkdir()
    ckpt = _checkpoint_of(odd, resolve_run("--per_device_train_batch_size", "3", world=2))
    args = parse_config(None, [*BASE, "--per_device_train_batch_size", "3"])
    # in the batch: line's words and order (it said "2 data rank(s) x 3 x acc 1")
    with pytest.raises(UserError, match=r"gradient_accumulation_steps: checkpoint-5 was trained on 3 x acc 1 x 2 data "
                                        r"ranks = 6 sequences a step; this run has 3 data ranks, .* set "
                                        r"per_device_train_batch_size and "
                                        r"gradient_accumulation_steps so that their product x 3 = 6"):
        keep_global_batch(args, resolve(args, cfg, Target("cpu", 3)), cfg, Target("cpu", 3), ckpt)
    # on 4 ranks no batch keys make 6 (it asked for a product x 4 = 6): the nearest batches 4 ranks make, named
    with pytest.raises(UserError) as e:
        keep_global_batch(args, resolve(args, cfg, Target("cpu", 4)), cfg, Target("cpu", 4), ckpt)
    assert str(e.value).endswith("this run has 4 data ranks, over which 6 sequences do not split evenly; resume on a "
                                 "number of data ranks that divides 6, or take another global batch on purpose: "
                                 "per_device_train_batch_size x gradient_accumulation_steps = 1 or 2 makes 4 or 8 "
                                 "sequences a step here")


def test_a_resumed_schedule_stretches_keeps_or_restarts_and_says_which(tmp_path):
    import json
    from dataclasses import asdict

    from pretrain_cli.orchestration.resumed import resume_schedule

    sched = ["--lr_scheduler_type", "cosine", "--warmup_steps", "10", "--learning_rate", "3e-4",
             "--min_learning_rate", "3e-5"]
    old = resolve_run(*sched, "--max_steps", "100")
    ckpt = tmp_path / "checkpoint-100"
    ckpt.mkdir()
    (ckpt / "args.json").write_text(json.dumps({"run": {"schedule": asdict(old.schedule)}}))
    (ckpt / "trainer_state.json").write_text(json.dumps({"global_step": 100, "consumed_samples": 800}))
    new = resolve_run(*sched, "--max_steps", "150")
    stretched = resume_schedule(new, ckpt, "stretch")
    assert stretched.schedule == new.schedule and stretched.schedule.lr_at(101) > 3 * old.schedule.lr_at(100)
    [note] = [n for n in stretched.notes if n.startswith("schedule:")]
    assert "trained on cosine, warmup 10, peak 0.0003, decay to 3e-05 by step 100; stretched to this run's: cosine, " \
           "warmup 10, peak 0.0003, decay to 3e-05 by step 150" in note and "lr_schedule_on_resume: keep or restart" in note
    kept = resume_schedule(new, ckpt, "keep").schedule
    assert kept == old.schedule and kept.lr_at(120) == pytest.approx(3e-5)
    restarted = resume_schedule(new, ckpt, "restart").schedule
    assert restarted.lr_at(101) == pytest.approx(3e-4 / 10) and restarted.lr_at(110) == pytest.approx(3e-4)
    assert restarted.lr_at(150) == pytest.approx(3e-5) and restarted.describe().endswith("by step 150")
    assert resume_schedule(old, ckpt, "stretch") is old  # the same schedule: nothing to say


def test_mismatch_names_what_differs_and_check_compatible_refuses_with_it(tmp_path):
    """`mismatch` is the one reading of the checkpoint against the run: its reason is what `train` refuses with
    (`check_compatible`, then the fix) and what `plan --fit -o` says when its fitted file starts over."""
    import dataclasses
    import json
    import shutil

    from pretrain_cli.config.presets import resolve_model_dir
    from pretrain_cli.training.resume_checks import check_compatible, mismatch

    cfg = model_config()
    ckpt = tmp_path / "checkpoint-5"
    ckpt.mkdir()
    shutil.copy(resolve_model_dir("micro-qwen2") / "config.json", ckpt / "config.json")
    (ckpt / "args.json").write_text(json.dumps({"arguments": {"max_seq_length": 128}}))
    assert mismatch(ckpt, cfg, 128) is None
    check_compatible(ckpt, cfg, 128)  # compatible: no refusal
    wider = dataclasses.replace(cfg, hidden_size=cfg.hidden_size * 2)
    reason = f"checkpoint has hidden_size={cfg.hidden_size} but this run's model has hidden_size={wider.hidden_size}"
    assert mismatch(ckpt, wider, 128) == reason
    with pytest.raises(UserError) as e:
        check_compatible(ckpt, wider, 128)
    assert str(e.value) == (f"{ckpt}: {reason}; resume with the same model, or set overwrite_output_dir: true to "
                            f"start over")
    reason = "checkpoint was trained with max_seq_length=128, this run asks for 256"
    assert mismatch(ckpt, cfg, 256) == reason
    with pytest.raises(UserError) as e:
        check_compatible(ckpt, cfg, 256, named=True)
    assert str(e.value) == (f"{ckpt}: {reason}; resume with the same max_seq_length, or resume_from_checkpoint "
                            f"another checkpoint of this model, or drop resume_from_checkpoint to start over")
    (ckpt / "config.json").unlink()
    with pytest.raises(UserError):  # no config.json: the reader's own error, not a reason
        mismatch(ckpt, cfg, 128)
