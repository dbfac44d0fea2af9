"""PaddleFormers' paddleformers-cli argument files (YAML), as a user copies them: each file's text is embedded here as
published (no download), and what `check` and `train` read of it is asserted.

The files: examples/best_practices/DeepSeek-V3/pretrain/config/pretrain_argument.yaml (commit 0ef95d0) and
examples/experiments/deepseek_v3_pretrain/config/pretrain_argument.yaml (072dcbd); the `moe_router_force_load_balancing:
true` and `stage` lines of its tests/config/benchmark/config/pt/DeepSeek-V3.yaml (0fdeb45) and
tests/config/ci/qwen_pt.yaml (5e0abcf). What each key means there: paddleformers/cli/hparams (ModelArguments.stage,
DataArguments.max_seq_len), paddleformers/trainer/training_args.py (min_lr, use_dualpipev, overlap_p2p_comm,
split_param, pre_alloc_memory), LlmMetaConfig (moe_router_force_load_balancing: PaddleFleet's router replaces its
logits with random ones when true) and cli/train/deepseek_v3_pretrain/workflow.py, which hands max_seq_len to the token
dataset as its seq_length and min_lr to its linear and cosine schedules as their floor.
"""
import pytest

from pretrain_cli.config.parser import parse_config
from pretrain_cli.config.resolve import resolve
from pretrain_cli.errors import UserError
from pretrain_cli.run_config import Target
from run_helpers import model_config, resolve_run

BEST_PRACTICES_DEEPSEEK_V3 = """\
stage: dsv3_pretrain
model_name_or_path: "./config"
tokenizer_name_or_path: "./config"
input_dir: "./data"
output_dir: "./checkpoints/pretrain_ckpts"
per_device_train_batch_size: 1
gradient_accumulation_steps: 24
per_device_eval_batch_size: 1
tensor_model_parallel_size: 1
pipeline_model_parallel_size: 4

# pipeline_parallel_config
use_dualpipev: true
overlap_p2p_comm: true

sharding_parallel_size: 2

# sharding_parallel_config
split_param: true

sharding_comm_buffer_size_MB: 2048
expert_model_parallel_size: 2
sharding: "stage1"
virtual_pipeline_model_parallel_size: 1
sequence_parallel: 0
max_seq_len: 4097
learning_rate: 0.000022
min_lr: 0.00000073333
warmup_steps: 30
logging_steps: 1
max_steps: 200
save_steps: 5000
eval_steps: 1000
weight_decay: 0.01
bf16: true
fp16_opt_level: "O2"
warmup_ratio: 0.01
max_grad_norm: 1.0
amp_master_grad: 1
dataloader_num_workers: 8
continue_training: 0
do_train: true
do_eval: true
do_predict: false
disable_tqdm: true
distributed_dataloader: 1
unified_checkpoint: true
save_total_limit: 2
skip_profile_timer: false
fuse_attention_ffn: true
apply_rope_fusion: true
save_sharded_model: false
load_sharded_model: false
use_expert_parallel: true
unified_checkpoint_config: "ignore_merge_optimizer"
offload_optim: true
reorder_pipeline_priority: true
num_nextn_predict_layers: 1
moe_router_force_load_balancing: false
hidden_dropout_prob: 0.1
attention_probs_dropout_prob: 0.1
pre_alloc_memory: 61
"""
# examples/experiments/deepseek_v3_pretrain/config/pretrain_argument.yaml: the same keys with the flag strings, 8
# stages x 32 sharding ranks x ep 32 (its keys that differ from the file above)
EXPERIMENTS_DEEPSEEK_V3_CHANGES = {
    "gradient_accumulation_steps: 24": "gradient_accumulation_steps: 60",
    "pipeline_model_parallel_size: 4": "pipeline_model_parallel_size: 8\n"
                                       "pipeline_parallel_config: \"use_dualpipev enable_overlap_p2p_comm\"",
    "use_dualpipev: true\noverlap_p2p_comm: true\n": "",
    "sharding_parallel_size: 2": "sharding_parallel_size: 32\nsharding_parallel_config: \"split_param\"",
    "split_param: true\n": "",
    "expert_model_parallel_size: 2": "expert_model_parallel_size: 32",
    "moe_router_force_load_balancing: false\n": "using_fake_gate: false\n",
}
EIGHT_KEYS = ("stage", "use_dualpipev", "overlap_p2p_comm", "split_param", "max_seq_len", "min_lr",
              "moe_router_force_load_balancing", "pre_alloc_memory")


