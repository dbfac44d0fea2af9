"""Cross-key validation and the one place where compatibility pairs are resolved.

PaddleNLP spreads these rules over `run_pretrain.py`, `TrainingArguments.__post_init__` and the
Trainer, and applies several silently (a single-GPU run quietly drops `sharding: stage2`).
Here every rule runs before any heavy work, and every value that differs from what the user
wrote comes back as a human-readable note that `train` and `check` print.
"""
from __future__ import annotations

import importlib.metadata
import math
import os
from dataclasses import dataclass, field, fields

from pretrain_cli.arg_parser import KEYS, Arguments
from pretrain_cli.data.samples import parse_split
from pretrain_cli.errors import UserError

_LIMIT = 2**40  # beyond any sane run; catches typos like 1e20 before they reach numpy sizes


@dataclass
class Resolved:
    """Values derived from the arguments and the environment; the trainer reads these."""

    device: str = "cpu"
    amp_dtype: str | None = None  # "bfloat16" | "float16" | None (fp32)
    amp_level: str = "O1"
    warmup_steps: int = 0
    decay_steps: int = 1
    eval_steps: int = 1
    world_size: int = 1
    tp_degree: int = 1
    pp_degree: int = 1
    sharding_stage: int = 0
    sharding_offload: bool = False
    split: tuple = (0.949, 0.05, 0.001)  # train/valid/test fractions
    notes: list = field(default_factory=list)

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "notes"}


def parse_sharding(text: str) -> tuple[int, bool]:
    stage, offload = 0, False
    for tok in text.replace(",", " ").split():
        if tok in ("stage1", "stage2", "stage3"):
            if stage:
                raise UserError(f"sharding: {text!r} names more than one stage; pick one of stage1, stage2, stage3")
            stage = int(tok[-1])
        elif tok == "offload":
            offload = True
        else:
            raise UserError(f"sharding: unknown option {tok!r}; use stage1, stage2 or stage3, optionally with offload")
    if offload and stage not in (2, 3):
        raise UserError(f"sharding: 'offload' needs stage2 or stage3, got {text!r}")
    return stage, offload


def _check_ranges(args: Arguments) -> None:
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
    for opt in ("eval_steps", "save_total_limit", "decay_steps"):
        if getattr(t, opt) is not None:
            positive[opt] = getattr(t, opt)
    if m.num_hidden_layers is not None:
        positive["num_hidden_layers"] = m.num_hidden_layers
    for key, val in positive.items():
        if val < 1:
            raise UserError(f"{key}: must be >= 1, got {val}")
        if val > _LIMIT:
            raise UserError(f"{key}: {val} is out of range (must be <= 2^40)")
    if d.max_seq_length < 2:
        raise UserError(f"max_seq_length: must be >= 2 tokens, got {d.max_seq_length}")
    if t.max_steps > _LIMIT:
        raise UserError(f"max_steps: {t.max_steps} is out of range (must be <= 2^40)")
    for key in ("learning_rate", "min_learning_rate", "weight_decay", "adam_epsilon", "scale_loss"):
        val = getattr(t, key)
        if not math.isfinite(val) or val < 0:
            raise UserError(f"{key}: must be a finite number >= 0, got {val}")
    for key in ("adam_beta1", "adam_beta2"):
        if not 0.0 <= getattr(t, key) < 1.0:
            raise UserError(f"{key}: must be in [0, 1), got {getattr(t, key)}")
    if not 0.0 <= t.warmup_ratio <= 1.0:
        raise UserError(f"warmup_ratio: must be in [0, 1], got {t.warmup_ratio}")
    if t.warmup_steps < 0:
        raise UserError(f"warmup_steps: must be >= 0, got {t.warmup_steps}")
    if t.seed < 0 or t.seed >= 2**32:
        raise UserError(f"seed: must be in [0, 2^32), got {t.seed}")
    if t.dataloader_num_workers < 0:
        raise UserError(f"dataloader_num_workers: must be >= 0, got {t.dataloader_num_workers}")
    if t.peak_tflops is not None and not (t.peak_tflops > 0 and math.isfinite(t.peak_tflops)):
        raise UserError(f"peak_tflops: must be > 0, got {t.peak_tflops}")
    if t.min_learning_rate > t.learning_rate:
        raise UserError(f"min_learning_rate: {t.min_learning_rate} is above learning_rate {t.learning_rate}; "
                        f"lower it or raise learning_rate")


def _gpu_build_installed() -> bool:
    """Whether a GPU build of Paddle is installed, without paying for `import paddle`."""
    for dist in ("paddlepaddle-gpu", "paddlepaddle_gpu"):
        try:
            importlib.metadata.distribution(dist)
            return True
        except importlib.metadata.PackageNotFoundError:
            continue
    return False


def world_size_from_env() -> int:
    return int(os.environ.get("PADDLE_TRAINERS_NUM", os.environ.get("PADDLE_GLOBAL_SIZE", "1")) or 1)


