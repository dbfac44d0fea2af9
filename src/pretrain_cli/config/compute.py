"""How one process computes: its precision, the kernel request (`KernelConfig`) and the optimizer path.

`config.resolve` decides these with the rest of the run; `kernels_for` applies the same rules alone, for `eval` and
`generate`, which build a model without a run to resolve. Precision comes first because the kernels depend on it
(flash attention needs fp16/bf16 on a GPU; the fused AdamW only runs in fp32).
"""
from __future__ import annotations

from dataclasses import replace

from pretrain_cli.config.parser import Arguments
from pretrain_cli.errors import Problems
from pretrain_cli.run_config import ATTENTION_PATHS, KernelConfig, Precision, RunConfig, Target


def resolve_precision(args: Arguments, device: str, target: Target, notes: list, problems: Problems) -> Precision:
    """The AMP dtype and level the run computes in on `device`: fp16/bf16 only where Paddle's AMP would really run
    them (not at level O0, not on CPU; bf16 refused on a GPU without it, a warning for `plan`), each drop a note.
    `problems` gets train's refusals; `eval` and `generate` refuse only those of what the user gave them
    (`orchestration.recorded.precision_verdict`)."""
    from pretrain_cli.planning.hardware import capability, no_bf16

    t = args.training
    if t.fp16 and t.bf16:
        problems.add(f"fp16, bf16: both are true{_both_precisions(args)}")
    want = "bfloat16" if t.bf16 else "float16" if t.fp16 else None
    if want and t.fp16_opt_level == "O0":  # Paddle's AMP level O0 casts nothing: fp32 computation
        notes.append(f"fp16_opt_level: O0 runs no op in half precision (Paddle's AMP level O0); the run is fp32 "
                     f"({'bf16' if t.bf16 else 'fp16'} has no effect)")
        want = None
    why = no_bf16(target.gpu_name, capability(target.gpu_name, target.gpu_capability)) if device == "gpu" else None
    if want == "bfloat16" and why and target.planned:  # `plan` models the file as written; `plan --fit` moves it
        notes.append(f"bf16: WARNING: {why}; set bf16: false and fp16: true (loss scaling keeps fp16 stable), "
                     f"or use an Ampere-or-newer GPU")
    elif want == "bfloat16" and why:  # `train`/`check` on this GPU (the driver's capability)
        fix = ("pass --bf16 false --fp16 true (loss-scaled fp16), or --bf16 false alone for fp32"
               if args.explicit.get("bf16") == "command line" else  # (dropping it may leave a file's bf16)
               "set bf16: false and fp16: true (loss-scaled fp16), or bf16: false alone for fp32")
        problems.add(f"bf16: {why}, and Paddle's AMP would silently run fp32; {fix}")
    if want and device == "cpu":
        notes.append(f"precision: {'bf16' if t.bf16 else 'fp16'} is not applicable on cpu (no half-precision "
                     f"matmul kernels); the run stays fp32")
        want = None
    if t.amp_master_grad and want is None:
        notes.append("amp_master_grad: ignored without fp16/bf16 mixed precision")
    return Precision(want, t.fp16_opt_level if want else "O1", bool(t.amp_master_grad and want), t.scale_loss,
                     tuple(t.amp_custom_black_list or ()), tuple(t.amp_custom_white_list or ()))


def _both_precisions(args: Arguments) -> str:
    """Where fp16 and bf16 were each set true, with a fix that works from there: a file's fp16 (a run's args.json)
    and `--bf16 true` typed is a switch of precision that needs `--fp16 false` too; both typed, dropping one may
    leave the file's (or the record's) value, where `--KEY false` always wins."""
    where = {k: args.explicit.get(k, "default") for k in ("fp16", "bf16")}
    typed = [k for k, w in where.items() if w == "command line"]
    if len(typed) == 1:
        other = "bf16" if typed[0] == "fp16" else "fp16"
        return (f" ({other} in {args.config_path or where[other]}, --{typed[0]} on the command line); choose one "
                f"precision: pass --{other} false --{typed[0]} true")
    if len(typed) == 2:
        return " (both on the command line); choose one precision: pass --fp16 false or --bf16 false"
    if set(where.values()) == {"file"}:
        return f" (both in {args.config_path}); choose one precision: set one of them false there"
    named = {k: args.config_path if w == "file" else w for k, w in where.items()}  # (PaddleFormers' default)
    return (f" (fp16 from {named['fp16']}, bf16 from {named['bf16']}); choose one precision: pass --fp16 false or "
            f"--bf16 false")


