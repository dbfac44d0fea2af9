"""Which checkpoint a run resumes (`find_resume`) and what it keeps from it: the schedule (`resume_schedule`), the
global batch (and the eval windows) when the number of processes changed, which decide what a step means and what
an eval loss averages; the loss weights the user does not set (`loss_weights`); a MoE router's bias at rate 0; and
the refusal of an older checkpoint beside another branch's later ones. `apply_resume` applies them to a prepared
run, with the notes on evaluation windows that repeat samples (`eval_windows.eval_repeats`), which those decisions
can change. What an eval averages (the windows kept, the repeats said) lives in `orchestration.eval_windows`."""
from __future__ import annotations

import copy
import re
from dataclasses import replace
from pathlib import Path

from pretrain_cli.config.parser import Arguments
from pretrain_cli.config.resolve import resolve
from pretrain_cli.counts import count
from pretrain_cli.errors import UserError
from pretrain_cli.orchestration.eval_windows import eval_repeats, keep_eval_windows
from pretrain_cli.run_config import RunConfig, Schedule, Target
from pretrain_cli.storage.checkpoint_dir import CheckpointDir


TRAIN_KEYS = ("per_device_train_batch_size", "gradient_accumulation_steps")  # what a step's global batch is made of
EVAL_KEYS = ("per_device_eval_batch_size", "eval_iters")  # and an evaluation's windows
# a resume's own note on a key it set (below), which records the value the user had set in a checkpoint written before
# args.json's `user_arguments`
_DERIVED = re.compile(r"\b(gradient_accumulation_steps|eval_iters) (\d+) -> \d+ keeps\b")


def _saved_batches(ckpt: CheckpointDir) -> dict | None:
    """The batch arithmetic a checkpoint was trained with (its args.json), and its batch keys as the user set them
    (`set`), or None where it does not say."""
    try:
        loop, par = ckpt.run("loop"), ckpt.run("parallel")
        ranks = int(par["dp_degree"]) * int(par["sharding_degree"])
        saved = {"micro": int(loop["micro_batch"]), "acc": int(loop["grad_accum"]), "ranks": ranks,
                 "eval_batch": int(loop["eval_batch"]), "eval_iters": int(loop["eval_iters"])}
    except (ValueError, TypeError, KeyError):
        return None
    user = (ckpt.args or {}).get("user_arguments")
    if isinstance(user, dict):
        return {**saved, "set": {k: user.get(k) for k in (*TRAIN_KEYS, *EVAL_KEYS)}}
    # written before `user_arguments`: the values it trained with, which a resume on another number of data ranks
    # set where its notes say so (else the file's: the next resume took them for the user's new choice)
    was = dict(zip((*TRAIN_KEYS, *EVAL_KEYS), (saved["micro"], saved["acc"], saved["eval_batch"], saved["eval_iters"])))
    for note in (ckpt.args or {}).get("notes") or ():
        if isinstance(note, str) and (derived := _DERIVED.search(note)):
            was[derived[1]] = int(derived[2])
    return {**saved, "set": was}


def _data_ranks(n: int) -> str:
    return count(n, "data rank")