def resolve(args: Arguments, world_size: int | None = None, gpu_available: bool | None = None) -> Resolved:
    """Validate every cross-key rule and derive the values the run uses; raise UserError on conflicts."""
    t, d = args.training, args.data
    r = Resolved()
    note = r.notes.append
    _check_ranges(args)
    if not (t.do_train or t.do_eval or t.do_predict):
        raise UserError("do_train, do_eval, do_predict: all false, so there is nothing to do; set do_train: true")
    if t.output_dir is None or not str(t.output_dir).strip():
        raise UserError("output_dir: required; set it to the directory for checkpoints and logs")
    if t.do_train and t.max_steps <= 0:
        raise UserError(f"max_steps: must be > 0 (it sets the length of the run), got {t.max_steps}")
    if t.fp16 and t.bf16:
        raise UserError("fp16, bf16: both are true; choose one precision")
    if d.input_dir is None and (t.do_train or t.do_eval or t.do_predict):
        raise UserError("input_dir: required; point it at a directory of .bin/.idx token files "
                        "(make them with `pretrain-cli preprocess`)")
    r.split = tuple(parse_split(d.split))
    for phase, flag, share in (("train", t.do_train, r.split[0]), ("valid", t.do_eval, r.split[1]),
                               ("test", t.do_predict, r.split[2])):
        if flag and share == 0:
            want = {"train": "do_train", "valid": "do_eval", "test": "do_predict"}[phase]
            raise UserError(f"split: {d.split!r} gives the {phase} split a share of 0 but {want} is true; "
                            f"give it a share or set {want}: false")

    # Steps and schedule.
    max_steps = max(t.max_steps, 1)
    if t.warmup_steps > 0:
        r.warmup_steps = t.warmup_steps
        if t.warmup_ratio > 0:
            note(f"warmup: warmup_steps={t.warmup_steps} wins over warmup_ratio={t.warmup_ratio}")
    else:
        r.warmup_steps = math.ceil(t.warmup_ratio * max_steps)
        if t.warmup_ratio > 0:
            note(f"warmup: {r.warmup_steps} steps = ceil(warmup_ratio {t.warmup_ratio} x max_steps {max_steps})")
    r.decay_steps = t.decay_steps if t.decay_steps is not None else max_steps
    if r.decay_steps < r.warmup_steps:
        raise UserError(f"decay_steps: {r.decay_steps} ends before warmup ({r.warmup_steps} steps) is over; "
                        f"raise decay_steps/max_steps or shorten warmup")
    r.eval_steps = t.eval_steps if t.eval_steps is not None else t.logging_steps
    if t.do_eval and t.eval_steps is None:
        note(f"eval: eval_steps not set, evaluating every logging_steps = {r.eval_steps} steps")

    # Device and precision.
    if gpu_available is None:
        gpu_available = _gpu_build_installed()
    r.device = t.device
    if t.device == "gpu" and not gpu_available:
        r.device = "cpu"
        note("device: gpu requested but this Paddle has no GPU build; running on cpu "
             "(install paddlepaddle-gpu for GPUs, or set device: cpu to silence this)")
    want_amp = "bfloat16" if t.bf16 else "float16" if t.fp16 else None
    if want_amp and r.device == "cpu":
        note(f"precision: {'bf16' if t.bf16 else 'fp16'} is not applicable on cpu (no half-precision matmul "
             f"kernels); the run stays fp32")
    elif want_amp:
        r.amp_dtype, r.amp_level = want_amp, t.fp16_opt_level
    if t.amp_master_grad and r.amp_dtype is None:
        note("amp_master_grad: ignored without fp16/bf16 mixed precision")

    # Parallel degrees (REFERENCE §7.3).
    r.world_size = world_size if world_size is not None else world_size_from_env()
    cores = os.cpu_count() or 1
    if r.device == "cpu" and r.world_size == 1 and cores > 1 and t.do_train and not t.cpu_fused_ops:
        # Paddle's own CPU element-wise ops use one thread: only more processes use the other cores.
        # With the fused kernels (the default) one process with every core is the faster layout.
        note(f"cpu: with cpu_fused_ops false, one process per core trains ~1.3-1.5x faster than one process "
             f"with {cores} threads (docs/PERFORMANCE.md): python -m paddle.distributed.launch --nproc_per_node "
             f"{cores} scripts/run_pretrain.py <cfg> (divide per_device_train_batch_size by {cores} to keep the "
             f"global batch)")
    r.sharding_stage, r.sharding_offload = parse_sharding(t.sharding)
    tp, pp = max(t.tensor_parallel_degree, 1), max(t.pipeline_parallel_degree, 1)
    sep, cp = max(t.sep_parallel_degree, 1), max(t.context_parallel_degree, 1)
    if r.world_size == 1:
        dropped = [f"{k}={v}" for k, v in (("tensor_parallel_degree", tp), ("pipeline_parallel_degree", pp),
                                           ("sep_parallel_degree", sep), ("context_parallel_degree", cp)) if v > 1]
        if r.sharding_stage:
            dropped.append(f"sharding={t.sharding!r}")
        if dropped:
            note(f"parallel: one process, so {', '.join(dropped)} has no effect")
        r.sharding_stage, r.sharding_offload = 0, False
    else:
        for key, val in (("tensor_parallel_degree", tp), ("pipeline_parallel_degree", pp),
                         ("sep_parallel_degree", sep), ("context_parallel_degree", cp)):
            if val > 1:
                raise UserError(f"{key}: {val} is not supported yet (data parallel and sharding are); set it to 1")
        r.tp_degree, r.pp_degree = tp, pp
    if (t.sequence_parallel or t.virtual_pp_degree > 1) and r.world_size > 1:
        note("sequence_parallel / virtual_pp_degree: only meaningful with tensor / pipeline parallelism; ignored")

    # Keys accepted for compatibility but without effect here.
    for key in args.explicit:
        spec = KEYS[key]
        if spec.support == "ignored" and args.get(key) != spec.default:
            note(f"{key}: accepted but has no effect here: {spec.help}")
    return r
