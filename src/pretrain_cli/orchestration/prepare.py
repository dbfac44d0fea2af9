"""Everything decided before Paddle is imported: arguments, run configuration, model, tokenizer, data, resume
(what the run names, opened and checked: `opened`; which checkpoint and what it keeps: `resumed`; where the run
executes: `targets`; the prepared run and what it says of itself: `run_spec`).

`check` runs exactly this and stops; `train` runs it and hands the `RunSpec` to `training.run`,
so bad input fails in well under a second and both commands validate the same things. Independent
checks (the model config, the tokenizer, the token files) all run, and every problem they find is
reported at once.
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from pretrain_cli.storage.checkpoint_dir import CheckpointDir
from pretrain_cli.config.parser import Arguments, parse_config
from pretrain_cli.config.resolve import resolve
from pretrain_cli.run_config import Target
from pretrain_cli.errors import Problems
from pretrain_cli.orchestration.resumed import apply_resume, resume_progress
from pretrain_cli.orchestration.opened import (beside_the_file, build_model_config, check_output_dir, foreign_model,
                                               open_splits, open_token_files, open_tokenizer, placeholder_config,
                                               tokenizer_ids, unused_vocab)
from pretrain_cli.orchestration.run_spec import RunSpec
from pretrain_cli.training import trackers
from pretrain_cli.training.tokenizer_lineage import continued_tokenizer


def load_arguments(config: str | None, overrides: list[str] | None, record: str = "user_arguments") -> Arguments:
    """The file (.json/.yaml/.yml; of a run's args.json its `record`: `parser.arguments_of`) with the command line's."""
    return parse_config(config, overrides, record)


def prepare(config: str | None, overrides: list[str] | None, target: Target, changes: dict | None = None,
            record: str = "user_arguments", lock: bool | str = False, command: str | None = None) -> RunSpec:
    """Parse, resolve and validate a run for `target`; every problem found is raised together. `changes` ({key:
    value}): what the command itself decides (`eval`: one split, no training), over the file and the `--key value`
    overrides, type-checked, never made text. `record`: `load_arguments`' (`eval`, `inspect-data`: `arguments`).
    `lock` (`train`, `check`): a training run's rank 0 judges output_dir's run lock before it reads a checkpoint there:
    a live run's are not this run's to resume (its batch was blamed for the live run's checkpoint); "describe"
    (`check`): that refusal alone is left in `RunSpec.held`, said after the run's description. `command` (`eval`):
    its verdict on the precision, not train's (`recorded.precision_verdict`: a run's recorded bf16 on a T4 runs)."""
    from pretrain_cli.config.keys import KEYS, coerce

    args = load_arguments(config, overrides, record)
    for key, value in (changes or {}).items():
        args.set(key, coerce(KEYS[key], value, "command line"))
        args.explicit[key] = "command line"
    problems = Problems()
    built = problems.run(build_model_config, args)
    # without the model's shape, a placeholder that passes every check still finds the argument problems
    judge = None
    if command is not None:
        from pretrain_cli.orchestration.recorded import split_judge

        judge = split_judge(config, overrides, record, args, command)
    run = problems.run(resolve, args, built[1] if built else placeholder_config(), target, judge)
    # a run on this CPU (a GPU file checked here is checked as the GPU run it is): its parameters alone, then the
    # whole plan against what this host has available for its processes (`host_fit`: a note when close)
    if built is not None and run is not None and run.device == "cpu" and not target.planned:
        from pretrain_cli.orchestration import host_fit
        from pretrain_cli.planning.hardware import training_memory_problem

        problem = training_memory_problem(run, built[1])
        if not problem:
            problem, note = host_fit.check(run, built[1], args.config_path, host_fit.processes_here(target.world_size))
            run = replace(run, notes=(*run.notes, note)) if note else run
        if problem:
            problems.add(problem + host_fit.gpu_question(args))
    if built is None or run is None:  # the tokenizer and token files do not depend on what failed: check them too
        problems.run(open_tokenizer, args, built[1] if built else None)
        if args.data.input_dir is not None:
            problems.run(open_token_files, args.data.input_dir)
        if args.training.output_dir:
            problems.run(check_output_dir, str(args.training.output_dir))
        _elsewhere(problems, args)
        problems.raise_if_any()
    model_dir, model_cfg = built
    for message in trackers.missing(run.output.report_to):
        problems.add(message)
    spec = RunSpec(args, run, model_dir, model_cfg)
    if run.model.continue_training:
        from pretrain_cli.config.presets import require_pretrained
        from pretrain_cli.models.convert import readable_weights

        if problems.run(require_pretrained, args.model.model_name_or_path, model_dir,
                        source=args.explicit.get("continue_training")):
            problems.run(readable_weights, model_dir)  # names the directory when there are no weights
    tok = problems.run(open_tokenizer, args, model_cfg)
    if tok is not None:
        spec.tokenizer_dir, spec.tokenizer = tok
        from pretrain_cli.data.tokenizer_ids import transformers_mismatch

        if spec.tokenizer is not None and (mismatch := transformers_mismatch(spec.tokenizer, model_cfg.model_type)):
            spec.run = run = replace(run, notes=(*run.notes, mismatch))
        if spec.tokenizer is not None:
            spec.model_cfg, id_notes = tokenizer_ids(model_cfg, spec.tokenizer)
            spec.run = run = replace(run, notes=(*run.notes, *id_notes, *unused_vocab(args, model_cfg, spec.tokenizer)))
    if not (run.data.sample_mode == "padded" and spec.tokenizer is None):  # (reported above)
        spec.splits = problems.run(open_splits, run, model_cfg, spec.tokenizer)
        if spec.splits is not None and spec.splits.notes:  # said by `check` and in `train`'s log
            spec.run = run = replace(run, notes=(*run.notes, *spec.splits.notes))
    elif run.data.input_dir is not None:  # the token files are checked without the tokenizer too
        problems.run(open_token_files, run.data.input_dir)
    if run.model.continue_training:  # a note when its weights' tokenizer is another (its files, else its record)
        from pretrain_cli.models.model_files import lost_index_note

        lost = lost_index_note(model_dir, "model_name_or_path: ")  # (a checkpoint's weights, whole without its index)
        spec.run = run = replace(run, notes=(*run.notes, *continued_tokenizer(model_dir, spec.tokenizer,
                                                                              spec.prefixes()), *filter(None, [lost])))
    spec.held = in_use(run) if lock else None
    if spec.held and lock != "describe":  # (the only line of output_dir: the resume's are the live run's checkpoints')
        problems.add(spec.held)
    elif not spec.held and problems.run(check_output_dir, run.output.output_dir) is not None:
        from pretrain_cli.orchestration.resumed import find_resume

        problems.run(foreign_model, run)
        spec.resume = problems.run(find_resume, run)
    saved = CheckpointDir(spec.resume) if spec.resume is not None else None  # its files read once, here
    if saved is not None:
        from pretrain_cli.orchestration.resumed import later_checkpoints

        problems.run(later_checkpoints, run, saved)
    if saved is None and run.loop.do_train and run.model.continue_training:  # (starts at sample 0: the source's?)
        from pretrain_cli.orchestration.continued import same_data_note

        spec.run = run = replace(run, notes=(*run.notes, *same_data_note(model_dir, run)))
    from pretrain_cli.models.foreign_weights import weight_files

    read, unread = weight_files(model_dir)  # read or not (a preset's directory holds none)
    if saved is None and run.loop.do_train and not run.model.continue_training and (read or unread):
        # PaddleNLP's meaning, kept: model_name_or_path alone gives the architecture; said, as a trained directory's
        # weights read as the run's start (continue_training refuses weights in files not read)
        load = ("continue_training: 1 loads them" if read else "convert them to safetensors first "
                "(`pretrain-cli check` with continue_training: 1 names the conversion)")
        note = (f"model_name_or_path: {args.model.model_name_or_path} holds weights, which this run does not load: it "
                f"builds the model from config.json alone, at a random init; {load}")
        spec.run = run = replace(run, notes=(*run.notes, note))
    if saved is not None:  # what `train` refuses before it loads a weight, `check` reports too
        from pretrain_cli.training.resume_checks import check_compatible, check_tokenizer

        problems.run(check_compatible, saved, model_cfg, run.data.max_seq_length, bool(run.output.resume_from))
        problems.run(check_tokenizer, saved, spec.tokenizer, spec.prefixes(), args)
    if spec.held and problems.items and lock == "describe":  # (alone: `check` says it after the run's description)
        problems.add(spec.held)
    _elsewhere(problems, args)
    problems.raise_if_any()
    spec.unresumed = (args, run, target)  # (`apply_resume` works on a copy: keep_global_batch sets keys)
    spec.args, spec.run = apply_resume(spec, saved)
    spec.resumed_at = resume_progress(saved)
    if spec.splits is not None:  # with the epochs the run's steps read of each source's train split
        spec.data_lines = spec.splits.describe(spec.train_samples() if spec.run.loop.do_train else None)
    return spec


def in_use(run) -> str | None:
    """The run lock's refusal when a live run holds the output_dir of this training run's rank 0 (which alone resumes
    here: the other ranks take its choice once joined), else None; another host's lock watched here, once
    (`training.run_lock.refusal`)."""
    from pretrain_cli.training.run_lock import refusal

    return refusal(run.output.output_dir, watch=True) if run.loop.do_train and run.parallel.is_rank0 else None


def _elsewhere(problems: Problems, args: Arguments) -> None:
    """After the problems a file's relative paths met run from another directory, one line naming where to run; or,
    when they are the demo's files (the shipped files' `./demo/tokenizer`, `./demo/data`) and missing here, the
    problem of each says what makes them: a fresh clone has no demo/ until the README's first command."""
    line = beside_the_file(args) if problems.items else None
    if line:
        problems.add(line)
        return
    values = {"tokenizer_name_or_path": args.model.tokenizer_name_or_path, "input_dir": args.data.input_dir,
              "model_name_or_path": args.model.model_name_or_path}
    for key, value in values.items():
        path = Path(value.strip()) if isinstance(value, str) else None  # (a token-file prefix: its .idx)
        demo = path is not None and path.parts[:1] == ("demo",) and not (
            path.exists() or path.with_name(path.name + ".idx").exists())
        for i, item in enumerate(problems.items if demo else ()):
            if item.startswith(f"{key}: "):
                problems.items[i] = (f"{item}; ./demo/ is made by scripts/quickstart.sh (the README's first command): "
                                     f"run it first, or set {key} to your own")
