"""`pretrain-cli check`: everything `train` would validate, without training.

Runs the same `orchestration.prepare` as `train` (arguments, run configuration, model config, tokenizer,
token files, batch arithmetic) and prints the resolved run. Paddle is imported only for `continue_training` from
a model directory: the model is built lazily to read the weights' names and shapes as `train` does.
`--world_size N` resolves the run for rank 0 of an N-process launch instead of the launcher's environment, so a
16-GPU file is checked by the same code on a laptop. Exit 0 means training would start; otherwise every problem
found is listed, one per line.
"""
from __future__ import annotations

import argparse
import json
import sys

from pretrain_cli.errors import UserError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print the resolved run as one JSON object")
    parser.add_argument("--world_size", type=int, default=None,
                        help="check the run as rank 0 of this many processes, on any machine (batch arithmetic, "
                             "heads/KV heads/intermediate vs tensor_parallel_degree, sharding degree, data per "
                             "rank; default: the launcher's world, 1 outside a launch)")
    parser.add_argument("--verify", action="store_true",
                        help="also read every file of the checkpoint train would resume from and check it against "
                             "its checksums, as train does while loading it (a full read: slow for a large model); "
                             "a damaged one shows the checkpoint train would fall back to")
    parser.add_argument("--list-models", "--list_models", dest="list_models", action="store_true",
                        help="print every shipped model preset (parameters, shape, the hub names that select it) "
                             "and exit; no argument file needed")


def list_models() -> list[str]:
    """One line per preset: what `model_name_or_path` accepts besides a local directory."""
    from pretrain_cli.config.presets import HUB_NAMES, PRESET_DIR, preset_names
    from pretrain_cli.models.config import ModelConfig
    from pretrain_cli.models.flops import param_counts

    lines = [f"{'preset':<15} {'family':<6} {'params':>9}  {'layers/hidden/inter':<20} {'heads/kv':<8} "
             f"{'vocab':>7} {'max_pos':>7}  hub names"]
    for name in preset_names():
        cfg = ModelConfig.from_file(str(PRESET_DIR / name))
        n = param_counts(cfg)["total"]
        size = f"{n / 1e9:.2f} B" if n >= 1e9 else f"{n / 1e6:.1f} M" if n >= 1e6 else f"{n / 1e3:.0f} k"
        shape = f"{cfg.num_hidden_layers}/{cfg.hidden_size}/{cfg.intermediate_size}"
        lines.append(f"{name:<15} {cfg.model_type:<6} {size:>9}  {shape:<20} "
                     f"{cfg.num_attention_heads}/{cfg.num_key_value_heads:<5} {cfg.vocab_size:>7} "
                     f"{cfg.max_position_embeddings:>7}  {', '.join(HUB_NAMES.get(name, ()))}")
    lines.append("presets are architecture only (config.json, no weights); a local directory of the same name wins")
    return lines


def verified(spec, out=None) -> object | None:
    """`--verify`: None when the checkpoint `train` would resume from matches its checksums (or there is none), else
    the previous intact one it would fall back to, after one line naming the damage. `resume_from_checkpoint` was
    verified in full by `prepare` already; when no intact checkpoint is left, train's own refusal. `out`: where the
    lines go (stdout; stderr under --json, whose stdout is one JSON object)."""
    from pretrain_cli.storage import intact
    from pretrain_cli.storage.checkpoint_dir import CheckpointDir

    if spec.resume is None or spec.run.output.resume_from or not spec.run.loop.do_train:
        return None
    reason = intact.problem(spec.resume)
    if reason is None:
        print(f"verify: {spec.resume.name} matches its checksums", file=out)
        return None
    print(f"warning: {intact.skipping(spec.resume, reason)}", file=out)
    older = intact.previous(spec.run.output.output_dir, CheckpointDir(spec.resume).state["global_step"], reason)
    print(f"verify: {older.name} matches its checksums; train would resume from it", file=out)
    return older


def pretrained_weights(spec) -> None:
    """`continue_training` from a directory (not a resume): its tensors' names, shapes and dtypes against the model
    its config.json builds, read as `train` reads them (`training.run.check_pretrained`: the same opening over a
    lazily built model; the files' headers, and the data of any tensor the model has no parameter for), so weights
    that do not belong to the config.json are check's error, not train's after its start-up. Paddle is imported
    only for this."""
    if spec.resume is not None or not spec.run.model.continue_training or spec.model_dir is None:
        return
    from pretrain_cli import runtime

    runtime.import_paddle()  # (before training.run's imports reach Paddle: its environment set, its noise quiet)
    from pretrain_cli.training.run import check_pretrained

    check_pretrained(spec.run, spec.model_cfg, spec.model_dir)


def checkpoint_warning(spec, on_this_host: bool) -> list[str]:
    """`plan`'s checkpoints warning for the run `check` resolved (`orchestration.planned.checkpoint_advice`):
    checkpoints its `save_total_limit` lets pile up, and (`on_this_host`: not a simulated --world_size, so this is
    the machine that writes them) more than output_dir's disk has free. Only the checkpoint sizes are computed
    (`planning.plan.checkpoint_plan`), not the whole plan: they do not depend on the device planned."""
    from pretrain_cli.orchestration.planned import checkpoint_advice
    from pretrain_cli.planning.plan import checkpoint_plan

    run = spec.run
    if not run.loop.do_train:
        return []
    advice = checkpoint_advice(checkpoint_plan(run, spec.model_cfg), run.loop.save_total_limit,
                               run.output.output_dir if on_this_host else None)
    return [f"warning: checkpoints: {advice}"] if advice else []


