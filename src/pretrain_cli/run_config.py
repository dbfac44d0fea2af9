"""The resolved run configuration: every decision about a run, made once, by `config.resolve`.

A base module (it imports only the base module `run_layout`, the parallel part), so every layer below `config/`
(training, planning, distributed, models, ops, data) reads and annotates with these frozen objects, never the user's
`*Arguments`. `plan`, `check` and `train` all build the same `RunConfig` from the same file, so what `plan` models
(attention path, recompute, sharding) is by construction what `train` runs. Kernel and parallel choices live here, never
on the model's architecture config (PaddleNLP's `LlmMetaConfig` copies 19 such flags onto it).
No Paddle import: `check` and `plan` use this module without paying for one.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from pretrain_cli.run_layout import ParallelConfig



@dataclass(frozen=True)
class Target:
    """Where the run executes: this process's launcher world, or the devices `plan` is asked about.

    `gpu_name` names the GPU (a hardware-table name for `plan`, the driver's for `train` and `check` on a GPU
    build: `runtime.gpu_name`), with `gpu_capability` the driver's where there is one, so both apply the same
capability rule (`planning.hardware.pre_ampere` on `planning.hardware.capability`). `planned`: the devices are
    the ones `plan` was asked about, so they win over the file's `device` key. `candidate`: a layout `plan --fit` or a
    suggestion tries (`orchestration.planned`): whether it runs is all the search asks, so a layout the parallel
    rules refuse is refused before the rest of the file is resolved again (the file's own problems `plan` reported).
    """

    device: str = "cpu"  # "cpu" | "gpu"
    world_size: int = 1
    rank: int = 0
    local_rank: int = 0
    gpu_name: str | None = None
    planned: bool = False
    candidate: bool = False
    # the driver's (major, minor) on a GPU (`runtime.gpu_capability`); else the table's
    gpu_capability: tuple | None = None


@dataclass(frozen=True)
class Schedule:
    """Warmup, then linear/cosine decay to `min_lr` at `decay_steps`; a pure function of the step.

    Step t is the optimizer step about to run, counted from 1 (PaddleNLP steps its scheduler once at
    construction, so its first step uses `learning_rate / warmup`, not 0). A resumed run recomputes the
    rate from the step alone: there is no scheduler state to save.
    `warmup_stable_decay` is transformers' `get_wsd_schedule` at step t (linear warmup from `min_lr`, flat until
    `decay_start`, a `decay_shape` decay to `min_lr` at `decay_steps`); with `num_stable_steps` unset the decay
    ends at max_steps, so raising max_steps from a checkpoint in the stable phase extends that phase, and setting
    max_steps to a checkpoint's step + num_decay_steps anneals from it.
    """

    kind: str = "linear"  # linear | cosine | constant | constant_with_warmup | warmup_stable_decay
    max_lr: float = 5e-5
    min_lr: float = 1e-5
    warmup_steps: float = 0  # a whole number, except from warmup_ratio (PaddleNLP keeps ratio x max_steps as it is)
    decay_steps: int = 1
    start_step: int = 0  # a schedule restarted at a resumed step (lr_schedule_on_resume: restart) counts from it
    decay_start: int = 0  # warmup_stable_decay: the step its decay starts at (warmup + num_stable_steps)
    decay_shape: str = "cosine"  # warmup_stable_decay: linear | cosine | 1-sqrt (transformers' decay_type)

    def lr_at(self, t: int) -> float:
        w, s = self.warmup_steps, self.decay_steps
        t -= self.start_step
        if self.kind == "warmup_stable_decay":
            return self.max_lr * self._wsd_factor(t)
        if w > 0 and t <= w:
            return self.max_lr * t / w
        if self.kind in ("constant", "constant_with_warmup"):
            return self.max_lr
        if t > s:
            return self.min_lr
        r = (t - w) / max(1, s - w)
        if self.kind == "linear":
            return self.min_lr + (1.0 - r) * (self.max_lr - self.min_lr)
        return self.min_lr + 0.5 * (1.0 + math.cos(math.pi * r)) * (self.max_lr - self.min_lr)

    def _wsd_factor(self, t: int) -> float:
        """transformers' `_get_wsd_scheduler_lambda` (linear warmup, num_cycles 0.5) at its step t."""
        ratio = self.min_lr / self.max_lr if self.max_lr else 0.0
        if t < self.warmup_steps:
            return max(0.0, t / max(1, self.warmup_steps) * (1.0 - ratio) + ratio)
        if t < self.decay_start:
            return 1.0
        if t >= self.decay_steps:
            return ratio
        p = (t - self.decay_start) / max(1, self.decay_steps - self.decay_start)
        f = {"linear": 1.0 - p, "cosine": 0.5 * (1.0 + math.cos(math.pi * p)), "1-sqrt": 1.0 - math.sqrt(p)}
        return max(0.0, f[self.decay_shape] * (1.0 - ratio) + ratio)

    def phase(self, t: int) -> str | None:
        """warmup_stable_decay's phase at step t (warmup, stable, decay, annealed: at the floor), for `plan` and the log
        line."""
        if self.kind != "warmup_stable_decay":
            return None
        t -= self.start_step
        return ("warmup" if t < self.warmup_steps else "stable" if t < self.decay_start
                else "decay" if t < self.decay_steps else "annealed")

    def describe(self) -> str:
        """What `lr_at` does, in one phrase (the resolved `schedule:` line, the resume note), its steps counted as the
        run counts them (a restarted schedule's from its start step): a constant schedule and a warmup that fills
        the run (one clipped to max_steps) decay to nothing, so their phrase names no decay. Every phrase names the
        peak rate: two schedules that differ only in learning_rate (a resume with another) read the same without."""
        start = f" from step {self.start_step}" if self.start_step else ""
        w, end, peak = self.warmup_steps, self.start_step + self.decay_steps, f"peak {self.max_lr:g}"
        if self.kind == "warmup_stable_decay":
            return (f"warmup_stable_decay{start}, warmup {w}, {peak}, stable to step "
                    f"{self.start_step + self.decay_start}, {self.decay_shape} decay to {self.min_lr:g} by step {end}")
        if self.kind in ("constant", "constant_with_warmup"):
            return f"{self.kind}{start}, warmup {w}, then {self.max_lr:g}" if w > 0 else \
                f"{self.kind}{start} at {self.max_lr:g}"
        if w >= self.decay_steps:  # lr_at: warmup to max_lr at step w; no step of decay before the run ends
            return f"{self.kind}{start}, warmup {w}: rises to {self.max_lr:g} by step {self.start_step + w}, no decay"
        return f"{self.kind}{start}, warmup {w}, {peak}, decay to {self.min_lr:g} by step {end}"


