"""The user's `*Arguments` -> one `RunConfig`: every cross-key rule and every derived value, decided once.

PaddleNLP spreads these rules over `run_pretrain.py`, `TrainingArguments.__post_init__` and the
Trainer, and applies several silently (a single-GPU run quietly drops `sharding: stage2`). Here
every rule runs before any heavy work, every problem is reported (all of them, not the first), and
every value that differs from what the user wrote comes back as a note that `train` and `check`
print. `plan` resolves the same file for the devices it is asked about (`Target`), so the
attention, recompute and sharding decisions it models are the ones `train` makes.
"""
from __future__ import annotations

import math
import os
from dataclasses import replace

from pretrain_cli.config import paddlenlp_keys
from pretrain_cli.config.compute import (flash_width, fused_loss_default, optimizer_path, resolve_kernels,
                                         resolve_precision)
from pretrain_cli.config.moe import resolve_moe
from pretrain_cli.config.parallel import resolve_parallel
from pretrain_cli.config.keys import KEYS
from pretrain_cli.config.parser import Arguments
from pretrain_cli.config.schedule import wsd_schedule
from pretrain_cli.run_config import (DataConfig, Loop, ModelSource, OptimizerConfig, Output, Recompute, RunConfig,
                                     Schedule, SpikeGuardConfig, Target)
from pretrain_cli.run_layout import ParallelConfig
from pretrain_cli.data.splits import parse_split
from pretrain_cli.counts import count
from pretrain_cli.errors import Problems
from pretrain_cli.training import trackers

_LIMIT = 2**40  # beyond any sane run; catches typos like 1e20 before they reach numpy sizes


def _check_ranges(args: Arguments, problems: Problems) -> None:
    t, d, m = args.training, args.data, args.model
    positive = {
        "per_device_train_batch_size": t.per_device_train_batch_size,
        "per_device_eval_batch_size": t.per_device_eval_batch_size,
        "gradient_accumulation_steps": t.gradient_accumulation_steps,
        "max_seq_length": d.max_seq_length,
        "logging_steps": t.logging_steps,
        "save_steps": t.save_steps,
        "eval_iters": t.eval_iters,
        "nan_skip_limit": t.nan_skip_limit,
    }
    for opt in ("save_total_limit", "decay_steps", *(("eval_steps",) if t.eval_steps != 0 else ())):
        if getattr(t, opt) is not None:
            positive[opt] = getattr(t, opt)
    if m.num_hidden_layers is not None:
        positive["num_hidden_layers"] = m.num_hidden_layers
    if m.vocab_size is not None:
        positive["vocab_size"] = m.vocab_size
    for key, val in positive.items():
        if val < 1:
            problems.add(f"{key}: must be >= 1, got {val}")
        elif val > _LIMIT:
            problems.add(f"{key}: {val} is out of range (must be <= 2^40)")
    if d.max_seq_length == 1:
        problems.add(f"max_seq_length: must be >= 2 tokens, got {d.max_seq_length}")
    if t.max_steps > _LIMIT:
        problems.add(f"max_steps: {t.max_steps} is out of range (must be <= 2^40)")
    if t.hang_timeout is not None and not (math.isfinite(t.hang_timeout) and t.hang_timeout >= 0):
        problems.add(f"hang_timeout: must be a finite number of seconds >= 0 (0: not watched), got {t.hang_timeout}")
    for key in ("learning_rate", "min_learning_rate", "weight_decay", "adam_epsilon", "scale_loss"):
        val = getattr(t, key)
        if not math.isfinite(val) or val < 0:
            problems.add(f"{key}: must be a finite number >= 0, got {val}")
    for key in ("adam_beta1", "adam_beta2"):
        if not 0.0 <= getattr(t, key) < 1.0:
            problems.add(f"{key}: must be in [0, 1), got {getattr(t, key)}")
    if not 0.0 <= t.warmup_ratio <= 1.0:
        problems.add(f"warmup_ratio: must be in [0, 1], got {t.warmup_ratio}")
    if t.warmup_steps < 0:
        problems.add(f"warmup_steps: must be >= 0, got {t.warmup_steps}")
    if t.seed < 0 or t.seed >= 2**32:
        problems.add(f"seed: must be in [0, 2^32), got {t.seed}")
    if t.dataloader_num_workers < 0:
        problems.add(f"dataloader_num_workers: must be >= 0, got {t.dataloader_num_workers}")
    if t.peak_tflops is not None and not (t.peak_tflops > 0 and math.isfinite(t.peak_tflops)):
        problems.add(f"peak_tflops: must be > 0, got {t.peak_tflops}")
    if math.isfinite(t.min_learning_rate) and t.min_learning_rate > t.learning_rate:
        problems.add(f"min_learning_rate: {t.min_learning_rate} is above learning_rate {t.learning_rate}; "
                     f"lower it or raise learning_rate")