# Epochs of one source past which check warns: repeating data stops paying there (Muennighoff et al. 2023, "Scaling
# Data-Constrained Language Models": up to ~4 epochs about as good as new tokens, the returns vanishing beyond)
MANY_EPOCHS = 4


def repetition_warning(spec) -> list[str]:
    """A warning per source the run reads more than `MANY_EPOCHS` times (the data line's epochs alone, a
    clause among others, is easily read past at 500 epochs), with what to change: more data, or the largest max_steps
    that reads it at most `MANY_EPOCHS` times, unless a resumed run is past that step already."""
    from pretrain_cli.counts import count
    from pretrain_cli.data import source_name

    if spec.splits is None or not spec.run.loop.do_train:
        return []
    samples, batch, out = spec.train_samples(), spec.run.global_batch_size, []
    at = (spec.resumed_at or (0, 0))[0]  # the step a resume starts at: a max_steps below it trains nothing
    total = sum(s["weight"] for s in spec.splits.sources)
    for s in spec.splits.sources:
        train, share = s["splits"].get("train"), s["weight"] / total
        if train is None or not train.samples_per_epoch or train.epochs_for(samples * share) <= MANY_EPOCHS:
            continue
        steps = int(MANY_EPOCHS * train.samples_per_epoch / share) // batch
        fewer = (f", or lower max_steps ({count(steps, 'step')} read it {train.epochs_for(steps * batch * share):.2f} "
                 f"times)" if steps > at else "")
        out.append(f"warning: data: the run reads {source_name(s['dataset'].prefix)}'s train split "
                   f"{train.epochs_for(samples * share):.2f} times ({train.samples_per_epoch:,} samples per epoch): "
                   f"past ~{MANY_EPOCHS} epochs repeated tokens stop helping (Muennighoff et al. 2023, "
                   f"data-constrained scaling); give input_dir more data{fewer}")
    return out


def main(ns: argparse.Namespace) -> int:
    from pretrain_cli.counts import count
    from pretrain_cli.orchestration.prepare import prepare
    from pretrain_cli.orchestration.targets import launcher_target, simulated_target

    if ns.list_models:
        print("\n".join(list_models()))
        return 0
    target = launcher_target() if ns.world_size is None else simulated_target(ns.world_size)
    spec = prepare(ns.config, ns.overrides, target, lock="describe")  # a live run's refusal: after the description
    pretrained_weights(spec)
    fallback = verified(spec, sys.stderr if ns.json else None) if ns.verify else None
    if fallback is not None:
        spec = spec.resuming(fallback)
    if ns.json:
        print(json.dumps(spec.summary(), indent=2, default=str, ensure_ascii=False))
        if spec.held:
            raise UserError(spec.held)
        return 0
    for line in spec.describe():
        print(line)
    from pretrain_cli import runtime

    if ns.world_size is not None and spec.run.device == "gpu" and not runtime.gpu_build_installed():
        print(f"  note: --world_size {ns.world_size} checks the run as a launch on {count(ns.world_size, 'GPU')} "
              f"(device gpu, its precision and kernels); this machine has no GPU build, where `check` without "
              f"--world_size shows the CPU run it would start")
    from pretrain_cli.training.run_lock import previous_end

    if spec.held:  # what `train` would meet first (its lock); the run described without the live run's checkpoints
        raise UserError(spec.held)
    unfinished = previous_end(spec.run.output.output_dir)  # a lock a killed run left: train says it too
    if unfinished:
        print(unfinished)
    from pretrain_cli.orchestration.opened import overwritten
    from pretrain_cli.storage.checkpoint_dir import CheckpointDir

    start = CheckpointDir(spec.resume).state["global_step"] if spec.resume is not None else 0  # (resume_from's)
    if removed := overwritten(spec.run, start, (spec.model_dir, spec.tokenizer_dir)):  # what train removes first
        print(f"warning: {removed}")
    for line in checkpoint_warning(spec, ns.world_size is None) + repetition_warning(spec):
        print(line)
    simulated = f" on {count(ns.world_size, 'process')} (simulated)" if ns.world_size is not None else ""
    if spec.resume is not None and spec.run.loop.do_train:
        from pretrain_cli.training.run_end import nothing_to_train

        from pretrain_cli.training.resume_checks import data_changes

        step = CheckpointDir(spec.resume).state["global_step"]
        if step >= spec.run.loop.max_steps:
            # the launch simulated before the words: "raise max_steps to continue on 4 processes" read as advice
            print(f"check: OK{simulated} — {nothing_to_train(step, spec.run.loop.max_steps)}")
            return 0
        for line in data_changes(spec.resume, spec.run):  # the warnings train logs as it resumes, said here first
            print(f"warning: {line}")
    print(f"check: OK — training would start{simulated}")
    return 0
