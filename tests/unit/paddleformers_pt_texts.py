"""PaddleFormers' `stage: PT` files (paddleformers-cli train) as a user copies them, for the tests of what `check` says of
their jsonl data pipeline (test_paddleformers_pt_jsonl.py), their own keys (test_paddleformers_pt_keys.py) and the
defaults where paddleformers-cli differs from PaddleNLP (test_paddleformers_pt_defaults.py); and the three steps
those tests share: write a file, take its jsonl keys out as the one line says, read a run's notes by key.

The files' text is embedded as published (no download): examples/config/pt/full.yaml (commit 14e8e54),
full_tp_pp_ep.yaml (f85ac72), full_offline_data.yaml (66ba238; full_tp_pp.yaml is full.yaml with tp 2 x pp 2 and
sequence parallelism), and the keys of tests/config/benchmark/config/pt/DeepSeek-V3.yaml (0fdeb45) not in the
best-practices file of test_paddleformers_files. What the keys mean there: paddleformers/cli/hparams (DataArguments'
pipeline, ModelArguments' attn_impl and fine_tuning, FinetuningArguments' bf16 and global_batch_size),
paddleformers/trainer/training_args.py (min_lr 0.0, pad_token_id, the promoted flags), cli/train/sft/workflow.py
(dataset_type pretrain: input_dir's .bin/.idx files) and datasets/SFTDataset.py (PT packing: tokens + EOS per
document, concatenated and cut into max_seq_len samples).
"""
from pretrain_cli.config.resolve import resolve
from pretrain_cli.run_config import Target
from run_helpers import model_config

FULL = """\
### data
train_dataset_type: erniekit
eval_dataset_type: erniekit
train_dataset_path: ./tests/fixtures/dummy/pt/train.jsonl
train_dataset_prob: "1.0"
eval_dataset_path: ./tests/fixtures/dummy/pt/eval.jsonl
eval_dataset_prob: "1.0"
max_seq_len: 8192
packing: true
mix_strategy: concat

### model
model_name_or_path: Qwen/Qwen3-0.6B-Base
_attn_implementation: flashmask

### finetuning
# base
stage: PT
fine_tuning: full
seed: 23
do_train: true
do_eval: true
per_device_eval_batch_size: 1
per_device_train_batch_size: 1
num_train_epochs: 1
max_steps: -1
eval_steps: 100
evaluation_strategy: steps
save_steps: 100
save_strategy: steps
logging_steps: 1
gradient_accumulation_steps: 4
logging_dir: ./vdl_log
output_dir: ./checkpoints/qwen3-pt-full
disable_tqdm: true
eval_accumulation_steps: 16

# train
warmup_steps: 20
learning_rate: 1.0e-5

# performance
tensor_model_parallel_size: 1
pipeline_model_parallel_size: 1
sharding: stage1
recompute_granularity: full
recompute_method: uniform
recompute_num_layers: 1
bf16: true
fp16_opt_level: O2
unified_checkpoint: false
save_checkpoint_format: flex_checkpoint
load_checkpoint_format: flex_checkpoint

weight_decay: 0.0
adam_beta2: 0.999
moe_router_bias_update_rate: 0.0
moe_token_dispatcher_type: deepep
save_safetensors: false
overlap_p2p_comm: false
batch_p2p_comm: true"""
FULL_TP_PP = FULL.replace("tensor_model_parallel_size: 1\npipeline_model_parallel_size: 1\n",
                          "tensor_model_parallel_size: 2\npipeline_model_parallel_size: 2\nsequence_parallel: true\n")
