"""Megatron-LM's argument names (megatron/training/arguments.py), each with the key that says it here.

A user who pretrained with Megatron-LM writes its flags from memory (`--data-path`, `--seq-length`,
`--micro-batch-size`, `--train-iters`, `--lr-decay-style`) as keys of the argument file or `--key value` overrides.
The nearest spelling among our keys is often another key (`train_iters`: `eval_iters`; `data_path`: `data_cache`;
`vocab_file`: `vocab_size`), which sends them astray; the unknown-key line names the key to use instead
(`config.parser._unknown`, in one line), or, on the command line of a command with its own argument for one
(`preprocess --tokenizer`, `inspect-data`'s positional prefix), that argument (`OPTION`, `cli`'s unknown-option
line). Only names that are not keys here are listed: Megatron names that are keys
with the same meaning (`split`, `seed`, `eval_iters`, `weight_decay`, `bf16`, `sequence_parallel`) are read, in
either spelling; PaddleFormers' Megatron-style degrees (`tensor_model_parallel_size`, ...) are read as its aliases,
and its `global_batch_size` with a note (`paddlenlp_keys.global_batch`: PaddleFormers recomputes it), so only their
hyphenated spellings reach this table: Megatron's `--global-batch-size` is the batch Megatron trains at (it sets
the accumulation), which here would be recomputed, so it is refused with the key that sets it. The parser's order
(a known name first) decides; COMPATIBILITY.md names them from these tables (`scripts/gen_compat_doc.py`).
"""
from __future__ import annotations

_BATCH = "per_device_train_batch_size x gradient_accumulation_steps x data ranks"
_STEPS = f"max_steps (optimizer steps; samples / ({_BATCH}))"

# Megatron's name (underscores) -> what to set here
MEGATRON = {
    "data_path": 'input_dir (the same forms as one value: a prefix, a blend "0.3 prefix_a 0.7 prefix_b" quoted on '
                 "the command line, or a directory)",
    "train_data_path": "input_dir and split (one source or blend cut into train/valid/test)",
    "valid_data_path": "input_dir and split (one source or blend cut into train/valid/test)",
    "test_data_path": "input_dir and split (one source or blend cut into train/valid/test)",
    "data_cache_path": "data_cache",
    "seq_length": "max_seq_length",
    "encoder_seq_length": "max_seq_length",
    "micro_batch_size": "per_device_train_batch_size",
    "num_layers": "num_hidden_layers (it overrides the model's config.json)",
    "global_batch_size": f"gradient_accumulation_steps: the global batch is {_BATCH}",
    "train_iters": "max_steps",
    "train_samples": _STEPS,
    "lr": "learning_rate",
    "min_lr": "min_learning_rate",
    "lr_decay_style": "lr_scheduler_type (linear, cosine, constant; WSD: warmup_stable_decay with decay_type)",
    "lr_decay_iters": "decay_steps",
    "lr_decay_samples": "decay_steps (optimizer steps)",
    "lr_warmup_iters": "warmup_steps",
    "lr_warmup_samples": "warmup_steps (optimizer steps)",
    "lr_warmup_fraction": "warmup_ratio",
    "lr_wsd_decay_style": "decay_type (with lr_scheduler_type warmup_stable_decay)",
    "lr_wsd_decay_iters": "num_decay_steps (with lr_scheduler_type warmup_stable_decay)",
    "clip_grad": "max_grad_norm",
    "adam_eps": "adam_epsilon",
    "save": "output_dir (checkpoints are written under it as checkpoint-N)",
    "load": "output_dir (a run resumes from its newest checkpoint-N) or resume_from_checkpoint",
    "save_interval": "save_steps",
    "eval_interval": "eval_steps",
    "log_interval": "logging_steps",
    "tensorboard_dir": "logging_dir (with report_to tensorboard)",
    "tokenizer_model": "tokenizer_name_or_path (a directory with tokenizer.json, or vocab.json + merges.txt)",
    "tokenizer_type": "tokenizer_name_or_path (a directory with tokenizer.json, or vocab.json + merges.txt)",
    "vocab_file": "tokenizer_name_or_path (a directory with tokenizer.json, or vocab.json + merges.txt)",
    "merge_file": "tokenizer_name_or_path (a directory with tokenizer.json, or vocab.json + merges.txt)",
    "use_flash_attn": "use_flash_attention",
    "recompute_activations": "recompute (with recompute_granularity core_attn)",
    "use_distributed_optimizer": 'sharding "stage1" with sharding_parallel_degree',
    "tensor_model_parallel_size": "tensor_parallel_degree",
    "pipeline_model_parallel_size": "pipeline_parallel_degree",
    "virtual_pipeline_model_parallel_size": "virtual_pp_degree",
    "context_parallel_size": "context_parallel_degree",
    "expert_model_parallel_size": "expert_parallel_degree",
    "reset_attention_mask": ("attention_mask_type document (in a file made with --split-sentences the mask resets at "
                             "each sentence, not each document)"),
    "eod_mask_loss": ("no key: the token after each EOS (the next document's first) stays a target of the loss, as in "
                      "PaddleNLP, attention_mask_type document too; to leave it out, put a .lsm loss mask beside the "
                      ".bin with a 0 byte at each document's first token (a 0 keeps that token out as a target: "
                      "docs/DATA.md, Token files)"),
    "loss_scale": "scale_loss (the initial fp16 loss scale)",
    "initial_loss_scale": "scale_loss (the initial fp16 loss scale)",
    "num_workers": "dataloader_num_workers",
    "batch_size": "per_device_train_batch_size (Megatron's old name of micro-batch-size)",
    "model_parallel_size": "tensor_parallel_degree (Megatron's old name of tensor-model-parallel-size)",
    "checkpoint_activations": "recompute: true (recompute_granularity full, the default), as the old flag "
                              "recomputed whole layers",
    "eval_micro_batch_size": "per_device_eval_batch_size",
    "eval_global_batch_size": "per_device_eval_batch_size: the eval batch is it x data ranks",
    "hidden_dropout": ("no key: there is no dropout here (Llama and Qwen have none; hidden_dropout_prob is accepted "
                       "and ignored), where Megatron's default is 0.1"),
    "attention_dropout": ("no key: there is no dropout here (Llama and Qwen have none; attention_probs_dropout_prob "
                          "is accepted and ignored), where Megatron's default is 0.1"),
    "moe_z_loss_coeff": "router_z_loss_coef",
    "moe_expert_capacity_factor": "capacity_factor (0: dropless)",
    "mtp_loss_scaling_factor": "mtp_loss_weight",
    "start_weight_decay": "weight_decay (one value for the whole run: no increment schedule here)",
    "end_weight_decay": "weight_decay (one value for the whole run: no increment schedule here)",
    "optimizer": "optim adamw (the only one; Megatron's adam is AdamW-style, its weight decay decoupled)",
    # computed by Megatron (samples; no flag of their own), yet written as one from its scheduler's logs
    "wd_incr_steps": "weight_decay (one value for the whole run: no increment schedule here)",
    "wsd_decay_steps": ("num_decay_steps (with lr_scheduler_type warmup_stable_decay), in optimizer steps: Megatron "
                        "computes it in samples from --lr-wsd-decay-iters or --lr-wsd-decay-samples"),
    "ckpt_step": "resume_from_checkpoint (the directory output_dir/checkpoint-N of that step)",
}