def _phases(args: Arguments, problems: Problems) -> tuple:
    t, d = args.training, args.data
    if not (t.do_train or t.do_eval or t.do_predict):
        problems.add("do_train, do_eval, do_predict: all false, so there is nothing to do; set do_train: true")
    if t.output_dir is None or not str(t.output_dir).strip():
        problems.add("output_dir: required; set it to the directory for checkpoints and logs")
    if t.do_train and t.max_steps <= 0:
        problems.add(f"max_steps: must be > 0 (it sets the length of the run), got {t.max_steps}")
    if d.input_dir is None and (t.do_train or t.do_eval or t.do_predict):
        problems.add("input_dir: required; point it at a directory of .bin/.idx token files "
                     "(make them with `pretrain-cli preprocess`)")
    split = problems.run(parse_split, d.split)
    if split is None:
        return (1.0, 0.0, 0.0)
    for phase, flag, share, want in (("train", t.do_train, split[0], "do_train"),
                                     ("valid", t.do_eval, split[1], "do_eval"),
                                     ("test", t.do_predict, split[2], "do_predict")):
        if flag and share == 0:
            problems.add(f"split: {d.split!r} gives the {phase} split a share of 0 but {want} is true; "
                         f"give it a share or set {want}: false")
    return tuple(split)


def _schedule(args: Arguments, notes: list, problems: Problems) -> Schedule:
    t = args.training
    max_steps = max(t.max_steps, 1)
    if t.warmup_steps > 0:
        warmup = t.warmup_steps
        if t.warmup_ratio > 0:
            notes.append(f"warmup: warmup_steps={t.warmup_steps} wins over warmup_ratio={t.warmup_ratio}")
    else:
        # PaddleNLP's run_pretrain.py hands warmup_ratio x max_steps as it is, a fraction of a step included, to its
        # linear and cosine schedulers (which divide by it); every other type takes the Trainer's ceiling
        # (`get_warmup_steps`, as transformers' WSD schedule does)
        warmup = t.warmup_ratio * max_steps
        fraction = t.lr_scheduler_type in ("linear", "cosine")
        if not fraction:
            warmup = math.ceil(warmup)
        elif warmup == int(warmup):
            warmup = int(warmup)
        if t.warmup_ratio > 0:
            how = "as PaddleNLP, a fraction kept" if fraction else "its ceiling"
            notes.append(f"warmup: {warmup:g} steps = warmup_ratio {t.warmup_ratio} x max_steps {max_steps} ({how})")
    decay = t.decay_steps if t.decay_steps is not None else max_steps
    if t.decay_steps is None and t.max_steps > 0 and warmup > max_steps:  # a first short run of a long file
        notes.append(f"warmup: warmup_steps={warmup} is longer than the run (max_steps {max_steps}); clipped to "
                     f"{max_steps}, so the learning rate reaches learning_rate at the last step (PaddleNLP keeps "
                     f"all {warmup} and ends the run at {max_steps / warmup:.0%} of it)")
        warmup = max_steps
    inputs_valid = t.max_steps > 0 and 0 <= t.warmup_ratio <= 1 and (t.decay_steps is None or t.decay_steps >= 1)
    if inputs_valid and decay < warmup:  # (a bad input is reported once, not again as this consequence)
        problems.add(f"decay_steps: {decay} ends before warmup ({count(warmup, 'step')}) is over; "
                     f"raise decay_steps/max_steps or shorten warmup")
    if t.lr_scheduler_type == "warmup_stable_decay":  # its own keys (config/schedule.py)
        return wsd_schedule(args, warmup, notes, problems)
    if t.lr_scheduler_type == "constant":
        warmup = 0
    return Schedule(t.lr_scheduler_type, t.learning_rate, t.min_learning_rate, warmup, decay)


