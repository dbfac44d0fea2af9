"""PaddleNLP's (and PaddleFormers') keys that are not fields of our argument dataclasses, and PaddleNLP's flag
strings.

PaddleNLP's `TrainingArguments` (paddlenlp/trainer/training_args.py) has more fields than a pretraining run
uses, and its shipped argument files set some of them (`eval_accumulation_steps` in
llm/llama/pretrain-llama_13b-pp4tp2sd2_stage1.json; the legacy llm/llama/run_pretrain.py's `model_type`,
`config_name`, `pp_recompute_interval`). PaddleFormers, its successor, renamed the parallel degrees Megatron's
way (`tensor_model_parallel_size`, ...), promoted the flags of the `*_parallel_config` strings to keys of their own
(`use_dualpipev`, `overlap_p2p_comm`, `split_param`), and its pretraining files (examples/experiments/*_pretrain/
config/pretrain_argument.json and .yaml, examples/best_practices/DeepSeek-V3/pretrain/config/pretrain_argument.yaml)
use those names and a few keys of its own. They parse here, so those files run: `IGNORED` holds each key without
effect here with its default there and why it changes nothing here (a value other than the default is a note; a
promoted flag, `SWITCHES`, is a note when it asks for its feature), `ALIASES` the ones that are another name for one
of our keys (`ALIAS_OF`: whose name it is; `ATTENTION` reads PaddleFormers' attention implementation as
`use_flash_attention`), `REFUSED` the values of a key without effect here that would change the training if run
without it (refused by the parser, one line each); `PADDLEFORMERS_IGNORED` and PaddleFormers' aliases are keys only
its files have (`config.paddleformers_keys`: its data pipeline and its defaults). They are no dataclass fields, so
they never reach `args.json`, but for the ones the layout takes (`NOTED_BY_LAYOUT`:
`config.expert.recorded`), which a run from the record must take as well.

`FLAGS` are the values PaddleNLP accepts in its space- or comma-separated `*_config` strings; it raises
`ValueError("Found unknown … config …")` for any other (training_args.py `__post_init__`), and so does `check`
here, where PaddleNLP would have refused the file too.
"""
from __future__ import annotations

import json

from pretrain_cli.config.pipeline import PP_FLAGS
from pretrain_cli.counts import count
from pretrain_cli.errors import UserError

# data_parallel_degree's and data_parallel_size's (`config.parallel`'s refusal, by `one_process.stated_unmet`'s rule;
# one process checks a file for many)
DATA_RANKS_COMPUTED = ("computed from the world size and the other degrees, so a stated value sets nothing: it is "
                       "checked, and a value above 1 that they do not give is refused on more than one process (the "
                       "run would train on another global batch than the file's): given as PaddleNLP's dp, world / "
                       "(sharding_parallel_degree x tp x sep x cp x pp), as PaddleFormers' data_parallel_size is "
                       "too, or, under a stage sharding over every data rank (-1), as the data ranks")
