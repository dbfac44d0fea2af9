"""Bad inputs (cases.py): argument files and command lines (JSON and YAML syntax, unknown keys, types, ranges,
contradictions, the file itself, layouts that do not divide, overrides, commands, splits) and the models they name."""
from __future__ import annotations

import json
from pathlib import Path

from case_run_json import CHECK, DROP, cfg, raw
from harness import RUN_CONFIG


def a_syntax(d):
    return raw(d, '{"max_steps": 10,}'), ["run.json:1:", "invalid JSON"]
def a_unknown_key(d):
    return cfg(d, max_seq_lenght=32), ["unknown key `max_seq_lenght`", "did you mean `max_seq_length`"]
def a_type_str_for_int(d):
    return cfg(d, max_steps="ten"), ["`max_steps` expects int", "'ten'"]
def a_type_object(d):
    return cfg(d, learning_rate={"value": 1}), ["`learning_rate` expects float", "object"]
def a_type_list_for_scalar(d):
    return cfg(d, seed=[1, 2]), ["`seed` expects int", "list"]
def a_type_bool(d):
    return cfg(d, do_train="maybe"), ["`do_train` expects bool"]
def a_negative_batch(d):
    return cfg(d, per_device_train_batch_size=-4), ["per_device_train_batch_size", ">= 1", "-4"]
def a_zero_accumulation(d):
    return cfg(d, gradient_accumulation_steps=0), ["gradient_accumulation_steps", ">= 1"]
def a_seq_len_one(d):
    return cfg(d, max_seq_length=1), ["max_seq_length", ">= 2"]
def a_huge_float(d):
    return cfg(d, max_steps=1e30), ["max_steps", "out of range"]
def a_huge_int(d):
    return raw(d, json.dumps({**RUN_CONFIG, "save_steps": 0}).replace('"save_steps": 0', '"save_steps": ' + "9" * 400)), ["save_steps", "out of range"]
def a_nan(d):
    return raw(d, json.dumps({**RUN_CONFIG, "learning_rate": float("nan")})), ["learning_rate", "finite"]
def a_inf_weight_decay(d):
    return raw(d, json.dumps({**RUN_CONFIG, "weight_decay": float("inf")})), ["weight_decay", "finite"]
def a_fp16_and_bf16(d):
    return cfg(d, fp16=True, bf16=True), ["fp16, bf16", "choose one"]
def a_min_lr_above_lr(d):
    return cfg(d, min_learning_rate=0.1), ["min_learning_rate", "above learning_rate"]
def a_decay_before_warmup(d):
    return cfg(d, warmup_steps=8, decay_steps=4), ["decay_steps", "warmup"]
def a_beta_range(d):
    return cfg(d, adam_beta1=1.5), ["adam_beta1", "[0, 1)"]
def a_spike_policy_choice(d):
    return cfg(d, spike_policy="retry"), ["spike_policy", "retry"]
def a_spike_factor_at_most_one(d):
    return cfg(d, spike_loss_factor=1.0), ["spike_loss_factor", "0 (off) or a finite factor > 1"]
def a_spike_window_zero(d):
    return cfg(d, spike_policy="skip", spike_window=0), ["spike_window", ">= 1"]
def a_warmup_ratio(d):
    return cfg(d, warmup_ratio=2.0), ["warmup_ratio", "[0, 1]"]
def a_seed_negative(d):
    return cfg(d, seed=-1), ["seed", "[0, 2^32)"]
def a_nothing_to_do(d):
    return cfg(d, do_train=False, do_eval=False), ["nothing to do"]
def a_zero_max_steps(d):
    return cfg(d, max_steps=0), ["max_steps", "> 0"]
def a_no_output_dir(d):
    return cfg(d, output_dir=DROP), ["output_dir", "required"]
def a_missing_file(d):
    return ["check", "nope.json"], ["nope.json", "not found"]
def a_empty_file(d):
    return raw(d, ""), ["run.json", "empty"]
def a_whitespace_file(d):
    return raw(d, "\n  \n"), ["run.json", "empty"]
def a_not_object(d):
    return raw(d, "[1, 2, 3]"), ["run.json", "JSON object", "list"]
def a_json_string(d):
    return raw(d, '"max_steps=10"'), ["run.json", "JSON object", "str"]
def a_not_json_suffix(d):
    (d / "run.toml").write_text("max_steps = 10\n")
    return ["check", "run.toml"], ["run.toml", "must be a .json file (PaddleNLP's) or a .yaml/.yml file"]
def a_yaml_key_twice(d):
    (d / "run.yaml").write_text("max_steps: 10\nseed: 1\nmax_steps: 20\n")
    return ["check", "run.yaml"], ["run.yaml:3:", "`max_steps` appears more than once"]
