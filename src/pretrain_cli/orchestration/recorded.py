"""The run a model directory records: `eval` and `generate` on an output directory or a `checkpoint-N`
take the settings of the run that wrote it (its `args.json`), with the same `--key value` overrides
`train` takes, and say where what they do differs from that run."""
from __future__ import annotations

import re
from pathlib import Path

from pretrain_cli.config.parser import Arguments, parse_config
from pretrain_cli.errors import UserError
from pretrain_cli.run_dir import ARGS_FILE
from pretrain_cli.storage.checkpoint_dir import CheckpointDir


def record_path(model_dir) -> Path | None:
    """`model_dir/args.json` when a run of ours wrote it, else None (an HF directory, a preset)."""
    return CheckpointDir.of(model_dir).record


def trained_model(output_dir) -> tuple[Path | None, str | None]:
    """(model, note) a run's output_dir holds: its final export, else its newest complete checkpoint-N, the one a
    resume takes, its fp16 loss scale aside (`storage.intact.newest_complete`; none complete: its newest, judged as
    it is read), with a `note:`
    saying so and naming the newer one passed over, with the `--model` that reads it where its weights are whole
    without its lost index (`weights_without_index`) (a run stopped before its export still has a model to evaluate
    or sample; the user must know it is not the final one, nor the model the directory held before the run:
    `final_model.whole_final` judges); (None, None) when it holds neither yet."""
    from pretrain_cli import run_dir
    from pretrain_cli.training.final_model import before_the_run, final_step, whole_final

    out = Path(output_dir)
    if whole_final(out):
        return out, older_final(out)
    ckpt = run_dir.latest_checkpoint(out)
    if ckpt is None:  # weights of an export stopped part way, and nothing else: judged there, loudly
        return (out, None) if final_step(out)[0] else (None, None)
    from pretrain_cli.storage.intact import newest_complete

    try:  # the one a resume takes (its loss scale, which no reader of the weights loads, not judged); none complete:
        complete, skipped = newest_complete(out, resume=False)  # the newest, judged as it is read
    except UserError:  # (a checkpoint PaddleNLP's Trainer wrote: no resume's, but its weights are read as they are)
        complete, skipped = None, []
    which, passed = "newest checkpoint", ""
    if complete is not None and skipped:
        from pretrain_cli.storage.intact import LOST_INDEX, weights_without_index

        more = f", and {len(skipped) - 1} newer one(s) not complete either" if len(skipped) > 1 else ""
        ckpt, which = complete, "newest complete checkpoint"
        newer, reason = skipped[0]  # its index lost, its weights whole: no resume takes it, but --model reads it
        whole = (f" (its weights are whole without it: --model {newer} reads them)" if reason.kind == LOST_INDEX
                 and weights_without_index(newer) is not None else "")
        passed = f"; not {newer.name}: {reason}{whole}{more}"
    from pretrain_cli.training.run_lock import whose

    who = whose(out)
    why = ("its run stopped before the export" if who is None else f"its run is still training: {who}"
           if who.startswith("pid") else f"its run on {who} holds its lock: still training, or stopped there")
    if who is None and final_step(out)[0]:  # weights, but no whole model (`whole_final`)
        why = "its run's export was stopped part way"
    before = before_the_run(out)
    there = (f" ({', '.join(before)} there {'is' if len(before) == 1 else 'are'} the model {out} held before the run, "
             f"not trained by it)") if before else ""
    return ckpt, f"note: {out} holds no final model yet ({why}): using its {which}, {ckpt}{there}{passed}"


def older_final(out: Path) -> str | None:
    """A `note:` when run directory `out`'s final model is older than its newest checkpoint-N (a run resumed with a
    higher max_steps and stopped before its own export): the final model is used, and the newer one named."""
    from pretrain_cli import run_dir

    saved = run_dir.list_checkpoints(out)
    try:
        step = CheckpointDir(out).state["global_step"]
    except (UserError, OSError, KeyError, TypeError):
        return None
    if not saved or saved[-1][0] <= step:
        return None
    return (f"note: {out} holds the final model of step {step}; its run trained on to {saved[-1][1].name}, not "
            f"exported yet: pass {saved[-1][1]} for that one")