@dataclass(frozen=True)
class OptimizerConfig:
    beta1: float = 0.9
    beta2: float = 0.999
    epsilon: float = 1e-8
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0  # <= 0: no clipping


@dataclass(frozen=True)
class Precision:
    """Mixed precision as it will run (fp32 on CPU whatever the file asked; the notes say so)."""

    amp_dtype: str | None = None  # "bfloat16" | "float16" | None = fp32
    level: str = "O1"  # O1: autocast over fp32 weights; O2: half weights + fp32 master weights
    master_grad: bool = False
    loss_scale: float = 32768.0
    black_list: tuple = ()
    white_list: tuple = ()

    @property
    def enabled(self) -> bool:
        return self.amp_dtype is not None

    @property
    def loss_scaling(self) -> bool:
        """fp16 needs a loss scaler; bf16 has fp32's range and does not."""
        return self.amp_dtype == "float16"

    @property
    def master_weights(self) -> bool:
        return self.enabled and self.level == "O2"

    @property
    def param_dtype(self) -> str:
        """The dtype the weights are held (and saved) in."""
        return self.amp_dtype if self.master_weights else "float32"

    @property
    def compute_bytes(self) -> int:
        return 2 if self.enabled else 4


ATTENTION_PATHS = ("flash", "math")


@dataclass(frozen=True)
class KernelConfig:
    """What a run asks of the kernels; `config.resolve` fills it, `ops.kernels.select` maps it to what the device runs.

    The defaults are what an argument file that sets none of the kernel keys resolves to on CPU (the PaddleNLP
    defaults: `use_flash_attention` false; `tests/unit/test_run_config.py` checks that they agree).
    `attention`: "flash" is the fused path: flash-attn on GPU, which never holds the `[b, heads, s, s]` scores
    (the memory lever PaddleNLP users rely on), and the block-causal kernel on CPU (faster; it keeps fp32
    probabilities for backward, about half the scores' memory); "math" materialises the scores on every device.
    `planning.memory` models each of the three.
    """

    attention: str = "math"  # one of ATTENTION_PATHS
    rms_norm: str = "reference"  # "fused" | "reference"
    rope: str = "reference"
    swiglu: str = "reference"
    cpu_ops: bool = True  # on CPU: pretrain-cli's own fused kernels (ops/csrc) when they build
    to_static: bool = False
    # "fused": the multi-tensor AdamW + norm of ops/csrc/optim.cc (CPU, fp32, one process or plain data
    # parallel; see `select_step`); "paddle": Paddle's AdamW, one kernel per parameter (GPU, AMP, ZeRO, TP)
    optimizer: str = "fused"
    fused_loss: bool = True  # the LM head + cross-entropy in chunks (ops.linear_loss), no [tokens, vocab] logits
    # on CPU: o_proj, the residual add and the post-attention norm as one op (`linear_add_rms_norm`); off under
    # `full_attn` recompute, whose recomputed block ends with o_proj (the op would keep its input besides)
    fuse_o_proj: bool = True

    def light_attention(self, device: str) -> bool:
        """Whether the memory-light attention `flash` asks for runs on `device`: flash-attn on a GPU, the block-causal
        kernel on CPU, one of the fused CPU kernels (`cpu_ops` false leaves Paddle's ops, which hold the scores). One
        rule for the run's `kernels:` words (`config.compute.attention_words`) and `plan`'s memory (`planning.plan`)."""
        return self.attention == "flash" and (device == "gpu" or self.cpu_ops)