def _spike_guard(args: Arguments, parallel: ParallelConfig, problems: Problems, notes: list) -> SpikeGuardConfig:
    """The loss-spike guard's bounds. A factor of 0 turns its check off; one at or below 1 would call every
    ordinary step a spike."""
    t = args.training
    for key in ("spike_loss_factor", "spike_grad_norm_factor"):
        val = getattr(t, key)
        if not math.isfinite(val) or (val != 0 and val <= 1):
            problems.add(f"{key}: must be 0 (off) or a finite factor > 1, got {val}")
    for key, low in (("spike_warmup_steps", 0), ("spike_window", 1), ("spike_rollback_steps", 1)):
        if not low <= getattr(t, key) <= _LIMIT:
            problems.add(f"{key}: must be >= {low}, got {getattr(t, key)}")
    if t.spike_policy != "none" and t.spike_loss_factor == 0 and t.spike_grad_norm_factor == 0:
        notes.append(f"spike_policy: {t.spike_policy} with both spike factors 0 checks nothing")
    return SpikeGuardConfig(t.spike_policy, t.spike_loss_factor, t.spike_grad_norm_factor, t.spike_warmup_steps,
                            t.spike_window, t.spike_rollback_steps,
                            rollback_rebuilds=t.spike_policy == "rollback"
                            and parallel.traits.placed_pieces)  # placed pieces / freed stages


def _intervals(args: Arguments, problems: Problems, notes: list) -> tuple[int, int]:
    """(eval_steps, save_steps) as the strategies make them. PaddleNLP's `epoch` is its Trainer's: one pass over
    run_pretrain.py's train dataset, which it builds to hold max_steps global batches, so a pretraining run is one
    epoch and `epoch` evaluates or saves once, after the last step; the step interval is unused (DefaultFlowCallback
    acts on it only under `steps`). Not the wrap of the token files (a blend's sources wrap each on its own)."""
    t = args.training
    last = max(t.max_steps, 1)  # (an eval-only run trains no step)
    eval_steps = t.eval_steps or t.logging_steps  # (0, like None, falls back, as in PaddleNLP)
    if t.evaluation_strategy == "epoch":
        eval_steps = last
        if t.do_train:
            notes.append(f"evaluation_strategy: epoch evaluates once, after the last step ({t.max_steps}): the run is "
                         f"PaddleNLP's one epoch{'; eval_steps unused' if t.eval_steps else ''} (steps: every "
                         f"eval_steps)")
    elif t.do_eval and not t.eval_steps:
        notes.append(f"eval: eval_steps not set, evaluating every logging_steps = {count(eval_steps, 'step')}")
    if t.save_strategy == "no":
        notes.append(f"save_strategy: accepted but has no effect here: PaddleNLP's no saves no checkpoint; here "
                     f"save_steps decides ({t.save_steps}), and the last step is always saved (what a resume and the "
                     f"export read)")
    if t.save_strategy != "epoch":
        return eval_steps, t.save_steps
    if t.do_train and t.spike_policy == "rollback":
        problems.add("save_strategy: epoch saves only the last step, so spike_policy: rollback has no checkpoint to "
                     "roll back to; set save_strategy: steps (a checkpoint every save_steps) or spike_policy: skip")
    elif t.do_train:
        notes.append(f"save_strategy: epoch saves one checkpoint, after the last step ({t.max_steps}): the run is "
                     f"PaddleNLP's one epoch; save_steps unused (steps: a checkpoint every save_steps, {t.save_steps})")
    return eval_steps, last


def _document_mask(args: Arguments, notes: list) -> tuple[str, bool]:
    """(attention_mask_type, reset_position_ids) as they will run: a padded sample is one document already."""
    d = args.data
    mask, reset = d.attention_mask_type, d.reset_position_ids
    if mask == "document" and d.sample_mode == "padded":
        notes.append("attention_mask_type: document changes nothing with sample_mode padded (one document per "
                     "sample); the run is causal")
        mask = "causal"
    if mask == "causal" and reset is not None:
        notes.append("reset_position_ids: only applies with attention_mask_type: document; ignored")
    return mask, mask == "document" and reset is not False