# key -> (PaddleNLP's default, why it has no effect here)
PADDLENLP_IGNORED = {
    "model_type": ("llama", "the legacy llm/llama/run_pretrain.py's model class; here config.json's model_type "
                            "decides"),
    "config_name": (None, "the legacy separate config path; here model_name_or_path's config.json (or preset) is it"),
    "pp_recompute_interval": (1, "the legacy pipeline recompute interval; recompute and no_recompute_layers decide"),
    "eval_accumulation_steps": (None, "HF's prediction accumulation; evaluation here computes the loss only"),
    "prediction_loss_only": (False, "evaluation here computes the loss only"),
    "bf16_full_eval": (False, "evaluation runs in the training precision"),
    "fp16_full_eval": (False, "evaluation runs in the training precision"),
    "do_export": (False, "PaddleNLP's static-graph export; the final model is exported as an HF directory "
                         "(`pretrain-cli export` for any checkpoint)"),
    "release_grads": (False, "fleet's release of gradient buffers; the trainer clears the gradients after each step"),
    "sequence_parallel_config": ("", "the semi-auto engine's sequence-parallel flags"),
    "fuse_sequence_parallel_allreduce": (False, "a GPU fusion of the sequence-parallel all-reduce"),
    "max_evaluate_steps": (-1, "eval_iters sets the batches of each evaluation"),
    "load_best_model_at_end": (False, "the last step is exported; there is no best-model selection"),
    "metric_for_best_model": (None, "there is no best-model selection"),
    "greater_is_better": (None, "there is no best-model selection"),
    "ckpt_quant_stage": ("O0", "checkpoint quantization; checkpoints here keep the training precision"),
    "sharding_comm_buffer_size_MB": (-1, "fleet's sharding fusion buffer size"),
    "skip_data_intervals": (None, "PaddleNLP's skipped data ranges; spike_policy rollback skips the batches of a "
                                  "spike"),
    "local_rank": (-1, "the launcher sets each process's rank"),
    "ddp_find_unused_parameters": (None, "every parameter takes part in each step"),
    "lazy_data_processing": (True, "token files are memory-mapped; nothing is processed ahead"),
    "no_cuda": (False, "`device` decides"),
    "past_index": (-1, "HF's past-state index; causal LMs here keep none"),
    "remove_unused_columns": (True, "batches hold input_ids and labels only"),
    "label_names": (None, "the labels are the shifted input_ids"),
    "ignore_load_lr_and_optim": (False, "a resume restores the optimizer and schedule whole"),
    "ignore_save_lr_and_optim": (False, "checkpoints always hold the optimizer and schedule (a resume is exact)"),
    "minimum_eval_times": (None, "eval_steps sets how often evaluation runs"),
    "output_signal_dir": (None, "PaddleNLP's async-save signal files; the checkpoint index marks completion here"),
    "metrics_output_path": (None, "metrics go to output_dir/metrics.jsonl"),
    "flatten_param_grads": (False, "a static-graph option"),
    "save_sharded_model": (False, "every rank writes its own pieces already (docs/CHECKPOINTS.md)"),
    "load_sharded_model": (False, "any checkpoint loads on any layout (docs/CHECKPOINTS.md)"),
    "ordered_save_group_size": (0, "every rank writes its pieces at once"),
    "wandb_api_key": (None, "wandb reads WANDB_API_KEY from the environment"),
    "enable_auto_parallel": (False, "the layout's engine is chosen from the degrees (docs/DISTRIBUTED.md)"),
    "sharding_parallel_mesh_dimension": ("dp", "the semi-auto engine's mesh axis for sharding"),
    "expert_max_capacity": (None, "capacity_factor bounds an expert's tokens here"),
    "expert_min_capacity": (None, "capacity_factor bounds an expert's tokens here"),
    "force_reshard_pp": (False, "any checkpoint loads on any pipeline layout"),
    "save_sharding_stage1_model_include_freeze_params": (False, "every parameter trains"),
    "pdc_download_ckpt": (False, "Baidu PDC storage"),
    "pipeline_schedule_mode": ("1F1B", "fleet's 1F1B schedule runs (interleaved with virtual_pp_degree > 1)"),
    "use_fused_dropout_add": (False, "Llama and Qwen have no dropout"),
    "use_fused_linear": (False, "PaddleNLP's fused linear layer of its GPT-3 model (matmul + bias add as one GPU "
                                "op); the projections here run as the `kernels:` line names them"),
    "log_level": ("passive", "rank 0 logs at INFO"),
    "log_level_replica": ("warning", "only global rank 0 logs"),
    "save_safetensors": (True, "checkpoints are safetensors always"),
    "data_parallel_degree": (1, DATA_RANKS_COMPUTED),
}
# PaddleFormers' keys of its own (no PaddleNLP file has them) -> (its default, why it has no effect here)
PADDLEFORMERS_IGNORED = {
    # its pretraining files' keys
    "data_parallel_size": (1, DATA_RANKS_COMPUTED),
    "reorder_pipeline_priority": (False, "PaddleFormers' sharding-before-pipeline rank order; here pipeline stages "
                                         "are outermost"),
    "using_fake_gate": (False, "PaddleFormers' benchmark stand-in for the router's logits (its FakeGate); the "
                               "router here always routes by its own scores"),
    "num_nextn_predict_layers": (None, "config.json's num_nextn_predict_layers decides the multi-token prediction "
                                       "modules here (mtp_loss_weight their loss's weight)"),
    # PaddleFormers' paddleformers-cli keys (its ModelArguments' `stage`, TrainingArguments' promoted flags)
    "stage": ("SFT", "PaddleFormers' choice of workflow; pretrain-cli runs pretraining from .bin/.idx token files "
                     "whatever the stage (a stage that is not pretraining is refused)"),
    "use_dualpipev": (False, PP_FLAGS["use_dualpipev"]),
    "overlap_p2p_comm": (True, PP_FLAGS["enable_overlap_p2p_comm"]),
    "split_param": (True, "fleet's sharding stage1 V2 (each rank owning an even slice of one flat buffer of the "
                          "parameters); sharding: stage1 here is fleet's V1 (each rank owning whole parameters), the "
                          "same update"),
    "pre_alloc_memory": (0, "PaddleFormers allocates and frees this many GiB of device memory at start (one large "
                            "block against fragmentation); memory here is allocated as the run needs it"),
    "moe_router_force_load_balancing": (False, "false routes every token by the router's own scores, as here "
                                               "(true is refused)"),
    # its stage PT files' keys (examples/config/pt/*.yaml: ModelArguments, TrainingArguments)
    "fine_tuning": ("LoRA", "PaddleFormers' choice of LoRA adapters or full training; every parameter trains here "
                            "(LoRA is refused)"),
    "recompute_method": (None, "Megatron's choice of recomputed layers: uniform recomputes every layer in units of "
                               "recompute_num_layers layers, block only the first recompute_num_layers layers of each "
                               "pipeline stage; recompute: true here recomputes every layer, each its own unit "
                               "(no_recompute_layers leaves some out)"),
    "recompute_num_layers": (None, "the layers of one recompute unit (uniform) or of each stage (block); here each "
                                   "layer is its own unit, as uniform with 1"),
    "save_checkpoint_format": ("flex_checkpoint", "checkpoints here are pretrain-cli's safetensors pieces with an "
                                                  "index, which load on any layout (docs/CHECKPOINTS.md)"),
    "load_checkpoint_format": ("flex_checkpoint", "any checkpoint of pretrain-cli loads on any layout "
                                                  "(docs/CHECKPOINTS.md)"),
    "moe_token_dispatcher_type": ("alltoall", "PaddleFleet's sending of tokens to the expert-parallel ranks "
                                              "(deepep: DeepEP's GPU kernels); expert_parallel_degree's own dispatch "
                                              "runs here (docs/DISTRIBUTED.md)"),
    "batch_p2p_comm": (None, PP_FLAGS["disable_non_batch_p2p_comm"]),
    "clear_every_step_cache": (False, "nothing is cached between a pipeline's steps here"),
    "partial_send_recv": (True, PP_FLAGS["disable_partial_send_recv"]),
    "tp_sync_param": (False, "parameters that are not split over tensor-parallel ranks are kept equal by equal "
                             "updates of whole gradients; none is broadcast after the step"),
    "sync_grad": (False, "gradients of parameters that are not split over tensor-parallel ranks are whole on every "
                         "tp rank already; none is broadcast"),
    "global_batch_size": (None, "computed: per_device_train_batch_size x gradient_accumulation_steps x data ranks "
                                "(`check` prints it), as PaddleFormers' FinetuningArguments recomputes it over the "
                                "file's value (PaddleNLP's run_pretrain.py has no such key); a value other than that "
                                "is a note naming the batch the run trains at and the accumulation that gives the "
                                "file's value (on one data rank, as `check` without --world_size, first the data "
                                "ranks it is the batch of at this accumulation: a file meant for many)"),
    "pad_token_id": (0, "the padding token's id; packed samples hold no padding, and padded samples (sample_mode: "
                        "padded) take the tokenizer's pad token"),
    "tensorwise_offload_optimizer": (False, "PaddleFormers moves the optimizer state to host memory between steps; "
                                            "here it stays in device memory (where `plan` counts it)"),
    "moe_deep_gemm": (False, "DeepGEMM's FP8 grouped GEMM for the experts (GPU); the experts run as one grouped "
                             "computation in the training precision here"),
}
# PaddleNLP's keys without a field here that take effect through the layout (`config.expert.paddlenlp_expert_parallel`;
# args.json records them, `config.expert.recorded`): key -> (PaddleNLP's default, what it does). Parsed as IGNORED's.
TAKEN_BY_LAYOUT = {
    "use_expert_parallel": (False, "PaddleNLP's older MoELayer (default moe_group 'data') spreads the experts over its "
                                   "data-parallel group, expert parallelism of the dp degree, whatever this key says; "
                                   "its DeepseekV2MoE's moe_group 'expert' is sized by expert_parallel_degree. Here "
                                   "true without expert_parallel_degree (or with -1, PaddleNLP's unset value) spreads "
                                   "them over the dp ranks where the layout runs that, and one note says so, or why "
                                   "not and what to set; a stated expert_parallel_degree decides"),
}
IGNORED = {**PADDLENLP_IGNORED, **PADDLEFORMERS_IGNORED, **TAKEN_BY_LAYOUT}