def resolve_kernels(args: Arguments, target: Target, precision: Precision, notes: list) -> KernelConfig:
    """`use_flash_attention` decides memory-light vs materialised attention on every device."""
    t, gpu = args.training, target.device == "gpu"
    attention = "flash" if t.use_flash_attention else "math"
    if attention == "flash" and gpu and not precision.enabled:
        notes.append("use_flash_attention: flash attention needs fp16/bf16 on GPU; the fp32 run uses the math path")
        attention = "math"
    from pretrain_cli.planning.hardware import capability, pre_ampere

    # the driver's compute capability on a GPU, the hardware table's for `plan`'s device
    if attention == "flash" and gpu and pre_ampere(capability(target.gpu_name, target.gpu_capability)):
        notes.append(f"use_flash_attention: {target.gpu_name or 'this GPU'} predates Ampere (no flash-attn-2); "
                     f"the math path runs")
        attention = "math"
    # no note where the key is set either way (the user's choice), nor under context parallelism (on more than one
    # process), which runs the reference blocks whatever it says (`attention_words`)
    moot = "use_flash_attention" in args.explicit or (target.world_size > 1 and t.context_parallel_degree > 1)
    if not gpu and attention == "math" and t.cpu_fused_ops and not moot:
        # the figure: benchmarks/train_throughput.py at bench's shape, both settings alternated (PERFORMANCE.md §10);
        # said as that shape's, since `plan --device cpu` prints the note for any model
        notes.append("use_flash_attention: not set, so attention on CPU materialises the [b, heads, s, s] scores "
                     "(sdpa_mask); true selects the block-causal CPU kernel, memory-light and faster (2.2x a step "
                     "at benchmarks/configs/bench.json's shape, 8 x 256 tokens: docs/PERFORMANCE.md §10)")
    assert attention in ATTENTION_PATHS
    return KernelConfig(attention=attention, rms_norm="fused" if t.use_fused_rms_norm else "reference",
                        rope="fused" if t.use_fused_rope else "reference", swiglu="fused" if gpu else "reference",
                        cpu_ops=t.cpu_fused_ops, to_static=t.to_static,
                        fused_loss=t.use_fused_linear_cross_entropy,
                        fuse_o_proj=not (t.recompute and t.recompute_granularity == "full_attn"))


# how `flash_width`'s one note starts: `orchestration.targets.inference_kernels` prints it for `eval` and `generate`,
# as `train` prints its start-up notes (their other kernel notes are `recorded.idle_kernel_keys`' to say)
WIDTH_NOTE = "use_flash_attention: flash attention refuses head width"


def flash_width(kernels: KernelConfig, model_cfg, target: Target, cp: int, mask: str, notes: list,
                backward: bool = True) -> KernelConfig:
    """What flash attention asked for on a GPU computes at the model's `head_width` (MLA's padded max(qk_head_dim,
    v_head_dim)) there, by `ops.flash_width.path`, the rule `ops.gpu_attention` runs by (the driver's compute
    capability under `train`, the table's for `plan`'s device), with one note where it is not flash-attn. Where the
    scores materialise the run resolves to the math path, so `plan` counts the `[b, heads, s, s]` scores (flash and
    math count the same FLOPs: its speed) and the `kernels:` line names them. Where Paddle's sdpa runs its
    memory-efficient kernel instead (a causal mask without context parallelism at a width over 256 that is a
    multiple of 8: sdpa.py 3.3.1 `check_head_dim_size_mem_efficient`), which holds no scores either, flash's memory
    is kept. `backward` False (`eval`, `generate`: a forward alone) and context parallelism (its ring's backward is
    `ops.block_attention`'s) judge flash-attn's forward alone, which takes 193-256 on every GPU it runs on."""
    if target.device != "gpu" or kernels.attention != "flash" or model_cfg is None:
        return kernels
    from pretrain_cli.ops.flash_width import fix, judge
    from pretrain_cli.planning.activations import head_width
    from pretrain_cli.planning.hardware import capability

    width, cap = head_width(model_cfg), capability(target.gpu_name, target.gpu_capability)
    backward = backward and cp == 1
    chosen, why = judge(width, cap, mask == "causal" and cp == 1, backward)
    if chosen == "flash":
        return kernels
    where, reason = why
    gpu, how = target.gpu_name or "this GPU", fix(where, bool(model_cfg.mla), cap, backward)
    if chosen == "mem_efficient":
        notes.append(f"{WIDTH_NOTE} {width} ({reason}): on {gpu} Paddle's "
                     f"sdpa runs its memory-efficient kernel instead, which holds no [b, heads, s, s] scores either; "
                     f"{how}")
        return kernels
    done = "planned with the scores materialised" if target.planned else "the run materialises the scores"
    notes.append(f"{WIDTH_NOTE} {width} on {gpu} "
                 f"({where + '; ' if where else ''}{reason}): {done}; {how}")
    return replace(kernels, attention="math")