def _write(tmp_path, text: str, name: str = "pretrain_argument.yaml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def _notes(args, model: str = "micro-deepseek-v3") -> dict:
    notes = resolve(args, model_config(model), Target("cpu", 1, 0, 0, None)).notes
    return {n.split(":")[0]: n for n in notes}


def test_the_best_practices_deepseek_v3_file_reads_every_key(tmp_path):
    """Its eight keys of paddleformers-cli were each an unknown key (and `min_lr`'s did-you-mean named
    min_lr_ratio, a ratio): the two that name ours are read as ours, the GPU tunings and the workflow choice are
    notes saying they change nothing here, and the router's false (its own scores) is what runs here."""
    args = parse_config(_write(tmp_path, BEST_PRACTICES_DEEPSEEK_V3))
    t, d = args.training, args.data
    assert d.max_seq_length == 4097 and t.min_learning_rate == pytest.approx(7.3333e-07)
    assert (t.pipeline_parallel_degree, t.sharding_parallel_degree, t.expert_parallel_degree) == (4, 2, 2)
    assert not set(EIGHT_KEYS) & set(args.to_dict())  # (no field of ours: args.json keeps our keys only)
    said = _notes(args)
    assert said["max_seq_len"] == "max_seq_len: read as max_seq_length (PaddleFormers' name for it)"
    assert said["min_lr"] == "min_lr: read as min_learning_rate (PaddleFormers' name for it)"
    for key in ("stage", "use_dualpipev", "overlap_p2p_comm", "split_param", "pre_alloc_memory"):
        assert said[key].startswith(f"{key}: accepted but has no effect here: "), key
    assert "1F1B" in said["use_dualpipev"] and "sends run in order here" in said["overlap_p2p_comm"]
    assert "V1" in said["split_param"] and "GiB" in said["pre_alloc_memory"]
    assert "moe_router_force_load_balancing" not in said  # false: routing by the router's scores, as here


def test_min_lr_is_the_schedules_absolute_floor(tmp_path):
    """PaddleFormers hands min_lr to LinearAnnealingWithWarmupDecay / CosineAnnealingWithWarmupDecay as min_lr, the
    rate itself (the file's 7.3333e-7 is learning_rate / 30, its JSON twin's min_learning_rate): not a ratio."""
    run = resolve(parse_config(_write(tmp_path, BEST_PRACTICES_DEEPSEEK_V3)), model_config("micro-deepseek-v3"),
                  Target("cpu", 1, 0, 0, None))
    s = run.schedule
    assert s.min_lr == pytest.approx(7.3333e-07) and s.max_lr == pytest.approx(2.2e-05)
    assert s.lr_at(s.decay_steps) == pytest.approx(7.3333e-07)  # the rate at the end of the decay
    assert run.data.max_seq_length == 4097
    assert resolve_run("--min_lr", "0", "--lr_scheduler_type", "cosine").schedule.min_lr == 0.0


@pytest.mark.parametrize("theirs,ours", [("min_lr", "min_learning_rate"), ("max_seq_len", "max_seq_length")])
def test_their_name_and_ours_in_one_file_are_refused(tmp_path, theirs, ours):
    with pytest.raises(UserError, match=f"`{theirs}` and `{ours}` are one key"):
        parse_config(_write(tmp_path, f"{theirs}: 1\n{ours}: 2\n"))


def test_the_experiments_yaml_with_flag_strings_reads_too(tmp_path):
    text = BEST_PRACTICES_DEEPSEEK_V3
    for old, new in EXPERIMENTS_DEEPSEEK_V3_CHANGES.items():
        assert old in text
        text = text.replace(old, new)
    args = parse_config(_write(tmp_path, text))
    assert (args.training.pipeline_parallel_degree, args.training.expert_parallel_degree) == (8, 32)
    assert args.data.max_seq_length == 4097 and "pre_alloc_memory" in args.extra


def test_promoted_flags_are_notes_only_when_they_ask_for_their_feature():
    """overlap_p2p_comm and split_param are on by default in PaddleFormers; false asks for nothing (no note), true for
    a feature not run here (a note), as their flag strings' `enable_overlap_p2p_comm` and `split_param` were."""
    quiet = resolve_run("--use_dualpipev", "false", "--overlap_p2p_comm", "false", "--split_param", "false",
                        "--pre_alloc_memory", "0", "--stage", "PT", model="micro-deepseek-v3")
    said = "\n".join(quiet.notes)
    for key in ("use_dualpipev", "overlap_p2p_comm", "split_param", "pre_alloc_memory"):
        assert f"{key}:" not in said, key
    loud = resolve_run("--split_param", "--overlap_p2p_comm", "1", model="micro-deepseek-v3")
    assert {"split_param", "overlap_p2p_comm"} <= {n.split(":")[0] for n in loud.notes}


@pytest.mark.parametrize("line", ["moe_router_force_load_balancing: true",  # PaddleFormers' benchmark/CI files
                                  "stage: SFT", "stage: DPO", "stage: VL-SFT"])
def test_a_value_that_would_change_the_training_is_refused_in_one_line(tmp_path, line):
    """Random router logits (PaddleFleet's benchmark mode) and a fine-tuning stage would each train something else
    than the file asks for: one line naming the file, the key and what to set, with the file's other problems."""
    text = BEST_PRACTICES_DEEPSEEK_V3.replace("moe_router_force_load_balancing: false", "")
    text = text.replace("stage: dsv3_pretrain", line) + "no_such_key: 1\n"
    path = _write(tmp_path, text)
    with pytest.raises(UserError) as e:
        parse_config(path)
    lines = e.value.lines
    assert len(lines) == 2 and any("unknown key `no_such_key`" in x for x in lines), lines
    refused = next(x for x in lines if "no_such_key" not in x)
    key = line.split(":")[0]
    assert refused.startswith(f"{path}: {key}: ") and ("set it to false" in refused or "set it to one of" in refused)


@pytest.mark.parametrize("stage", ["PT", "PT-V2", "dsv3_pretrain", "auto-parallel", "ernie_pretrain"])
def test_pretraining_stages_are_accepted(stage):
    assert resolve_run("--stage", stage).loop.do_train


def test_the_command_line_refuses_the_same_values():
    with pytest.raises(UserError, match="^command line: moe_router_force_load_balancing: true routes every token"):
        parse_config(None, ["--moe_router_force_load_balancing"])
    with pytest.raises(UserError, match="^command line: stage: 'SFT' is not pretraining"):
        parse_config(None, ["--stage", "SFT"])