def model_argument(name: str, key: str = "--model") -> tuple[str, str | None]:
    """(model, note) for `--model NAME`: a run's output_dir without its final export (args.json and checkpoint-N/
    but no weights of its own) stands for its newest checkpoint, as `eval --config` takes it; any other name is
    returned as given, for `resolve_model_dir` to judge."""
    from pretrain_cli.training.final_model import before_the_run, whole_final

    path = Path(name)
    if not path.is_dir() or record_path(path) is None:
        return name, None
    if whole_final(path):
        return name, older_final(path)
    model, note = trained_model(path)
    if model is not None:
        return str(model), note
    before = before_the_run(path)
    if (path / "config.json").is_file() and not before:  # a model directory of ours without weights: judged there
        return name, None
    held = f" (only {', '.join(before)}: the model it held before the run, not trained by it)" if before else ""
    raise UserError(f"{key}: {name} is a run's output_dir with neither a final model nor a checkpoint-N yet{held}; "
                    f"wait for its first checkpoint (save_steps) or point {key} at a model directory")


def run_arguments(config: str | None, model_dir, overrides: list[str],
                  command: str) -> tuple[Arguments | None, bool, list[str]]:
    """(the arguments `command` runs with, whether they are a run's, notes): `--config`'s file, else the record of
    the run that wrote `model_dir`, each with `overrides` (True: their windows and settings are a run's to take);
    for a model no run wrote (False), None, or with kernel overrides (`--use_flash_attention false`) the file
    `targets.inference_kernels` takes for it with them (no other override may be given there: there is no run's
    setting for it to change). What `train` would refuse of their kernels is refused, and the notes name a kernel
    override that changes no kernel here (`idle_kernel_keys`). Parsed once with `overrides`, and once without each
    kernel key among them."""
    from pretrain_cli.config.compute import KERNEL_KEYS
    from pretrain_cli.config.parser import override_keys
    from pretrain_cli.orchestration.targets import SNAPSHOT_ARGUMENTS

    record = record_path(model_dir) if config is None and model_dir is not None else None
    source = config or (str(record) if record is not None else None)
    if source is None:
        if not overrides:
            return None, False, []
        if any(k not in KERNEL_KEYS for _, k in override_keys(overrides)):
            raise UserError(f"{command}: {' '.join(overrides)}: --key value overrides change a run's settings, and "
                            f"of a model no run wrote only the kernels ({kernel_keys()}); pass --config "
                            f"FILE, or a --model directory a run wrote (it holds args.json)")

        def parse(tokens: list[str]) -> Arguments:
            keys = [ours for _, ours in override_keys(tokens)]
            kept = [] if SNAPSHOT_ARGUMENTS[0][2:] in keys else list(SNAPSHOT_ARGUMENTS)  # (one key and its value)
            return parse_config(None, [*kept, *tokens])
    else:
        def parse(tokens: list[str]) -> Arguments:
            return parse_config(source, tokens)
    given = parse(overrides)
    return given, source is not None, idle_kernel_keys(given, parse, overrides, command)


def idle_kernel_keys(given, parse, overrides: list[str], command: str) -> list[str]:
    """The kernel rules' verdict on `given`, the arguments with `overrides`: what `train` would refuse of them is
    judged by `precision_verdict`, as `prepare` judges it on `eval`'s split (`eval --config`'s path has been judged
    there already, and is noted here). Then a `note:` for each kernel key the overrides change that changes no kernel on
    this device (`--fp16 true` on CPU: the precision stays fp32; `--fp16 false` on a run recorded with fp16;
    `--recompute true` alone), naming what the rules noted of either value, never what they would refuse: the
    command runs as it would without it, and the user learns so. A key given twice is left out with every copy. One
    that restates the setting in effect is no change, and one without which the overrides would add a refusal is a
    change that counts (`--fp16 false` beside `--bf16 true` on a run recorded with fp16): both are taken silently.
    `parse(tokens)`: the arguments with those tokens instead (`parse([])`, once more, only where a rule refused a
    run's record)."""
    from pretrain_cli.config.compute import KERNEL_KEYS, kernels_for
    from pretrain_cli.config.parser import override_keys
    from pretrain_cli.orchestration.targets import inference_target

    target, said, refused, base = inference_target(), [], [], []
    kernels = kernels_for(given, target, said, refused)

    def recorded_alone() -> list[str]:
        kernels_for(parse([]) if overrides else given, target, [], base)
        return base
    added, notes = precision_verdict(refused, recorded_alone, given, target, command)
    if added:
        raise UserError("\n".join(added))
    had = {_rule(p) for p in base}
    chunks: list[list[str]] = []  # each --key with its values, as typed
    for token in overrides:
        if token.startswith("--") or not chunks:
            chunks.append([])
        chunks[-1].append(token)
    keys = [override_keys(c)[0][1] if c[0].startswith("--") else None for c in chunks]
    for key in dict.fromkeys(k for k in keys if k in KERNEL_KEYS):
        typed = [t for k, c in zip(keys, chunks) if k == key for t in c]
        without = parse([t for k, c in zip(keys, chunks) if k != key for t in c])
        either, conflict = list(said), []
        if without.get(key) != given.get(key) and kernels_for(without, target, either, conflict) == kernels \
                and not [p for p in conflict if _rule(p) not in had]:
            # what the rules said of either value (`--fp16 false` on a run recorded with fp16: of its fp16) that
            # names this key as a word (`fp16: ...`, `precision: fp16 is ...`, `O0 ... (fp16 has no effect)`), never
            # as part of another key's name (fp16 in `fp16_opt_level: ...`)
            why = [n for n in dict.fromkeys(either) if re.search(rf"(?<![\w.-]){re.escape(key)}(?![\w-])", n)]
            notes.append(f"note: {' '.join(typed)}: changes no kernel {command} runs on {target.device}"
                         f"{' (' + '; '.join(why) + ')' if why else ''}: it runs as it would without it")
    return notes