# PaddleFormers' flags of the `*_parallel_config` strings promoted to keys: a note when one asks for its feature
# (true), whatever its default there (`overlap_p2p_comm` and `split_param` are on by default there: a file that
# sets them asks for them, as its flag string did)
SWITCHES = ("use_dualpipev", "overlap_p2p_comm", "split_param")

# PaddleFormers' `stage`s that pretrain a text model: dsv3_pretrain and auto-parallel read .bin/.idx token files
# as run_pretrain.py does; PT and PT-V2 are its pretraining through the SFT workflow's data (their data keys are
# not read here); ernie_pretrain's model is refused by its config.json
PRETRAINING_STAGES = ("PT", "PT-V2", "dsv3_pretrain", "auto-parallel", "ernie_pretrain")
FALSE = ("false", "f", "no", "n", "0", "off")


def _shown(value) -> str:
    """A bool as the file writes it (`true`), anything else as it came."""
    return json.dumps(value) if isinstance(value, bool) else repr(value)


# values of a key without effect here that are what runs here, so no note: key -> (test, the values, as the doc says)
AS_HERE = {"fine_tuning": (lambda v: str(v).strip().lower() != "lora", "any value but LoRA: full training"),
           "recompute_method": (lambda v: str(v).strip() == "uniform", "uniform"),
           "recompute_num_layers": (lambda v: str(v).strip() == "1", "1")}

