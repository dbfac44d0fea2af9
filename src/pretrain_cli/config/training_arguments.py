"""The training arguments of the flat, PaddleNLP-compatible argument file: run, batches, schedule,
precision, parallelism, memory, checkpoints, logging and our extensions.

Names, types and defaults follow PaddleNLP's `paddlenlp/trainer/training_args.py` so that its
shipped JSON files parse unchanged; `argument_field` says what each key's help and support tag mean.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

from pretrain_cli.config.argument_field import arg_field as _f
from pretrain_cli.models.recompute import GRANULARITIES


@dataclass
class TrainingArguments:
    # --- run and output
    output_dir: Optional[str] = _f(None, "Where checkpoints, the final model, metrics and runs/ go. Required. The "
                                         "final export replaces the model there under transformers' names "
                                         "(model*.safetensors, pytorch_model*.bin, their indexes) and names other "
                                         "weights it leaves; one holding a model no run wrote (a download) needs "
                                         "overwrite_output_dir.")
    overwrite_output_dir: bool = _f(False, "True: no auto-resume from output_dir/checkpoint-N; when the run starts, "
                                           "the checkpoints there past the step it starts from (0, or "
                                           "resume_from_checkpoint's) are removed, and so is an earlier run's final "
                                           "model (unless the run reads its model or tokenizer there); a model no run "
                                           "wrote there (a download) stays until the final export replaces it.")
    resume_from_checkpoint: Optional[str] = _f(None, "Resume from this checkpoint directory (wins over auto-resume).")
    do_train: bool = _f(False, "Train.")
    do_eval: bool = _f(False, "Evaluate on the valid split every eval_steps.")
    do_predict: bool = _f(False, "Evaluate once on the test split at the end.")
    max_steps: int = _f(-1, "Optimizer steps to train; must be > 0.")
    num_train_epochs: float = _f(1.0, "ignored when max_steps > 0 (which is required here).", "ignored")
    seed: int = _f(42, "Seed for model init and data order.")
    device: str = _f("gpu", "cpu, gpu (falls back to cpu with a note when Paddle has no GPU build).",
                     choices=("cpu", "gpu"))
    # --- batches
    per_device_train_batch_size: int = _f(8, "Micro-batch per data-parallel rank.")
    per_device_eval_batch_size: int = _f(8, "Eval micro-batch per data-parallel rank.")
    gradient_accumulation_steps: int = _f(1, "Micro-batches per optimizer step.")
    eval_steps: Optional[int] = _f(None, "Evaluate every N optimizer steps (None or 0 = logging_steps, as PaddleNLP "
                                         "falls back).")
    evaluation_strategy: str = _f(
        "no", "steps or epoch turns on do_eval, as PaddleNLP's __post_init__ does; no leaves do_eval as set. epoch "
        "evaluates once, after the last step, eval_steps unused: PaddleNLP's epoch is one pass over run_pretrain.py's "
        "train dataset, which it builds to hold max_steps global batches, so the run is one epoch (whatever the blend "
        "and however often its sources wrap: the log names each wrap).", choices=("no", "steps", "epoch"))
    logging_strategy: str = _f("steps", "PaddleNLP's no logs nothing, its epoch logs at the end of the run; here "
                                        "logging_steps alone decides (a log line is also how a run reports progress).",
                               "ignored", choices=("no", "steps", "epoch"))
    save_strategy: str = _f(
        "steps", "steps: a checkpoint every save_steps and at the last step. epoch: one checkpoint, at the last step, "
        "save_steps unused (PaddleNLP's epoch is the whole run, as for evaluation_strategy; refused with spike_policy: "
        "rollback, which would have no checkpoint to go back to). no: accepted without effect, as steps (PaddleNLP's "
        "saves no checkpoint; here the last step is always saved: what a resume and the export read).",
        choices=("no", "steps", "epoch"))
    eval_iters: int = _f(10, "Batches per evaluation (PaddleNLP hard-codes 10).", "extension")
    dataloader_num_workers: int = _f(0, "Batches read ahead by a background thread (0 = read in the training loop; "
                                        "a micro-batch takes ~0.1 ms, so this rarely matters).")
    dataloader_drop_last: bool = _f(False, "samples are drawn from an endless index; there is never a partial "
                                           "batch.", "ignored")
    distributed_dataloader: bool = _f(False, "every rank reads its micro-batches itself from the memory-mapped token "
                                             "files (a data rank's tp and cp ranks and pipeline stages read the same "
                                             "ones): none reads for others and broadcasts.", "ignored")
    ignore_data_skip: bool = _f(False, "True: on resume, start the data from the beginning instead of where it "
                                       "stopped.")
    # --- optimizer and schedule
    learning_rate: float = _f(5e-5, "Peak learning rate.")
    min_learning_rate: float = _f(1e-5, "Learning rate at and after decay_steps (linear and cosine).")
    lr_scheduler_type: str = _f(
        "linear", "Warmup then decay to min_learning_rate; warmup_stable_decay: transformers' WSD schedule (warmup, "
        "flat at learning_rate, decay over the last num_decay_steps).",
        choices=("linear", "cosine", "constant", "constant_with_warmup", "warmup_stable_decay"))
    num_stable_steps: Optional[int] = _f(
        None, "warmup_stable_decay: steps at learning_rate after warmup (None = max_steps - warmup - num_decay_steps, "
        "so raising max_steps on resume extends the stable phase).", "extension")
    num_decay_steps: Optional[int] = _f(
        None, "warmup_stable_decay: steps of the final decay (None = 10% of max_steps).", "extension")
    min_lr_ratio: Optional[float] = _f(
        None, "warmup_stable_decay: the rate warmup starts and decay ends at, as a fraction of learning_rate "
        "(None = min_learning_rate / learning_rate).", "extension")
    decay_type: str = _f("cosine", "warmup_stable_decay: the decay's shape (transformers' decay_type).", "extension",
                         choices=("linear", "cosine", "1-sqrt"))
    warmup_steps: int = _f(0, "Warmup steps; wins over warmup_ratio when > 0.")
    warmup_ratio: float = _f(0.0, "Warmup as a fraction of max_steps, used when warmup_steps is 0.")
    decay_steps: Optional[int] = _f(None, "Step at which decay ends (None = max_steps).")
    lr_schedule_on_resume: str = _f(
        "stretch", "When a resumed run's schedule differs from its checkpoint's (max_steps raised): stretch (the new "
        "schedule from the saved step on, as PaddleNLP does), keep (the checkpoint's schedule goes on; past its "
        "decay_steps the rate stays at min_learning_rate), or restart (warmup and decay anew from the saved step "
        "over the remaining steps). The choice is printed at start. docs/TRAINING.md.", "extension",
        choices=("stretch", "keep", "restart"))
    num_cycles: float = _f(0.5, "only for PaddleNLP's own cosine scheduler, not the pretraining one.", "ignored")
    lr_end: float = _f(1e-7, "only for PaddleNLP's polynomial scheduler.", "ignored")
    power: float = _f(1.0, "only for PaddleNLP's polynomial scheduler.", "ignored")
    weight_decay: float = _f(0.0, "Decoupled AdamW weight decay; never applied to biases and norm weights.")
    adam_beta1: float = _f(0.9, "AdamW beta1.")
    adam_beta2: float = _f(0.999, "AdamW beta2.")
    adam_epsilon: float = _f(1e-8, "AdamW epsilon.")
    max_grad_norm: float = _f(1.0, "Global-norm gradient clipping; <= 0 disables.")
    optim: str = _f("adamw", "Optimizer.", choices=("adamw",))
    # --- precision
    bf16: bool = _f(False, "bfloat16 mixed precision (GPU; not applicable on CPU, where the run stays fp32).")
    fp16: bool = _f(False, "float16 mixed precision with loss scaling (GPU only).")
    fp16_opt_level: str = _f("O1", "O1: autocast over fp32 weights; O2: half weights + fp32 master weights; O0 "
                                   "(PaddleNLP's AMP level with no half-precision ops): the run is fp32.",
                             choices=("O0", "O1", "O2"))
    amp_master_grad: bool = _f(False, "O2: keep fp32 gradients for clipping and the update.")
    scale_loss: float = _f(32768.0, "Initial fp16 loss scale.")
    amp_custom_black_list: Optional[List[str]] = _f(None, "Extra ops kept in fp32 under AMP.")
    amp_custom_white_list: Optional[List[str]] = _f(None, "Extra ops forced to half precision under AMP.")
    # --- parallelism
    tensor_parallel_degree: int = _f(
        -1, "Tensor parallel degree (-1 or 1 = off): q/k/v and gate/up column-parallel, o/down row-parallel, embedding "
        "and LM head split over the vocabulary when the degree divides it; must divide the heads, KV heads, "
        "intermediate size and world size (docs/DISTRIBUTED.md).")
    pipeline_parallel_degree: int = _f(-1, "Pipeline parallel degree (-1 or 1 = off): decoder layers split into this "
                                           "many stages on fleet's 1F1B schedule, gradient_accumulation_steps "
                                           "micro-batches per step; with tensor parallelism inside the stages, data "
                                           "parallelism and ZeRO-1/2, not with ZeRO-3 (docs/DISTRIBUTED.md).")
    virtual_pp_degree: int = _f(1, "Interleaved pipeline chunks per stage; only with pipeline parallelism.")
    sequence_parallel: bool = _f(False, "Megatron sequence parallelism with tensor parallelism: norms and residuals "
                                        "cut on the sequence over the tp ranks (with dp, ZeRO-1/2, pipeline "
                                        "stages and context parallelism; not ZeRO-3; docs/DISTRIBUTED.md).")
    sharding: str = _f("", "Sharded data parallel (ZeRO): 'stage1' shards the optimizer state, 'stage2' also the "
                           "gradients, 'stage3' also the parameters; 'offload' is reported and ignored. No effect "
                           "with one process.")
    sharding_parallel_degree: int = _f(-1, "Sharding degree (-1 = every data-parallel rank, world / tp); a smaller "
                                           "degree (dp x sharding) works with stage1 without tensor parallelism.")
    sep_parallel_degree: int = _f(-1, "Segment parallel degree (> 1 refused: its all-to-all is missing on CPU; use "
                                      "context_parallel_degree).")
    context_parallel_degree: int = _f(-1, "Context parallelism: each sequence split over this many ranks, attention "
                                          "across them (with data parallelism; docs/DISTRIBUTED.md).")
    expert_parallel_degree: int = _f(1, "Expert parallelism (PaddleNLP's/PaddleFormers' key): a Mixture-of-Experts "
                                        "model's experts spread over this many of the data/ZeRO ranks, tokens "
                                        "dispatched to them (docs/DISTRIBUTED.md).")
    tensor_parallel_config: str = _f("", "PaddleNLP's TP fusion/overlap flags; Paddle's semi-auto engine places the "
                                         "collectives here.", "ignored")
    pipeline_parallel_config: str = _f("", "PaddleNLP's PP feature flags: each one is applied, or named in a note "
                                           "saying why it has no effect here (docs/DISTRIBUTED.md).")
    sharding_parallel_config: str = _f("", "fleet's sharding tuning flags (fusion, overlap, split_param); the ZeRO "
                                           "stage of `sharding` alone decides what is sharded here.", "ignored")
    data_parallel_config: str = _f("", "DP feature flags.", "ignored")
    hybrid_parallel_topo_order: Optional[str] = _f(None, "group order of the hybrid topology; here pipeline stages are "
                                                    "outermost (the link between nodes carries the stages' "
                                                    "activations).",
                                                    "ignored")
    tensor_parallel_output: bool = _f(True, "PaddleNLP's choice of vocab-split logits (true) or logits gathered over "
                                          "the tensor-parallel ranks (false), the same loss either way; here the "
                                          "layout decides: tensor parallelism splits the LM head over the vocabulary "
                                          "only without pipeline, sequence, context or expert parallelism (or "
                                          "multi-head latent attention outside ZeRO-3), of a degree dividing "
                                          "vocab_size, and keeps it whole otherwise.", "ignored")
    # --- memory and kernels
    recompute: bool = _f(False, "Activation recomputation (checkpointing).")
    recompute_granularity: str = _f(
        "full", "full: whole decoder layer; full_attn: attention block; core_attn: attention core only.",
        choices=GRANULARITIES,
    )
    recompute_use_reentrant: bool = _f(False, "Use the reentrant recompute implementation.")
    no_recompute_layers: Optional[List[int]] = _f(None, "Layer indices to leave out of recompute.")
    refined_recompute: str = _f("", "PaddleNLP's per-op refined recompute.", "ignored")
    use_flash_attention: bool = _f(
        False, "true: the fused attention path: flash-attn on GPU (fp16/bf16, Ampere or newer), which never holds the "
        "[batch, heads, seq, seq] scores; on CPU pretrain-cli's block-causal kernel (faster; it keeps fp32 "
        "probabilities for backward, only of the keys each query block multiplies: about half the scores' memory). "
        "false: the math path that materialises the scores, on every device.")
    use_fused_rms_norm: bool = _f(False, "Paddle's fused RMSNorm (GPU; reference path elsewhere). No custom op to "
                                         "build.")
    use_fused_rope: bool = _f(False, "Paddle's fused rotary embedding (GPU; reference path elsewhere).")
    use_fused_linear_cross_entropy: bool = _f(
        True, "true: the LM head and cross-entropy computed together over chunks of tokens, never holding the "
        "[tokens, vocab] logits or their gradient (~5 GB fp32 at 151,936 x 8192 tokens); a C++ kernel on CPU, "
        "Paddle's ops on GPU; same loss. false: the logits, then the loss. PaddleNLP's default is false (its "
        "version is a Triton GPU kernel). Not set: on CPU true (the C++ kernel is faster); on a GPU, where it only "
        "saves memory, true only where plan's memory model gives the fused head + loss (the head's fp32 dW) less "
        "than the logits for the run's tokens at the head, about where a micro-batch holds more tokens than the "
        "hidden size, else false with a note giving both (plan models the same choice). Only a vocabulary-split "
        "head (semi-auto tensor parallelism whose degree divides vocab_size) keeps the unfused loss when set true; "
        "every other layout runs it: ZeRO-1/2/3, pipelines, and tensor parallelism that keeps the head whole (the "
        "layout steps' split, or a vocabulary the degree does not divide).")
    enable_linear_fused_grad_add: bool = _f(False, "PaddleNLP fused linear-grad-add layers.", "ignored")
    offload_optim: bool = _f(False, "PaddleNLP/PaddleFormers move the optimizer state to host memory between steps; "
                                    "here it stays in device memory (where `plan` counts it).", "ignored")
    autotuner_benchmark: bool = _f(False, "PaddleNLP autotuner mode.", "ignored")
    # --- checkpoints
    save_steps: int = _f(500, "Save output_dir/checkpoint-N every N optimizer steps.")
    save_total_limit: Optional[int] = _f(None, "Keep at most this many checkpoint-N directories (newest kept).")
    unified_checkpoint: bool = _f(True, "checkpoints are always unified (topology-free safetensors) here.", "ignored")
    unified_checkpoint_config: str = _f("", "PaddleNLP's unified-checkpoint flags (an unknown one is refused, as "
                                            "PaddleNLP does): async_save or enable_all_options saves in the "
                                            "background as async_save: true does; the others concern PaddleNLP's "
                                            "master-weight files and are noted as having no effect.")
    save_on_each_node: bool = _f(
        False, "every rank writes its own checkpoint pieces into one shared output_dir; rank 0 publishes it "
        "(docs/CHECKPOINTS.md).", "ignored")
    export_dtype: str = _f(
        "auto", "dtype of the final export's weights in output_dir (`pretrain-cli export --dtype` for any checkpoint): "
        "auto = the training precision's half dtype (bf16/fp16 runs), float32 on fp32 and CPU runs.", "extension",
        choices=("auto", "bfloat16", "float16", "float32"))
    # --- logging
    logging_steps: int = _f(500, "Log every N optimizer steps.")
    logging_first_step: bool = _f(True, "Also log after the first step, so the starting loss is visible (PaddleNLP's "
                                        "default is false: first line at step logging_steps).")
    logging_dir: Optional[str] = _f(None, "VisualDL and TensorBoard directory (None = output_dir/runs).")
    report_to: Optional[List[str]] = _f(
        None, "Trackers: visualdl (default), tensorboard, wandb (WANDB_MODE=offline: a local run for `wandb sync`), "
        "all (the installed ones), none; a string or a list.")
    disable_tqdm: Optional[bool] = _f(
        None, "True: plain log lines only; False: also a progress bar with ETA; None: the bar only when stderr is a "
              "terminal."
    )
    skip_memory_metrics: bool = _f(True, "False: add host/device memory fields to the log line (on CPU they are "
                                         "always there).")
    log_on_each_node: bool = _f(True, "only global rank 0 logs here.", "ignored")
    run_name: Optional[str] = _f(None, "trackers name the run by output_dir here.", "ignored")
    skip_profile_timer: bool = _f(True, "PaddleNLP's per-phase timers; the log line's timings are the step's.",
                                  "ignored")
    # --- extensions
    nan_policy: str = _f(
        "stop", "Non-finite loss or gradient: stop (save nothing corrupt, report the step) or skip the update.",
        "extension", choices=("stop", "skip"),
    )
    nan_skip_limit: int = _f(5, "With nan_policy skip (or spike_policy skip): stop after this many consecutive "
                                "skipped steps.", "extension")
    spike_policy: str = _f(
        "none", "A finite loss or gradient norm far above its running mean (a spike): none (not watched), skip the "
        "update (the batch is consumed), rollback to the newest checkpoint and skip the batches that produced it, or "
        "stop without saving. docs/TRAINING.md#loss-spikes.", "extension",
        choices=("none", "skip", "rollback", "stop"),
    )
    spike_loss_factor: float = _f(2.0, "A step is a spike when its loss exceeds this factor times the running mean "
                                        "loss (0: the loss is not checked).", "extension")
    spike_grad_norm_factor: float = _f(10.0, "... or its gradient norm exceeds this factor times the running mean "
                                             "gradient norm (0: not checked).", "extension")
    spike_warmup_steps: int = _f(100, "Accepted steps whose statistics are gathered before spikes are judged "
                                      "(the first steps of a run are noisy by nature).", "extension")
    spike_window: int = _f(50, "Span in steps of the running means (an exponential moving average with weight "
                               "1/spike_window; the plain mean of the steps so far until there are that many).",
                           "extension")
    spike_rollback_steps: int = _f(1, "With spike_policy rollback: batches skipped, counted back from the spike's "
                                      "own (never before the checkpoint rolled back to).", "extension")
    async_save: bool = _f(False, "Copy weights and optimizer state to host memory at a save and write "
                                 "checkpoint-N/ in a background thread while training continues (one save in "
                                 "flight; the end of training and SIGTERM wait for it).", "extension")
    hang_timeout: Optional[float] = _f(
        None, "Seconds a rank of a multi-process run may make no progress (in its data, forward/backward, collective, "
        "save or eval phase) before it is named and the job ends with exit 124 (0: not watched). Default: 300, or 20 "
        "steps when the run's steps are slower; start-up, a save and an evaluation at least 600. It is also the "
        "start-up allowance of the nodes' join under scripts/launch.sh on several nodes: a node whose ranks have not "
        "all reached the join of the process group this long (at least 600 s; 0: no limit) after this node's ranks "
        "did is named, and every node ends with exit 124. docs/RELIABILITY.md.", "extension",
    )
    peak_tflops: Optional[float] = _f(
        None, "Peak dense TFLOPS of one device for MFU (default: the known-GPU table; on CPU the cores' "
        "theoretical fp32 peak, an upper bound).",
        "extension",
    )
    cpu_fused_ops: bool = _f(
        True, "On CPU: pretrain-cli's fused multi-threaded kernels (RMSNorm, RoPE, causal softmax, SwiGLU, "
        "cross-entropy), compiled with g++ on first use; false = Paddle's own ops.", "extension",
    )
    to_static: bool = _f(False, "Compile the forward with paddle.jit.to_static (SOT); same losses, faster on CPU.",
                         "extension")
    cpu_fused_optimizer: bool = _f(
        True, "On CPU, fp32, one process or plain data parallel, with cpu_fused_ops: the gradient norm, clipping and "
        "AdamW as one threaded pass over all parameters (Paddle's AdamW arithmetic, its optimizer state); "
        "false = Paddle's per-parameter AdamW kernels.", "extension",
    )