def precision_verdict(problems: list[str], without, given, target, command: str) -> tuple[list[str], list[str]]:
    """(refused, notes): the one verdict `eval` (every path: `prepare`'s for a run's split, `idle_kernel_keys`' for
    --data's windows) and `generate` give on `problems`, what `train` would refuse of the precision of `given` (the
    arguments with the command's overrides) on `target`. Train's rules are for what the user gives this command: the
    overrides typed, and an argument file handed as --config that is no run's record (a hand-written file: all its
    problems refused, as `train` refuses them). A run's record (`given.config_path` a run's args.json: its directory
    as --model, or --config RUN/args.json) was judged by train where it ran; what it sets and this device lacks (bf16
    on a T4) is no typed value's to undo and runs with a note (`kept_problems`): only a rule the overrides add is
    refused (`without()`: the problems of the record alone, asked only here and only of a record)."""
    from pretrain_cli.orchestration.recorded_paths import record_of

    if not problems:
        return [], []
    problems = list(dict.fromkeys(problems))
    if record_of(given.config_path) is None:  # the user's own file, or none (a model no run wrote): all typed
        return problems, []
    base = without()
    had = {_rule(p) for p in base}  # (a rule's line names where each value came from: the same rule, other words)
    return [p for p in problems if _rule(p) not in had], kept_problems(base, given, target, command)


def split_judge(config: str | None, overrides: list[str] | None, record: str, given, command: str):
    """`resolve`'s judge of what `train` would refuse of the precision of `command`'s run's split (`prepare`'s
    `command`): `precision_verdict`'s refusals on the device the split resolved to, so they are reported with the
    split's other problems; its notes are `idle_kernel_keys`' to say (`eval` judges the same arguments after
    `prepare`). `given`: `config` with `overrides` (as `record`), and the command's changes, which set no precision."""
    from pretrain_cli.config.compute import resolve_precision
    from pretrain_cli.errors import Problems

    def judge(problems: list[str], here) -> list[str]:
        def recorded_alone() -> list[str]:
            found = Problems()
            resolve_precision(parse_config(config, [], record) if overrides else given, here.device, here, [], found)
            return found.items
        return precision_verdict(problems, recorded_alone, given, here, command)[0]
    return judge


def _rule(problem: str) -> str:
    """The rule a refusal is of, as its line starts (`fp16, bf16`, `bf16`)."""
    return problem.split(":", 1)[0]


def kept_problems(problems: list[str], given, target, command: str) -> list[str]:
    """A `note:` for each rule `train` would refuse the arguments without overrides by (`problems`: of a run's
    record), which `command` runs anyway: it builds its model in fp32 and runs no AMP, so a precision
    this device lacks changes only the kernels chosen, which its `kernels:` line names. A run trained in bf16 on an
    A100 samples on a T4, where `train` would refuse bf16 (Paddle's AMP would compute fp32 there)."""
    from pretrain_cli.planning.hardware import capability, no_bf16

    notes, where = [], given.config_path
    for rule in dict.fromkeys(map(_rule, problems)):
        if rule == "bf16":
            why = no_bf16(target.gpu_name, capability(target.gpu_name, target.gpu_capability))
            notes.append(f"note: bf16 (in {where}): {why}; {command} computes in fp32, as Paddle's AMP would here "
                         f"(train would refuse bf16 on this GPU)")
        else:  # both fp16 and bf16 true: the rules take bf16's kernels
            notes.append(f"note: fp16, bf16: both are true in {where} (train would refuse it); {command} takes "
                         f"bf16's kernels and computes in fp32")
    return notes