@dataclass(frozen=True)
class MoeConfig:
    """How a Mixture-of-Experts model routes and balances while training (`config.resolve` fills it; the model's
    architecture is its config.json). Read by `models.moe` / `models.moe_loss`; docs/MODELS.md explains each.

    `aux_loss_coef`: the weight of the balance loss, decided by `config.moe.aux_coefficient` (None, a model built
    without a run: what transformers computes, config.json's `router_aux_loss_coef`, none for DeepSeek);
    `aux_loss_scope`: "micro_batch" (transformers') or "global" (token counts summed over the data-parallel
    ranks first, as Qwen3 was trained); `z_loss_coef`: router z-loss weight (0: off); `bias_update_rate`: the
    auxiliary-loss-free per-expert bias step (0: off; DeepSeek-V3 used 1e-3); `capacity_factor`: 0 = dropless,
    else each expert keeps at most that multiple of its balanced share of assignments.
    """

    aux_loss_coef: float | None = None
    aux_loss_scope: str = "micro_batch"
    z_loss_coef: float = 0.0
    bias_update_rate: float = 0.0
    capacity_factor: float = 0.0
    # the router keeps an e_score_correction_bias even at bias_update_rate 0 (frozen): a checkpoint trained with
    # the bias is evaluated, generated from or resumed with the routing it was trained with
    routing_bias: bool = False
    # DeepSeek-V3's multi-token prediction objective (`models.mtp`), a training choice of the same models: λ of
    # `λ/D · Σ_k L_k` added to the training loss (0.3 in DeepSeek-V3's first 10T tokens, then 0.1)
    mtp_loss_weight: float = 0.3

    def expert_capacity(self, tokens: int, top_k: int, num_experts: int) -> int | None:
        """Assignments one expert keeps of a forward's `tokens` under `capacity_factor` (Switch/GShard: factor x the
        balanced share), None when dropless: here, not in `models.moe`, so the start-up line says it without Paddle."""
        if self.capacity_factor <= 0:
            return None
        return max(1, math.ceil(self.capacity_factor * tokens * top_k / num_experts))


@dataclass(frozen=True)
class Recompute:
    granularity: str = "full"  # one of models.recompute.GRANULARITIES
    use_reentrant: bool = False
    skip_layers: tuple = ()