# keys whose note the layout's resolution gives, as they may have an effect (`config.expert.paddlenlp_expert_parallel`)
NOTED_BY_LAYOUT = frozenset(TAKEN_BY_LAYOUT)
# key -> (whether a value is refused, why): a key without effect here whose other values change what is trained
REFUSED = {
    "stage": (lambda v: str(v) not in PRETRAINING_STAGES,
              lambda v: f"stage: {v!r} is not pretraining (PaddleFormers' SFT, DPO and vision-language stages train "
                        f"chat, preference or image data with their own losses, which pretrain-cli does not build); "
                        f"for a pretraining run set it to one of {', '.join(PRETRAINING_STAGES)}, or leave it out"),
    "moe_router_force_load_balancing": (
        lambda v: str(v).strip().lower() not in FALSE,
        lambda v: f"moe_router_force_load_balancing: {_shown(v)} routes every token by random router logits "
                  f"(PaddleFleet's and Megatron's benchmark mode: a throughput measurement, the router learns "
                  f"nothing), which is not built here; set it to false (routing by the router's scores) or leave "
                  f"it out"),
    "fine_tuning": (lambda v: str(v).strip().lower() == "lora",
                    lambda v: f"fine_tuning: {v!r} trains LoRA adapters beside a frozen model (PaddleFormers' "
                              f"default), which pretrain-cli does not build; set it to full (every parameter trains, "
                              f"as here)"),
}

# another project's name -> our key (`ALIAS_OF`: whose name it is)
ALIASES = {"sharding_degree": "sharding_parallel_degree", "use_async_save": "async_save",
           # PaddleNLP's DeepSeek-V3 config's λ of the multi-token prediction loss (its default 1.0; ours 0.3)
           "num_nextn_predict_lambda": "mtp_loss_weight",
           # PaddleFormers' training arguments (Megatron's names for the degrees) and model arguments
           "tensor_model_parallel_size": "tensor_parallel_degree",
           "pipeline_model_parallel_size": "pipeline_parallel_degree",
           "virtual_pipeline_model_parallel_size": "virtual_pp_degree",
           "sharding_parallel_size": "sharding_parallel_degree", "sep_parallel_size": "sep_parallel_degree",
           "context_parallel_size": "context_parallel_degree", "expert_model_parallel_size": "expert_parallel_degree",
           "fuse_rms_norm": "use_fused_rms_norm", "apply_rope_fusion": "use_fused_rope",
           # its DataArguments' sequence length (the token dataset's seq_length, as PaddleNLP's max_seq_length) and
           # its TrainingArguments' floor of the linear and cosine schedules (an absolute rate, not a ratio)
           "max_seq_len": "max_seq_length", "min_lr": "min_learning_rate",
           # its attention implementation (ModelArguments' attn_impl, later _attn_implementation): `ATTENTION`
           "attn_impl": "use_flash_attention", "_attn_implementation": "use_flash_attention"}