def forward_kernels(run: RunConfig, args: Arguments, model_cfg, target: Target) -> RunConfig:
    """`run` as `eval --config` computes it: a forward alone, in one process, of `model_cfg` (the model it loads,
    whose width need not be the config's) under the run's mask. `config.resolve` judged the width as `train`'s,
    with a backward: 193-256 off compute capability 8.0 / 9.0 took the math path, where a forward alone (and
    `eval --model` for the same run) runs flash-attn. The request before that judgement is `resolve_kernels`' on
    the run's precision; its width note is replaced by this judgement's."""
    here = replace(target, device=run.device)
    asked = resolve_kernels(args, here, run.precision, []).attention
    notes = [note for note in run.notes if not note.startswith(WIDTH_NOTE)]
    kernels = flash_width(replace(run.kernels, attention=asked), model_cfg, here, 1, run.data.attention_mask_type,
                          notes, False)
    return replace(run, kernels=kernels, notes=tuple(notes))


# the keys `kernels_for` reads (`resolve_precision` for the attention rule, `resolve_kernels`): the training keys that
# change how `eval` and `generate` compute (`orchestration.recorded.no_effect`)
KERNEL_KEYS = ("use_flash_attention", "use_fused_rms_norm", "use_fused_rope", "use_fused_linear_cross_entropy",
               "cpu_fused_ops", "to_static", "recompute", "recompute_granularity", "fp16", "bf16", "fp16_opt_level")
_SCORES = "the [b, heads, s, s] scores materialised"
# (device, memory-light, CPU kernels) -> the attention kernel `ops.kernels.select` runs, by mask: its `attention_name`
# and `attention_document_name`, the names of the `kernels:` line `train`, `eval` and `generate` print
_ATTENTION_KERNELS = {
    ("gpu", True): {"causal": ("sdpa_causal", "flash-attn"), "document": ("flashmask", "flash-attn's document mask")},
    ("cpu", True): {"causal": ("cpu", "the fused block-causal CPU kernel, memory-light: no flash-attn on CPU"),
                    "document": ("cpu_document", "the fused CPU kernel, skipping other documents' blocks, "
                                                 "memory-light: no flash-attn on CPU")},
}


def attention_words(kernels: KernelConfig, device: str, mask: str, cp: int = 1) -> str:
    """The attention a run of `kernels` on `device` runs, named as its `kernels:` line names it (`ops.kernels.select`:
    `attention=cpu`), with what that is: the resolved run's `attention` words. `use_flash_attention` asks for the
    memory-light path, which is flash-attn on a GPU and the fused block-causal kernel on CPU, where the word `flash`
    named a kernel that does not run there. CPU kernels that fail to build are `select`'s one warning at run time.
    `cp` > 1: context parallelism's ring attention over the cp group (`distributed.steps.context.context_kernels`),
    flash-attn's blocks where a GPU runs flash, else the reference blocks."""
    if cp > 1:
        blocks = "flash" if device == "gpu" and kernels.attention == "flash" else "reference"
        return f"context({blocks} blocks) (ring attention over {cp} cp ranks, {mask} mask in each block)"
    light = kernels.light_attention(device)
    name, what = _ATTENTION_KERNELS.get((device, light), {}).get(mask, ("sdpa_mask", _SCORES))
    if kernels.attention == "flash" and not light:  # on CPU without its kernels: Paddle's ops hold the scores
        what += "; cpu_fused_ops false leaves no memory-light attention on CPU"
    return f"{name} ({what})"