@dataclass(frozen=True)
class Loop:
    """The training loop's own settings (defaults: an argument file's, on CPU, as every part's here)."""

    do_train: bool = True
    do_eval: bool = False
    do_predict: bool = False
    max_steps: int = 1
    micro_batch: int = 8
    grad_accum: int = 1
    eval_batch: int = 8
    eval_iters: int = 10
    # the test split's batches at the end (do_predict): PaddleNLP's run_pretrain.py sizes its test set for
    # `test_iters = eval_iters * 10` batches
    test_iters: int = 100
    eval_steps: int = 500  # eval_steps unset: logging_steps
    logging_steps: int = 500
    logging_first_step: bool = True
    save_steps: int = 500
    save_total_limit: int | None = None
    seed: int = 42
    nan_policy: str = "stop"  # stop | skip
    nan_skip_limit: int = 5
    prefetch: int = 0  # batches read ahead by a thread (dataloader_num_workers)
    ignore_data_skip: bool = False
    progress_bar: bool | None = None  # None: on a terminal only
    memory_metrics: bool = True  # on CPU always (`skip_memory_metrics` applies to GPUs)
    peak_tflops: float | None = None
    async_save: bool = False  # checkpoint-N/ written by a background thread (`training.async_save`)
    # a rank without progress this long is hung (`distributed.launcher.watchdog`); None: default
    hang_timeout: float | None = None


@dataclass(frozen=True)
class SpikeGuardConfig:
    """What counts as a loss spike and what happens then (`training.spike`); policy "none" watches nothing."""

    policy: str = "none"  # none | skip | rollback | stop
    loss_factor: float = 2.0  # 0: the loss is not checked
    grad_norm_factor: float = 10.0  # 0: the gradient norm is not checked
    warmup_steps: int = 100
    window: int = 50
    rollback_steps: int = 1
    # a rollback builds the model and its layout again from the checkpoint, as a restart does (the semi-auto
    # engine: its parameters and optimizer state are placed pieces that whole tensors cannot be written into)
    rollback_rebuilds: bool = False

    @property
    def enabled(self) -> bool:
        return self.policy != "none"


@dataclass(frozen=True)
class DataConfig:
    input_dir: str | None = None
    split: tuple = (0.949, 0.05, 0.001)  # train/valid/test fractions
    split_text: str = "949,50,1"  # as written (shown in messages)
    max_seq_length: int = 1024
    sample_mode: str = "packed"  # packed | padded
    data_cache: str | None = None
    attention_mask_type: str = "causal"  # causal | document (packed samples carry doc_start, position_ids)
    reset_position_ids: bool = False  # document only: RoPE positions restart at each document

    @property
    def document_mask(self) -> bool:
        return self.attention_mask_type == "document"


@dataclass(frozen=True)
class ModelSource:
    name_or_path: str = "tiny-qwen2"
    tokenizer: str | None = None
    continue_training: bool = False
    num_hidden_layers: int | None = None


@dataclass(frozen=True)
class Output:
    output_dir: str = "output"
    overwrite: bool = False
    resume_from: str | None = None
    logging_dir: str | None = None
    report_to: tuple = ("visualdl",)
    export_dtype: str = "float32"  # the final export's weights (`export_dtype: auto`: the half dtype a run trains in)


@dataclass(frozen=True)
class RunConfig:
    """One run, resolved: the only object the layers below `config/` read."""

    device: str
    precision: Precision
    kernels: KernelConfig
    parallel: ParallelConfig
    recompute: Recompute | None
    schedule: Schedule
    optimizer: OptimizerConfig
    loop: Loop
    data: DataConfig
    model: ModelSource
    output: Output
    spike: SpikeGuardConfig = SpikeGuardConfig()
    moe: MoeConfig = MoeConfig()  # routing and balance of Mixture-of-Experts models (ignored by dense ones)
    notes: tuple = field(default=(), compare=False)

    @property
    def global_batch_size(self) -> int:
        return self.loop.micro_batch * self.loop.grad_accum * self.parallel.data_world_size

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch_size * self.data.max_seq_length

    @property
    def recompute_granularity(self) -> str | None:
        return self.recompute.granularity if self.recompute else None

    def to_dict(self) -> dict:
        """JSON-ready (args.json, `check --json`); the notes are listed separately."""
        d = asdict(self)
        d.pop("notes")
        return d