def a_yaml_syntax_error(d):
    (d / "run.yml").write_text("max_steps: 10\nseed: [1,\n")
    return ["check", "run.yml"], ["run.yml:3:1:", "invalid YAML"]
def a_not_utf8(d):
    (d / "run.json").write_bytes(b'{"output_dir": "\xff\xfe"}')
    return CHECK, ["run.json", "cannot read"]
def a_directory_as_file(d):
    (d / "dir.json").mkdir()
    return ["check", "dir.json"], ["dir.json", "not found"]
def a_choice(d):
    return cfg(d, lr_scheduler_type="exponential"), ["lr_scheduler_type", "must be one of"]
def a_sharding_option(d):
    return cfg(d, sharding="stage9"), ["sharding", "stage9"]
def a_sharding_offload_stage1(d):
    return cfg(d, sharding="stage1 offload"), ["sharding", "offload"]
def a_tp_not_dividing_kv_heads(d):  # micro-qwen2: 4 heads, 2 KV heads
    return cfg(d, tensor_parallel_degree=4), ["tensor_parallel_degree: 4", "num_key_value_heads"], {"PADDLE_TRAINERS_NUM": "4"}
def a_tp_not_dividing_world(d):
    return cfg(d, tensor_parallel_degree=2), ["tensor_parallel_degree: 2", "world size 3"], {"PADDLE_TRAINERS_NUM": "3"}
def a_sequence_parallel_with_zero3(d):
    return (cfg(d, tensor_parallel_degree=2, sequence_parallel=True, sharding="stage3"),
            ["sequence_parallel", "not supported with sharding: stage3"], {"PADDLE_TRAINERS_NUM": "4"})
def a_partial_sharding_degree_stage3(d):
    return (cfg(d, sharding="stage3", sharding_parallel_degree=2), ["sharding_parallel_degree: 2", "stage1"],
            {"PADDLE_TRAINERS_NUM": "4"})
def a_pp_multi_process(d):
    return cfg(d, pipeline_parallel_degree=4), ["pipeline_parallel_degree: 4 stages for 2 decoder layers"], {"PADDLE_TRAINERS_NUM": "4"}
def a_override_unknown(d):
    cfg(d)
    return CHECK + ["--max_sep", "5"], ["command line", "unknown key `max_sep`"]
def a_override_bad_int(d):
    cfg(d)
    return CHECK + ["--seed", "abc"], ["command line", "`seed` expects int", "'abc'"]
def a_override_missing_value(d):
    cfg(d)
    return CHECK + ["--max_steps"], ["--max_steps needs a value"]
def a_override_two_values(d):
    cfg(d)
    return CHECK + ["--max_steps", "3", "4"], ["--max_steps takes one value"]
def a_unknown_command(d):
    return ["trian", "run.json"], ["unknown command 'trian'", "did you mean `train`"]
def a_split_words(d):
    return cfg(d, split="most,some"), ["split", "'most,some'"]
def a_split_zero(d):
    return cfg(d, split="0,0,0"), ["split", "positive sum"]
def a_split_empty_phase(d):
    return cfg(d, split="100,0,0", do_eval=True), ["split", "valid", "do_eval"]
def a_missing_model(d):
    return cfg(d, model_name_or_path="Qwen/Qwen9-70B"), ["model_name_or_path", "Qwen/Qwen9-70B", "nothing is downloaded"]
def a_model_dir_no_config(d):
    (d / "m").mkdir()
    return cfg(d, model_name_or_path="m"), ["model_name_or_path", "has no config.json"]
def a_model_config_bad_json(d):
    (d / "m").mkdir()
    (d / "m" / "config.json").write_text('{"model_type": "qwen2",')
    return cfg(d, model_name_or_path="m"), ["m/config.json", "JSON"]
def a_model_type(d):
    (d / "m").mkdir()
    (d / "m" / "config.json").write_text(json.dumps({"model_type": "gpt2", "vocab_size": 512}))
    return cfg(d, model_name_or_path="m"), ["model_type 'gpt2'", "llama, qwen2"]
def a_model_heads(d):
    c = json.loads((Path(__file__).parents[2] / "src/pretrain_cli/config/presets/micro-qwen2/config.json").read_text())
    c["num_key_value_heads"] = 3
    (d / "m").mkdir()
    (d / "m" / "config.json").write_text(json.dumps(c))
    return cfg(d, model_name_or_path="m"), ["m/config.json"]
def a_continue_without_weights(d):
    return cfg(d, continue_training=True), ["micro-qwen2", "safetensors"]
def a_layers_zero(d):
    return cfg(d, num_hidden_layers=0), ["num_hidden_layers", ">= 1"]