def kernels_for(args: Arguments, target: Target, notes: list | None = None, problems: list | None = None,
                model_cfg=None, mask: str = "causal") -> KernelConfig:
    """The kernels one process of `target` runs for `args`, by `train`'s rules: what `eval` and `generate`
    build the model with (for a model no run wrote, `args` set `use_flash_attention: true` unless a kernel
    override says otherwise: `orchestration.targets.SNAPSHOT_ARGUMENTS`). `notes` receives what the rules said on
    the way (`precision: fp16 is not applicable on cpu`) and `problems`, apart, what `train` would refuse (`fp16,
    bf16: both are true`): the caller judges the problems (`orchestration.recorded.precision_verdict`) and an
    override by the notes alone. `model_cfg`: the model they run, whose head width flash-attn's forward is judged
    at (`flash_width`, a forward alone: 193-256 runs flash-attn on every GPU it runs on) with `mask`, the one the
    command runs (`eval --data`'s `--attention_mask_type`, else the run's; `generate`'s causal), never worked out
    again from `args` (whose data keys are a run's, not the command's); None: not judged."""
    notes = [] if notes is None else notes
    found = Problems()
    kernels = resolve_kernels(args, target, resolve_precision(args, target.device, target, notes, found), notes)
    kernels = flash_width(kernels, model_cfg, target, 1, mask, notes, False)
    if problems is not None:
        problems.extend(found.items)
    return kernels


def fused_loss_default(args: Arguments, model_cfg, run: RunConfig) -> RunConfig:
    """On a GPU the fused head + loss (Paddle's ops) buys memory only, and costs some where a micro-batch holds few
    tokens at the head: it keeps the head's fp32 dW (2·4·V·hidden from two chunks of rows on) where the logits are
    ~12·tokens·V in bf16. Unless the file sets the key, it runs there only where it is the smaller `logits_loss`
    term by `plan`'s own model (`planning.plan.fused_loss_on_gpu`), with a note when it is turned off. On CPU it is
    the faster kernel: on."""
    if (run.device != "gpu" or not run.kernels.fused_loss or model_cfg is None
            or "use_fused_linear_cross_entropy" in args.explicit):
        return run
    from pretrain_cli.planning.plan import fused_loss_on_gpu

    fused, unfused = fused_loss_on_gpu(run, model_cfg)
    if fused < unfused:
        return run
    tokens = run.loop.micro_batch * run.data.max_seq_length // run.parallel.cp_degree
    note = (f"use_fused_linear_cross_entropy: off (the file does not set it): at {tokens:,} tokens a micro-batch at "
            f"the LM head (hidden {model_cfg.hidden_size:,}, vocab {model_cfg.vocab_size:,}) the fused head + loss "
            f"would hold {fused / 2**30:.2f} GiB (the head's fp32 dW) against the logits' {unfused / 2**30:.2f} GiB; "
            f"set it true to run it anyway")
    return replace(run, kernels=replace(run.kernels, fused_loss=False), notes=run.notes + (note,))


def optimizer_path(args: Arguments, device: str, precision: Precision, parallel) -> str:
    """The fused multi-tensor AdamW only where it is exactly Paddle's: CPU fp32 (no master weights, no loss
    scaler) with whole parameters and gradients on every rank (one process, `paddle.DataParallel`); ZeRO and
    tensor parallelism keep their engines' optimizers, and the GPU keeps Paddle's."""
    t = args.training
    fused = (device == "cpu" and t.cpu_fused_ops and t.cpu_fused_optimizer and not precision.enabled
             and parallel.traits.whole_gradients and not parallel.sharding_stage)
    return "fused" if fused else "paddle"