def keep_global_batch(args: Arguments, run: RunConfig, model_cfg, target: Target, resume, splits=None) -> RunConfig:
    """A resumed run keeps the checkpoint's global batch (and its eval windows) unless the user changed a batch key
    from what they set for the checkpoint's run (`args`: as set; the checkpoint's args.json `user_arguments`): on
    another number of data ranks gradient accumulation (eval_iters) takes up the difference where it divides, with a
    note; where it does not, one line names the keys to set. Set to set, not to what a resume derived: re-run on the
    processes of a resume that derived the accumulation (a restart), the file's own value is no new choice, and the
    global batch stays. A run that changed the batch keys itself gets what it asked for, with a note. The eval
    windows are kept also past what the valid split of `splits` holds (the repeat said once,
    `eval_windows.eval_repeats`): a packed split's later passes are other windows of its documents, so fewer windows
    average other samples. Only where fewer keep the same average (`eval_windows._whole_passes`) eval_iters reads
    the split once; where no eval_iters keeps the windows, the note says the eval curve is not comparable across the
    resume (`eval_windows.keep_eval_windows`)."""
    resume = CheckpointDir.of(resume)  # (a path, or the one object `prepare` reads the checkpoint's files through)
    saved = _saved_batches(resume)
    if saved is None:
        return run
    lp, ranks = run.loop, run.parallel.data_world_size

    def changed(keys) -> bool:
        return any(args.get(k) != saved["set"][k] for k in keys)

    was = saved["micro"] * saved["acc"] * saved["ranks"]
    # in the words of the run's `batch:` line: micro-batch x acc x data ranks
    batch = f"{saved['micro']} x acc {saved['acc']} x {_data_ranks(saved['ranks'])}"
    how = (f"{resume.name} was trained on {batch} = {count(was, 'sequence')} a step" +
           (f"; this run has {_data_ranks(ranks)}" if saved["ranks"] != ranks else
            ", kept from a run on another number of data ranks with these batch keys"))
    notes = []
    if run.global_batch_size == was:
        pass
    elif changed(TRAIN_KEYS) and saved["ranks"] == ranks:  # what the user asked for, said once
        notes.append(f"batch: {resume.name} was trained on {count(was, 'sequence')} a step ({batch}); this run takes "
                     f"{run.global_batch_size} from here on")
    elif changed(TRAIN_KEYS):
        notes.append(f"batch: {how} and per_device_train_batch_size {lp.micro_batch} x gradient_accumulation_steps "
                     f"{lp.grad_accum}: {count(run.global_batch_size, 'sequence')} a step from here on")
    elif was % ranks:  # no batch keys make it here: the nearest global batches this many ranks make, named
        near = [n for n in (was // ranks, was // ranks + 1) if n]
        raise UserError(f"gradient_accumulation_steps: {how}, over which {was} sequences do not split evenly; resume "
                        f"on a number of data ranks that divides {was}, or take another global batch on purpose: "
                        f"per_device_train_batch_size x gradient_accumulation_steps = "
                        f"{' or '.join(str(n) for n in near)} makes {' or '.join(str(n * ranks) for n in near)} "
                        f"sequences a step here")
    elif was % (lp.micro_batch * ranks):
        raise UserError(f"gradient_accumulation_steps: {how}, which no accumulation of {lp.micro_batch}-sequence "
                        f"micro-batches makes; set per_device_train_batch_size and gradient_accumulation_steps so "
                        f"that their product x {ranks} = {was} (or another global batch, on purpose)")
    else:
        args.set("gradient_accumulation_steps", was // (lp.micro_batch * ranks))
        notes.append(f"batch: {how}: gradient_accumulation_steps {lp.grad_accum} -> "
                     f"{was // (lp.micro_batch * ranks)} keeps {count(was, 'sequence')} a step")
    eval_was = saved["eval_batch"] * saved["eval_iters"] * saved["ranks"]
    if run.loop.do_eval and lp.eval_batch * lp.eval_iters * ranks != eval_was and not changed(EVAL_KEYS):
        valid = splits.get("valid") if splits is not None else None
        notes += keep_eval_windows(args, lp, ranks, eval_was, valid, resume.name)
    new = resolve(args, model_cfg, target) if args.get("gradient_accumulation_steps") != lp.grad_accum or \
        args.get("eval_iters") != lp.eval_iters else run
    return replace(new, notes=(*run.notes, *notes))


def later_checkpoints(run: RunConfig, saved: CheckpointDir) -> None:
    """`resume_from_checkpoint` of an older checkpoint beside later ones in output_dir, without overwrite: those are
    another branch's, which a plain re-run would resume and among which rotation (by step) would remove this run's
    own saves: refused in one line."""
    if not run.output.resume_from or run.output.overwrite or not run.loop.do_train or not run.parallel.is_rank0:
        return  # (rank 0 judges the directory, as it verifies the checkpoint: the others take its verdict)
    from pretrain_cli.run_dir import checkpoints_past

    step = saved.state["global_step"]
    later = [p.name for p in checkpoints_past(run.output.output_dir, step)]
    if later:
        raise UserError(f"resume_from_checkpoint: {saved.name} is step {step}, but {run.output.output_dir} holds "
                        f"{', '.join(later)} past it (another run's, which a plain re-run would resume); set "
                        f"overwrite_output_dir: true to remove them, or choose another output_dir")


def keep_router_bias(run: RunConfig, model_cfg, saved: CheckpointDir) -> RunConfig:
    """A MoE checkpoint trained with the routing bias, resumed at `moe_router_bias_update_rate` 0: the bias is kept,
    frozen (a model built without it dropped it and routed otherwise), with a note."""
    if not model_cfg.expert_layers or run.moe.bias_update_rate != 0 or run.moe.routing_bias:
        return run
    from pretrain_cli.training.weight_source import holds_router_bias

    if not holds_router_bias(saved, "resume"):
        return run
    return replace(run, moe=replace(run.moe, routing_bias=True), notes=(
        *run.notes, f"moe_router_bias_update_rate: 0 freezes {saved.name}'s e_score_correction_bias (kept, and the "
                    f"routing with it; no longer updated)"))


def find_resume(run: RunConfig) -> Path | None:
    """`resume_from_checkpoint` (refused when `storage.intact` finds it incomplete or damaged), else the newest
    complete `checkpoint-N` of a training run (unless overwritten). Rank 0 verifies; the other ranks of a launch
    choose none here and take rank 0's choice once joined (`training.same_run.resume`): the newest checkpoint
    unverified can be a damaged one rank 0 skips, and what they kept from it (the global batch on another number
    of data ranks, the schedule) was not rank 0's, its damage (a missing config.json) stopped them alone."""
    out = run.output
    from pretrain_cli.run_dir import list_checkpoints
    from pretrain_cli.storage import intact

    if out.resume_from:
        path = Path(out.resume_from)
        if not path.is_dir():  # a mistyped checkpoint-N: said so, with the ones its directory holds
            saved = [p.name for _, p in list_checkpoints(path.parent)]
            raise UserError(f"resume_from_checkpoint: {intact.problem(path)}; name a checkpoint-N directory"
                            + (f" ({path.parent} holds {', '.join(saved)})" if saved else ""))
        if foreign := intact.paddlenlp_checkpoint(path):
            raise UserError(f"resume_from_checkpoint: {foreign}")
        reason = intact.problem(path) if run.parallel.is_rank0 else None  # the others take rank 0's choice
        if reason is not None:
            raise UserError(f"resume_from_checkpoint: {reason}; name a complete checkpoint-N, or remove the key to "
                            f"resume from the newest complete one")
        return path
    if out.overwrite and run.loop.do_train:  # it removes the checkpoints past its start: never PaddleNLP's
        for _, ckpt in list_checkpoints(out.output_dir):
            if intact.paddlenlp_checkpoint(ckpt):
                raise UserError(f"output_dir: {ckpt} is a checkpoint of PaddleNLP's Trainer, which "
                                f"overwrite_output_dir would remove as an earlier run's (PaddleNLP's only stops its "
                                f"resume); choose another output_dir, or move it out of {out.output_dir}")
    if out.overwrite or not run.loop.do_train or not run.parallel.is_rank0:
        return None
    # a damaged one is skipped, with a warning; rank 0 checks presence and sizes here, every rank the checksums of
    # the files it reads (`training.weight_source.verify_read`)
    return intact.newest(out.output_dir, checksums=False)


def _saved(ckpt: CheckpointDir) -> tuple[Schedule | None, int | None]:
    """(the schedule the checkpoint was trained on, its step); None where its files do not say."""
    try:
        saved = Schedule(**ckpt.run("schedule"))
    except (ValueError, TypeError):
        saved = None
    try:
        step = ckpt.state["global_step"]
    except UserError:
        step = None
    return saved, step


def resume_schedule(run: RunConfig, resume, choice: str) -> RunConfig:
    """The schedule a resumed run continues on, with a note naming the old and the new one when they differ.

    PaddleNLP rebuilds its scheduler from the new arguments and only restores the step, so raising max_steps
    silently re-stretches the decay (a cosine run at its minimum rate at step 100 climbs back up when continued
    to 150). `lr_schedule_on_resume` chooses: stretch (that), keep (the saved schedule goes on), restart."""
    resume = CheckpointDir.of(resume)  # (a path, or the one object `prepare` reads the checkpoint's files through)
    saved, step = _saved(resume)
    new = run.schedule
    if saved is None or step is None or saved == new or step >= run.loop.max_steps:
        return run
    if choice == "keep":
        new = saved
    elif choice == "restart":
        new = replace(new, start_step=step, decay_steps=max(new.decay_steps - step, new.warmup_steps, 1),
                      decay_start=max(new.decay_start - step, new.warmup_steps))
    # stretch: a lower max_steps ends the decay sooner, a higher one later (warmup_stable_decay: a higher one ends its
    # stable phase later, the decay as long as num_decay_steps or its default share of max_steps), the same one
    # changes only the rates
    wsd = new.kind == saved.kind == "warmup_stable_decay" and new.decay_start != saved.decay_start
    how = (f"stable phase {'lengthened' if new.decay_start > saved.decay_start else 'shortened'}" if wsd else
           "stretched" if new.decay_steps > saved.decay_steps else "shortened" if new.decay_steps < saved.decay_steps
           else "changed")
    what = {"stretch": f"{how} to this run's", "keep": "kept", "restart": "restarted"}[choice]
    others = " or ".join(c for c in ("stretch", "keep", "restart") if c != choice)
    # keep: this run's own schedule settings are not applied, which its arguments alone do not tell
    mine = run.schedule
    decays = not mine.kind.startswith("constant")  # (a constant schedule has no decay to end)
    dropped = [f"{key} {a:g}" if isinstance(a, float) else f"{key} {a}" for key, a, b in (
        ("lr_scheduler_type", mine.kind, saved.kind), ("learning_rate", mine.max_lr, saved.max_lr),
        ("min_learning_rate", mine.min_lr, saved.min_lr), ("warmup_steps", mine.warmup_steps, saved.warmup_steps),
        ("decay end step", mine.decay_steps if decays else None, saved.decay_steps if decays else None),
        ("stable phase end step", mine.decay_start, saved.decay_start)) if a != b]
    dropped = (f"; this run's {', '.join(dropped)} not applied (the saved schedule goes on)"
               if choice == "keep" and dropped else "")
    note = (f"schedule: {resume.name} was trained on {saved.describe()}; {what}: {new.describe()} (LR at step "
            f"{step + 1}: {saved.lr_at(step + 1):.3g} saved -> {new.lr_at(step + 1):.3g}){dropped}; "
            f"lr_schedule_on_resume: {others} to change that")
    return replace(run, schedule=new, notes=(*run.notes, note))


# the optimizer's settings a resume may change, as the run resolves them and as the user names them
_OPTIMIZER_KEYS = (("weight_decay", "weight_decay"), ("max_grad_norm", "max_grad_norm"), ("beta1", "adam_beta1"),
                   ("beta2", "adam_beta2"), ("epsilon", "adam_epsilon"))


def optimizer_changes(run: RunConfig, resume) -> RunConfig:
    """A resume whose optimizer settings differ from the checkpoint's run (its args.json): allowed, but named in one
    note, since they act from the first step resumed (the moments restored were accumulated under the old ones)."""
    resume = CheckpointDir.of(resume)
    changed = []
    for field, key in _OPTIMIZER_KEYS:
        was, now = resume.run("optimizer", field), getattr(run.optimizer, field)
        if isinstance(was, (int, float)) and float(was) != float(now):
            changed.append(f"{key} {was:g} -> {now:g}")
    if not changed:
        return run
    return replace(run, notes=(*run.notes, f"optimizer: {', '.join(changed)} from {resume.name}'s run, in effect from "
                                           f"the first step resumed"))


# the loss weights a resume keeps from its checkpoint's run unless the user sets them, as the run resolves them and as
# the user names them: each can come from the model's config.json (num_nextn_predict_lambda, router_aux_loss_coef,
# aux_loss_alpha) or our default, which an edited file or a newer version reads otherwise than the checkpoint's run did
_LOSS_WEIGHTS = (("mtp_loss_weight", "mtp_loss_weight"), ("aux_loss_coef", "router_aux_loss_coef"),
                 ("z_loss_coef", "router_z_loss_coef"))


def loss_weights(args: Arguments, run: RunConfig, model_cfg, resume) -> RunConfig:
    """A resume keeps the loss weights its checkpoint's run trained with (its args.json's `run.moe`) unless the
    user's file or command line sets them: a run resumed after config.json's `num_nextn_predict_lambda` came to be
    read (1.0) had trained at 0.3, and its loss jumped unsaid. One note names what was kept, and what the user's
    setting changed (in effect from the first step resumed, as `optimizer_changes` says its own)."""
    resume = CheckpointDir.of(resume)
    moe_model = bool(model_cfg is not None and model_cfg.expert_layers)
    mtp = bool(model_cfg is not None and model_cfg.num_nextn_predict_layers)
    kept, changed, moe = [], [], {}
    for field, key in _LOSS_WEIGHTS:
        if not (mtp if field == "mtp_loss_weight" else moe_model):  # (a weight of no loss this model has)
            continue
        was, now = resume.run("moe", field), getattr(run.moe, field)
        if isinstance(was, bool) or not isinstance(was, (int, float)) or now is None or float(was) == float(now):
            continue
        if key in args.explicit:
            changed.append(f"{key} {was:g} -> {now:g} as set, in effect from the first step resumed")
        else:
            moe[field] = float(was)
            kept.append(f"{key} {was:g} kept (this run would take {now:g}; set {key} to change it)")
    if not kept and not changed:
        return run
    return replace(run, moe=replace(run.moe, **moe), notes=(
        *run.notes, f"loss weights: {resume.name}'s run trained with other ones: {'; '.join(kept + changed)}"))


def resume_progress(saved: CheckpointDir | None) -> tuple | None:
    """(global_step, consumed_samples) of the checkpoint a run resumes, None for a run that starts afresh."""
    return None if saved is None else (int(saved.state["global_step"]), int(saved.state.get("consumed_samples", 0)))


def apply_resume(spec, saved: CheckpointDir | None) -> tuple[Arguments, RunConfig]:
    """(arguments, run) of `spec` (`run_spec.RunSpec`) as it resumes from `saved` (None: as it starts): what it keeps
    from the checkpoint
    (the keys it sets recorded in the arguments), then the notes on its evaluation windows, which those decisions
    can change."""
    args, run, target = spec.unresumed
    args = copy.deepcopy(args)
    if saved is not None and run.loop.do_train:
        run = keep_global_batch(args, run, spec.model_cfg, target, saved, spec.splits)
        run = resume_schedule(run, saved, args.training.lr_schedule_on_resume)
        run = optimizer_changes(run, saved)
        run = loss_weights(args, run, spec.model_cfg, saved)
        run = keep_router_bias(run, spec.model_cfg, saved)
    if spec.splits is not None:
        run = replace(run, notes=(*run.notes, *eval_repeats(run, spec.splits)))
    return args, run