ALIAS_OF = {key: "PaddleNLP" if key in ("sharding_degree", "use_async_save", "num_nextn_predict_lambda")
            else "PaddleFormers" for key in ALIASES}

# PaddleFormers' attention implementations -> use_flash_attention: flashmask (its default) and sdpa (Paddle's
# scaled_dot_product_attention, which takes the flash-attn kernel on GPU) never hold the [b, heads, s, s] scores,
# eager materialises them; sink (learned attention sinks) belongs to models not built here
ATTENTION = {"flashmask": True, "sdpa": True, "eager": False}

FLAGS = {
    "tensor_parallel_config": ("enable_mp_async_allreduce", "enable_mp_skip_c_identity",
                               "enable_mp_fused_linear_param_grad_add", "enable_sp_async_reduce_scatter",
                               "enable_delay_scale_loss", "sync_param", "sync_grad", "sync_moment"),
    "sharding_parallel_config": ("enable_stage1_tensor_fusion", "enable_stage1_overlap", "enable_stage2_overlap",
                                 "split_param", "disable_stage1_reduce_avg", "enable_stage1_broadcast_overlap",
                                 "enable_stage1_allgather_overlap", "enable_release_grads"),
    "data_parallel_config": ("enable_allreduce_avg_in_gradinent_scale", "gradient_sync_after_accumulate"),
    "unified_checkpoint_config": ("skip_save_model_weight", "master_weight_compatible", "remove_master_weight",
                                  "async_save", "enable_all_options", "ignore_merge_optimizer"),
}
TOPO_ORDERS = ("pp_first", "sharding_first")


def whose(key: str) -> str:
    """"PaddleNLP's" or "PaddleFormers'": the project an alias is the name of, as a possessive."""
    project = ALIAS_OF[key]
    return project + ("'" if project.endswith("s") else "'s")


def differs(key: str, value) -> bool:
    """Whether an IGNORED key's value calls for a note: other than PaddleNLP's default (`"False"` on a command line
    is False), or for a `SWITCHES` key, true; never a value `AS_HERE` (what runs here)."""
    if key in AS_HERE:
        return not AS_HERE[key][0](value)
    if key in SWITCHES:
        return str(value).strip().lower() not in FALSE
    default = IGNORED[key][0]
    return str(value).strip().lower() != str(default).lower()


def attention(key: str, value, where: str) -> tuple[bool, str]:
    """PaddleFormers' attention implementation (`attn_impl`, `_attn_implementation`) as use_flash_attention, with
    its note; another one raises."""
    if value not in ATTENTION:
        raise UserError(f"{where}: {key}: {value!r} is not an attention implementation run here; set it to one of "
                        f"{', '.join(ATTENTION)} (flashmask and sdpa: use_flash_attention true, eager: false)")
    on = ATTENTION[value]
    return on, (f"{key}: {value} read as use_flash_attention: {json.dumps(on)} (the attention path that "
                f"{'never holds' if on else 'materialises'} the [batch, heads, seq, seq] scores)")


def check_value(key: str, value, where: str) -> None:
    """Raises for a value of an IGNORED key that `REFUSED` refuses (the parser reports it with the file's other
    problems)."""
    if key in REFUSED and REFUSED[key][0](value):
        raise UserError(f"{where}: {REFUSED[key][1](value)}")


def flags(text) -> list[str]:
    """PaddleNLP's `split_parallel_config`: comma- or space-separated."""
    return str(text or "").replace(",", " ").split()