# Megatron's model-size arguments -> the model's config.json key (a model directory's, named by model_name_or_path)
MODEL = {
    "ffn_hidden_size": "intermediate_size", "num_query_groups": "num_key_value_heads",
    "norm_epsilon": "rms_norm_eps", "rotary_base": "rope_theta", "init_method_std": "initializer_range",
    "untie_embeddings_and_output_weights": "tie_word_embeddings: false", "moe_router_topk": "num_experts_per_tok",
    "moe_aux_loss_coeff": "router_aux_loss_coef", "hidden_size": "hidden_size",
    "num_attention_heads": "num_attention_heads", "max_position_embeddings": "max_position_embeddings",
    "num_experts": "num_experts", "mtp_num_layers": "num_nextn_predict_layers",
}

# Megatron's name -> the command's own arguments that can say it, before the training key: an option (`eval --data
# PREFIX`, `preprocess --tokenizer DIR`) or a positional (`inspect-data PREFIX`), whichever the command has
_TOKENIZER = ("tokenizer",)
OPTION = {"data_path": ("data", "prefix"), "vocab_file": _TOKENIZER, "merge_file": _TOKENIZER,
          "tokenizer_type": _TOKENIZER, "tokenizer_model": _TOKENIZER}
# such an option -> what it takes, said after it (Megatron's GPT-2 files are gpt2-vocab.json and gpt2-merges.txt)
TAKES = {"tokenizer": " DIR (a directory holding vocab.json + merges.txt, or tokenizer.json: Megatron's vocab and "
                      "merge files under those names)"}


def command_hint(keys, options=(), positionals=(), prog: str | None = None) -> str | None:
    """"`vocab-file` and `merge-file` are Megatron-LM's arguments; here pass --tokenizer DIR (...)": the Megatron
    names among `keys` (as typed, either spelling) that one of the command's own arguments says, else None. The
    first such name's argument is named, with every name of `keys` it says: one line for Megatron's pair of
    tokenizer files. `options` and `positionals`: the command's own names (underscored); `prog`, the command as
    typed, shows a positional's place (`pretrain-cli inspect-data PREFIX`)."""
    found = [(key, own) for key in keys for own in OPTION.get(key.replace("-", "_"), ())
             if own in options or own in positionals]
    if not found:
        return None
    own = found[0][1]
    typed = [f"`{key}`" for key in dict.fromkeys(key for key, theirs in found if theirs == own)]
    one = len(typed) == 1
    listed = typed[0] if one else f"{', '.join(typed[:-1])} and {typed[-1]}"  # `a`, `b` and `c`
    names = f"{listed} {'is' if one else 'are'} Megatron-LM's argument{'' if one else 's'}"
    if own in options:
        return f"{names}; here pass --{own}{TAKES.get(own, '')}"
    return (f"{names}; here the {own} is the positional argument, without an option name"
            f"{f': `{prog} {own.upper()}`' if prog else ''}")


def megatron_hint(key: str, options=()) -> str | None:
    """"`data-path` is Megatron-LM's argument; here set input_dir (...)" for a Megatron name, in either spelling,
    else None. `key` as the user typed it (the line quotes it so); `options`: the command's own option names
    (underscored), where one of them is the name to use (`eval --data`: `command_hint`)."""
    name = key.replace("-", "_")
    said = command_hint([key], options)
    if said:
        return said
    if name in MEGATRON:
        said = MEGATRON[name]
        return f"`{key}` is Megatron-LM's argument; {'' if said.startswith('no key') else 'here set '}{said}"
    if name in MODEL and ("-" in key or name != MODEL[name]):  # hidden_size as typed: the model-key line's
        return (f"`{key}` is Megatron-LM's argument; here the model's config.json holds it as {MODEL[name]} (in a "
                "model directory named by model_name_or_path)")
    return None