FULL_TP_PP_EP = """\
### data
train_dataset_type: erniekit
eval_dataset_type: erniekit
train_dataset_path: ./tests/fixtures/dummy/pt/train.jsonl
train_dataset_prob: "1.0"
eval_dataset_path: ./tests/fixtures/dummy/pt/eval.jsonl
eval_dataset_prob: "1.0"
max_seq_len: 8192
num_samples_each_epoch: 6000000
packing: true
mix_strategy: concat
### model
model_name_or_path: Qwen/Qwen3-0.6B-Base
_attn_implementation: flashmask
### finetuning
# base
stage: PT
fine_tuning: full
seed: 23
do_train: true
do_eval: true
per_device_eval_batch_size: 1
per_device_train_batch_size: 1
num_train_epochs: 1
max_steps: 10
eval_steps: 100
evaluation_strategy: steps
save_steps: 100
save_total_limit: 1
save_strategy: steps
logging_steps: 1
gradient_accumulation_steps: 4
logging_dir: ./vdl_log
output_dir: ./checkpoints/qwen3-pt-full-tp-pp-ep
disable_tqdm: true
eval_accumulation_steps: 16
# train
warmup_steps: 20
learning_rate: 1.0e-5
# performance
tensor_model_parallel_size: 2
pipeline_model_parallel_size: 2
sequence_parallel: true
sharding: stage1
recompute_granularity: full
recompute_method: uniform
recompute_num_layers: 1
bf16: true
fp16_opt_level: O2
use_expert_parallel: true
expert_model_parallel_size: 4
# sharding_parallel_config
split_param: true
amp_master_grad: true
# pipeline_parallel_config
clear_every_step_cache: true
partial_send_recv: false
batch_p2p_comm: false
# tensor_parallel_config
tp_sync_param: true
sync_grad: true
save_checkpoint_format: flex_checkpoint
load_checkpoint_format: flex_checkpoint
"""
FULL_OFFLINE_DATA = """\
### data
dataset_type: "pretrain"
input_dir: "1.0 ./data/pre-training/demo_data/data-1-part0"
split: "998,2"
max_seq_len: 8192
mix_strategy: concat

### model
model_name_or_path: Qwen/Qwen3-0.6B-Base
attn_impl: flashmask

### finetuning
# base
stage: PT
fine_tuning: full
seed: 23
do_train: true
do_eval: true
per_device_eval_batch_size: 1
per_device_train_batch_size: 1
num_train_epochs: 1
max_steps: 100
eval_iters: 10
eval_steps: 100
evaluation_strategy: steps
save_steps: 100
save_strategy: steps
logging_steps: 1
gradient_accumulation_steps: 4
logging_dir: ./vdl_log
output_dir: ./checkpoints/qwen3-pt-full-offline
disable_tqdm: true
eval_accumulation_steps: 16

# train
warmup_steps: 20
learning_rate: 1.0e-5

# performance
tensor_parallel_degree: 1
pipeline_parallel_degree: 3
pipeline_parallel_config: enable_dynamic_shape enable_clear_every_step_cache
expert_parallel_degree: 8
use_expert_parallel: true
sharding_parallel_degree: 8
sharding_parallel_config: split_param
amp_master_grad: true
sharding: stage1
offload_optim: true
recompute: true
bf16: true
fp16_opt_level: O2
unified_checkpoint: true
"""
# the DeepSeek-V3 benchmark file's keys that the best-practices file lacks (its force_load_balancing: true is refused:
# test_paddleformers_files)
BENCHMARK_KEYS = "pad_token_id: 1\nglobal_batch_size: 32\ntensorwise_offload_optimizer: true\nmoe_deep_gemm: false\n"
JSONL_KEYS = ("train_dataset_type", "eval_dataset_type", "train_dataset_path", "train_dataset_prob",
              "eval_dataset_path", "eval_dataset_prob", "packing", "mix_strategy")


def write_file(tmp_path, text: str, name: str = "full.yaml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def without_jsonl(text: str, input_dir: str = "./data/train") -> str:
    """The file as the one line says to make it: the jsonl keys gone, input_dir set."""
    lines = [line for line in text.splitlines() if line.split(":")[0] not in (*JSONL_KEYS, "num_samples_each_epoch")]
    return "\n".join(lines + [f"input_dir: {input_dir}", ""])


def notes_by_key(args, model: str = "micro-qwen2") -> dict:
    run = resolve(args, model_config(model), Target("cpu", 1, 0, 0, None))
    return {n.split(":")[0]: n for n in run.notes}