def check_flags(args, parallel, problems, notes) -> bool:
    """Each `*_config` flag against PaddleNLP's list where PaddleNLP checks it (tensor parallelism's with tp > 1,
    sharding's with a sharding degree > 1, data parallelism's with more than one data rank; the unified
    checkpoint's always), and `hybrid_parallel_topo_order`. Returns whether checkpoints are saved in the background:
    `unified_checkpoint_config`'s `async_save` (or `enable_all_options`) asks for it unless `async_save` is set."""
    t = args.training
    checked = {"tensor_parallel_config": parallel.tp_degree > 1,
               "sharding_parallel_config": parallel.sharding_degree > 1,
               "data_parallel_config": parallel.data_world_size > 1, "unified_checkpoint_config": True}
    for key, known in FLAGS.items():
        if not checked[key]:  # PaddleNLP reads no flag of an axis the run does not have
            continue
        for flag in flags(getattr(t, key)):
            if flag not in known:
                problems.add(f"{key}: unknown flag {flag!r} (PaddleNLP refuses it too); known: {', '.join(known)}")
    order = t.hybrid_parallel_topo_order
    if order is not None and order not in TOPO_ORDERS:
        problems.add(f"hybrid_parallel_topo_order: must be one of {', '.join(TOPO_ORDERS)}, got {order!r}")
    uc = flags(t.unified_checkpoint_config)
    for flag in uc:
        if flag in FLAGS["unified_checkpoint_config"] and flag not in ("async_save", "enable_all_options"):
            notes.append(f"unified_checkpoint_config: {flag} has no effect here: checkpoints hold the weights and "
                         f"the optimizer state whole (docs/CHECKPOINTS.md)")
    if ("async_save" in uc or "enable_all_options" in uc) and "async_save" not in args.explicit:
        notes.append("unified_checkpoint_config: async_save: checkpoints are written in the background "
                     "(as async_save: true)")
        return True
    return t.async_save


def global_batch(value, micro: int, acc: int, ranks: int) -> str | None:
    """The note for a `global_batch_size` other than the batch the run trains at, else None. PaddleFormers'
    FinetuningArguments (paddleformers-cli's parser, whatever the stage) overwrites the file's value with
    per_device_train_batch_size x dataset_world_size x gradient_accumulation_steps, so the run does not train at it:
    a Megatron-LM user, whose --global-batch-size sets the accumulation, reads the batch here and how to get theirs.
    On one data rank (`check` without --world_size too, of a file meant for many) the value may be the batch of
    more ranks, so the note names those first and qualifies the accumulation it gives."""
    batch = micro * acc * ranks
    wanted = _whole(value)
    if value is None or wanted == batch or (isinstance(wanted, int) and wanted <= 0):  # (ERNIE's -1: not set)
        return None
    per_step = micro * ranks
    if isinstance(wanted, str):
        how = wanted
    elif wanted % per_step == 0:
        implied = (f"{value} is the batch of {count(wanted // (micro * acc), 'data rank')} at this accumulation; "
                   if ranks == 1 and wanted % (micro * acc) == 0 else "")
        how = (f"{implied}for {value} set gradient_accumulation_steps {wanted // per_step}"
               f"{' on one data rank' if ranks == 1 else ''}")
    else:
        how = (f"{value} is no multiple of per_device_train_batch_size x data ranks ({per_step}), so no "
               f"gradient_accumulation_steps gives it")
    return (f"global_batch_size: accepted but has no effect here: the run trains at {count(batch, 'sequence')} a step "
            f"(per_device_train_batch_size {micro} x gradient_accumulation_steps {acc} x {count(ranks, 'data rank')}), "
            f"not {value}: PaddleFormers' FinetuningArguments recomputes it over the file's value as that product "
            f"(PaddleNLP's run_pretrain.py has no such key); {how}")


def _whole(value) -> int | str:
    """`value` as a whole number (8, "8", 8.0, "8.0"), else what it is instead, said for the note."""
    try:
        number = float(str(value).strip())
    except ValueError:
        return f"{value} is not a number"
    if not number.is_integer():
        return f"{value} is not a whole number of sequences"
    return int(number)


def notes_for(args, data_ranks: int) -> list[str]:
    """The notes for the PaddleNLP and PaddleFormers keys the parser set aside (`Arguments.extra`) and the aliases
    it read; `data_ranks`, the run's, for `global_batch_size`'s."""
    t = args.training
    out = list(args.rewritten)
    out += [f"{key}: read as {ALIASES[key]} ({whose(key)} name for it)" for key in args.aliased
            if ALIASES[key] != "use_flash_attention"]  # (their values are read: `attention`'s note)
    for key, value in args.extra.items():
        if key == "global_batch_size":
            out += [n for n in [global_batch(value, t.per_device_train_batch_size, t.gradient_accumulation_steps,
                                             data_ranks)] if n]
        elif differs(key, value) and IGNORED[key][1] == DATA_RANKS_COMPUTED:  # checked: not "no effect"
            out.append(f"{key}: {value}: {DATA_RANKS_COMPUTED}")
        elif differs(key, value) and key not in NOTED_BY_LAYOUT:
            out.append(f"{key}: accepted but has no effect here: {IGNORED[key][1]}")
    return out