def _cpu_layout_note(args: Arguments, device: str, world: int, notes: list) -> None:
    t = args.training
    # the cheap tests first: `os.cpu_count` is a system call, and `plan --fit` resolves thousands of GPU candidates
    if device != "cpu" or world != 1 or not t.do_train or t.cpu_fused_ops:
        return
    cores = os.cpu_count() or 1
    if cores > 1:
        # Paddle's own CPU element-wise ops use one thread: only more processes use the other cores.
        # With the fused kernels (the default) one process with every core is the faster layout.
        notes.append(f"cpu: with cpu_fused_ops false, one process per core trains ~1.3-1.5x faster than one "
                     f"process with {cores} threads (docs/PERFORMANCE.md): python -m paddle.distributed.launch "
                     f"--nproc_per_node {cores} scripts/run_pretrain.py <cfg> (divide per_device_train_batch_size "
                     f"by {cores} to keep the global batch)")


def resolve(args: Arguments, model_cfg, target: Target, judge=None) -> RunConfig:
    """Validate every cross-key rule and decide every derived value; all problems raise together. `judge(problems,
    target)`: of the precision problems `train` refuses, those the command refuses (`eval`'s split:
    `orchestration.recorded.split_judge`, where a run's recorded bf16 on a T4 runs); without it, all of them."""
    problems, notes = Problems(), []
    t, d, m = args.training, args.data, args.model
    probed = None  # a candidate's parallel layout, resolved first: most `--fit` candidates are refused products
    if target.candidate:  # of degrees, found before the rest of the file is resolved again (a candidate is planned:
        refused, probed_notes = Problems(), []  # its device is the target's)
        probed = resolve_parallel(args, model_cfg, target, probed_notes, refused)
        refused.raise_if_any()
    _check_ranges(args, problems)
    split = _phases(args, problems)
    schedule = _schedule(args, notes, problems)
    device = t.device
    if target.planned:
        if t.device != target.device:
            # (plan plans the file's device unless --device names another: `orchestration.planned.own_device`)
            here = "; `plan --device cpu` plans this machine" if t.device == "cpu" else ""
            notes.append(f"device: the file says {t.device!r}; planning for {target.gpu_name or target.device} "
                         f"(plan's --device){here}")
        device = target.device
    elif t.device == "gpu" and target.device != "gpu":
        device = "cpu"
        notes.append("device: gpu requested but this Paddle has no GPU build; running on cpu "
                     "(install paddlepaddle-gpu for GPUs, or set device: cpu to silence this)")
    found = Problems()
    precision = resolve_precision(args, device, target, notes, found)
    here = replace(target, device=device)
    for problem in found.items if judge is None else judge(found.items, here):
        problems.add(problem)
    kernels = resolve_kernels(args, here, precision, notes)
    if probed is None:
        parallel = resolve_parallel(args, model_cfg, here, notes, problems)
    else:  # (its notes in the same place as a file's)
        parallel = probed
        notes.extend(probed_notes)
    # the fused head + loss reads the whole head weight: wherever tp leaves the head whole (the layout steps' split,
    # a vocabulary tp does not divide) it runs; only a vocabulary-split head keeps the logits
    # (distributed.steps.local_kernels: no vocabulary-split kernel)
    if kernels.fused_loss and parallel.vocab_parallel:
        kernels = replace(kernels, fused_loss=False)
        if "use_fused_linear_cross_entropy" in args.explicit:
            notes.append(f"use_fused_linear_cross_entropy: tensor_parallel_degree {parallel.tp_degree} splits the LM "
                         f"head over the vocabulary (it divides vocab_size {model_cfg.vocab_size}); the run keeps the "
                         f"logits and the unfused loss")
    kernels = replace(kernels, optimizer=optimizer_path(args, device, precision, parallel))
    if kernels.to_static and parallel.traits.eager:
        kernels = replace(kernels, to_static=False)
        notes.append(f"to_static: not with {parallel.traits.eager}; ignored")
    if kernels.to_static and parallel.ep_degree > 1:
        kernels = replace(kernels, to_static=False)
        notes.append("to_static: not with expert parallelism (SOT fails in its all-gather of the tokens at the first "
                     "forward); ignored")
    if kernels.to_static and t.recompute and not t.recompute_use_reentrant and t.recompute_granularity != "core_attn":
        problems.add(f"to_static: not supported with recompute_granularity {t.recompute_granularity} and "
                     f"recompute_use_reentrant false (Paddle's recompute fails in the backward of a compiled layer); "
                     f"set to_static false (or recompute_use_reentrant true, or recompute_granularity core_attn)")
    recompute = Recompute(t.recompute_granularity, t.recompute_use_reentrant,
                          tuple(t.no_recompute_layers or ())) if t.recompute else None
    eval_steps, save_steps = _intervals(args, problems, notes)
    paddlenlp_eval = t.per_device_train_batch_size * t.gradient_accumulation_steps
    if parallel.pp_degree > 1 and t.do_eval and t.per_device_eval_batch_size != paddlenlp_eval:
        notes.append(f"eval: PaddleNLP evaluates a pipeline with per_device_eval_batch_size = micro-batch x "
                     f"gradient_accumulation_steps = {paddlenlp_eval} whatever the file says; here the file's "
                     f"{t.per_device_eval_batch_size} runs as one micro-batch through the stages (set "
                     f"{paddlenlp_eval} to average PaddleNLP's samples, if its activations fit)")
    _cpu_layout_note(args, device, target.world_size, notes)
    mask_type, reset_positions = _document_mask(args, notes)
    kernels = flash_width(kernels, model_cfg, here, parallel.cp_degree, mask_type, notes)  # (the model's head width)
    spike = _spike_guard(args, parallel, problems, notes)
    moe = resolve_moe(args, model_cfg, parallel, notes, problems)
    report_to = problems.run(trackers.choose, t.report_to, notes)  # installed-or-not: `prepare` (not `plan`)
    for key in args.explicit:  # accepted for compatibility but without effect here
        spec = KEYS[key]
        if spec.support == "ignored" and args.get(key) != spec.default:
            notes.append(f"{key}: accepted but has no effect here: {spec.help}")
    notes.extend(paddlenlp_keys.notes_for(args, parallel.data_world_size))  # (global_batch_size: the batch run)
    async_save = paddlenlp_keys.check_flags(args, parallel, problems, notes)
    problems.raise_if_any()
    loop = Loop(do_train=t.do_train, do_eval=t.do_eval, do_predict=t.do_predict, max_steps=t.max_steps,
                micro_batch=t.per_device_train_batch_size, grad_accum=t.gradient_accumulation_steps,
                eval_batch=t.per_device_eval_batch_size, eval_iters=t.eval_iters, test_iters=10 * t.eval_iters,
                eval_steps=eval_steps,
                logging_steps=t.logging_steps, logging_first_step=t.logging_first_step, save_steps=save_steps,
                save_total_limit=t.save_total_limit, seed=t.seed, nan_policy=t.nan_policy,
                nan_skip_limit=t.nan_skip_limit, prefetch=t.dataloader_num_workers,
                ignore_data_skip=t.ignore_data_skip,
                progress_bar=None if t.disable_tqdm is None else not t.disable_tqdm,
                memory_metrics=not t.skip_memory_metrics or device == "cpu", peak_tflops=t.peak_tflops,
                async_save=async_save, hang_timeout=t.hang_timeout)
    return fused_loss_default(args, model_cfg, RunConfig(
        device=device, precision=precision, kernels=kernels, parallel=parallel, recompute=recompute,
        schedule=schedule,
        optimizer=OptimizerConfig(t.adam_beta1, t.adam_beta2, t.adam_epsilon, t.weight_decay, t.max_grad_norm),
        loop=loop,
        data=DataConfig(d.input_dir, split, str(d.split), d.max_seq_length, d.sample_mode, d.data_cache,
                        mask_type, reset_positions),
        model=ModelSource(m.model_name_or_path, m.tokenizer_name_or_path, m.continue_training, m.num_hidden_layers),
        output=Output(str(t.output_dir), t.overwrite_output_dir, t.resume_from_checkpoint, t.logging_dir,
                      report_to, precision.amp_dtype or "float32" if t.export_dtype == "auto" else t.export_dtype),
        spike=spike, moe=moe, notes=tuple(notes)))