# what else `eval` reads of a run's settings: its windows of --data; of a run's split (`--config`, a run's --model)
# the whole data side `prepare` opens, the model and tokenizer it checks, its eval batches and output_dir's model
WINDOW_KEYS = ("max_seq_length", "attention_mask_type", "reset_position_ids")
SPLIT_KEYS = (*WINDOW_KEYS, "input_dir", "split", "data_impl", "skip_warmup", "share_folder", "data_cache",
              "sample_mode", "seed", "per_device_eval_batch_size", "eval_iters", "output_dir", "device",
              "model_name_or_path", "tokenizer_name_or_path", "num_hidden_layers", "vocab_size")


def no_effect(overrides: list[str], command: str, reads: tuple = ()) -> None:
    """Refuse `--key value` overrides that change nothing `command` computes (`--learning_rate 3` on `eval`: the
    user thinks it matters), in one line naming them and the keys that do: the kernel keys (`kernel_keys`) and
    what `reads` names. `export` and `inspect-data` take no training key on their command line at all."""
    from pretrain_cli.config.compute import KERNEL_KEYS
    from pretrain_cli.config.parser import override_keys

    takes = (*KERNEL_KEYS, *reads)
    idle = [typed for typed, ours in override_keys(overrides) if ours not in takes]
    if not idle:
        return
    names = ", ".join(f"--{k}" for k in dict.fromkeys(idle))
    what = "a training key that changes" if len(set(idle)) == 1 else "training keys that change"
    raise UserError(f"{names}: {what} nothing {command} computes; drop {'it' if len(set(idle)) == 1 else 'them'} "
                    f"({command}'s --key value overrides take {kernel_keys()}"
                    f"{'; and ' + ', '.join(reads) if reads else ''})")


def kernel_keys() -> str:
    """The kernel keys as the refusals name them (each taken; one that changes no kernel on this device with a
    note: `idle_kernel_keys`)."""
    from pretrain_cli.config.compute import KERNEL_KEYS

    return f"the kernel keys: {', '.join(KERNEL_KEYS)}"


def data_ranks(config: str) -> int:
    """The data ranks (dp x sharding) of the run whose record `config` is (a run's args.json), 1 for an argument file
    no run wrote: that run's evaluation read `eval_iters` global batches of `per_device_eval_batch_size` x that many
    windows, each data rank its slice, so one process averages the same windows in `eval_iters` x that many batches."""
    path = Path(config)
    ckpt = CheckpointDir.of(path.parent)
    if path.name != ARGS_FILE or ckpt.record is None:
        return 1
    parallel = ckpt.run("parallel")
    try:
        return max(1, int(parallel["dp_degree"]) * int(parallel["sharding_degree"]))
    except (TypeError, KeyError, ValueError):  # a record that does not say: judged as one process's
        return 1


def differences(model_dir, max_seq_length: int, attention_mask_type: str, reset_position_ids) -> list[str]:
    """Notes where an evaluation's windows differ from those of the run that trained `model_dir` (its
    args.json); none for a directory no run of ours wrote."""
    path = record_path(model_dir) if model_dir is not None else None
    if path is None:
        return []
    trained = parse_config(str(path)).data
    notes = []
    if max_seq_length != trained.max_seq_length:
        notes.append(f"note: {max_seq_length}-token windows; the model was trained on {trained.max_seq_length}-token "
                     f"ones ({path})")
    if attention_mask_type != trained.attention_mask_type:
        notes.append(f"note: attention_mask_type {attention_mask_type}; the model was trained with "
                     f"{trained.attention_mask_type} ({path})")
    elif attention_mask_type == "document" and (reset_position_ids is not False) != \
            (trained.reset_position_ids is not False):
        notes.append(f"note: reset_position_ids {reset_position_ids is not False}; the model was trained with "
                     f"{trained.reset_position_ids is not False} ({path})")
    return notes
