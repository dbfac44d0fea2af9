"""PaddleNLP's and PaddleFormers' own pretraining argument files, as a user copies them: each file's keys are
embedded here as published (no download), and what `check` and `train` read of them is asserted.

The files: PaddleFormers' examples/experiments/deepseek_v3_pretrain/config/pretrain_argument.json (commit 072dcbd)
and examples/experiments/qwen3_moe_pretrain/config/pretrain_argument.json (a71a620); PaddleNLP's
llm/config/deepseek-v3/pretrain_argument.json (00b572e) and the model names of its llm/config/{mixtral, baichuan,
chatglm2, yuan, gpt-3}/pretrain_argument.json.
"""
import json

import pytest

from pretrain_cli.config.parser import parse_config
from pretrain_cli.config.presets import resolve_model_dir
from pretrain_cli.config.resolve import resolve
from pretrain_cli.errors import UserError
from pretrain_cli.run_config import Target
from run_helpers import model_config, resolve_run

PADDLEFORMERS_DEEPSEEK_V3 = {
    "model_name_or_path": "./config/", "tokenizer_name_or_path": "deepseek-ai/DeepSeek-V3", "input_dir": "./data",
    "output_dir": "./checkpoints/pretrain_ckpts", "per_device_train_batch_size": 1, "gradient_accumulation_steps": 24,
    "per_device_eval_batch_size": 1, "tensor_model_parallel_size": 1, "pipeline_model_parallel_size": 4,
    "pipeline_parallel_config": "use_dualpipev enable_overlap_p2p_comm", "sharding_parallel_size": 2,
    "sharding_parallel_config": "split_param", "sharding_comm_buffer_size_MB": 2048, "expert_model_parallel_size": 2,
    "sharding": "stage1", "virtual_pipeline_model_parallel_size": 1, "sequence_parallel": 0,
    "use_flash_attention": True, "max_seq_length": 4097, "learning_rate": 2.2e-05, "min_learning_rate": 7.333e-07,
    "warmup_steps": 30, "logging_steps": 1, "max_steps": 200, "save_steps": 5000, "eval_steps": 1000,
    "weight_decay": 0.01, "bf16": True, "fp16_opt_level": "O2", "warmup_ratio": 0.01, "max_grad_norm": 1.0,
    "amp_master_grad": 1, "dataloader_num_workers": 8, "continue_training": 0, "do_train": True, "do_eval": True,
    "do_predict": False, "disable_tqdm": True, "recompute": False, "distributed_dataloader": 1,
    "unified_checkpoint": True, "save_total_limit": 2, "skip_profile_timer": False, "fuse_rms_norm": True,
    "fuse_attention_ffn": True, "apply_rope_fusion": True, "save_sharded_model": False, "load_sharded_model": False,
    "use_expert_parallel": True, "unified_checkpoint_config": "ignore_merge_optimizer", "offload_optim": True,
    "reorder_pipeline_priority": True, "num_nextn_predict_layers": 1, "using_fake_gate": False}
PADDLEFORMERS_QWEN3_MOE = {
    "model_name_or_path": "./config/", "tokenizer_name_or_path": "./config/", "input_dir": "./data",
    "output_dir": "./checkpoints/pretrain_ckpts", "per_device_train_batch_size": 1, "gradient_accumulation_steps": 24,
    "per_device_eval_batch_size": 1, "tensor_parallel_degree": 1, "pipeline_parallel_degree": 1,
    "pipeline_parallel_config": "use_dualpipev enable_overlap_p2p_comm", "sharding_parallel_degree": 4,
    "sharding_parallel_config": "split_param", "sharding_comm_buffer_size_MB": 2048, "sharding": "stage1",
    "virtual_pp_degree": 1, "sequence_parallel": 0, "use_flash_attention": True, "max_seq_length": 4097,
    "learning_rate": 3e-05, "min_learning_rate": 3e-06, "warmup_steps": 30, "logging_steps": 1, "max_steps": 200,
    "save_steps": 5000, "eval_steps": 1000, "weight_decay": 0.01, "bf16": True, "fp16_opt_level": "O2",
    "warmup_ratio": 0.01, "max_grad_norm": 1.0, "amp_master_grad": 1, "dataloader_num_workers": 8,
    "continue_training": 0, "do_train": True, "do_eval": True, "do_predict": False, "disable_tqdm": True,
    "recompute": False, "distributed_dataloader": 1, "unified_checkpoint": True, "save_total_limit": 2,
    "skip_profile_timer": False, "use_fused_rms_norm": True, "fuse_attention_ffn": True, "use_fused_rope": True,
    "save_sharded_model": False, "load_sharded_model": False, "use_expert_parallel": True,
    "unified_checkpoint_config": "skip_save_model_weight", "offload_optim": True, "reorder_pipeline_priority": True}
# PaddleNLP's llm/config/deepseek-v3/pretrain_argument.json: its layout keys (the rest as the qwen file's)
PADDLENLP_DEEPSEEK_V3_LAYOUT = {
    "per_device_train_batch_size": 1, "gradient_accumulation_steps": 10, "tensor_parallel_degree": 1,
    "pipeline_parallel_degree": 2, "sharding_parallel_degree": 4, "expert_parallel_degree": 4, "sharding": "stage1",
    "virtual_pp_degree": 1, "sequence_parallel": 0, "pipeline_parallel_config": "use_dualpipev"}
# the model_name_or_path of PaddleNLP's pretraining files of the families not built here
UNBUILT = {"mixtral": "mistralai/Mixtral-8x7B-Instruct-v0.1", "baichuan": "baichuan-inc/Baichuan2-7B-Base",
           "chatglm2": "THUDM/chatglm2-6b", "yuan": "IEITYuan/Yuan2-2B", "gpt-3": "gpt2-medium-en"}


def _write(tmp_path, keys: dict) -> str:
    path = tmp_path / "pretrain_argument.json"
    path.write_text(json.dumps(keys))
    return str(path)


def test_paddleformers_deepseek_v3_file_reads_its_names_as_ours(tmp_path):
    """PaddleFormers names the degrees Megatron's way and the fused kernels its own way: each was an unknown key,
    one per `check` (ten rounds for this file); each is now read as ours with a note naming it, and its keys without
    effect here are notes."""
    args = parse_config(_write(tmp_path, PADDLEFORMERS_DEEPSEEK_V3))
    t = args.training
    assert (t.tensor_parallel_degree, t.pipeline_parallel_degree, t.sharding_parallel_degree,
            t.expert_parallel_degree, t.virtual_pp_degree) == (1, 4, 2, 2, 1)
    assert t.use_fused_rms_norm and t.use_fused_rope
    notes = "\n".join(resolve(args, model_config("micro-deepseek-v3"), Target("cpu", 1, 0, 0, None)).notes)
    for theirs, ours in (("pipeline_model_parallel_size", "pipeline_parallel_degree"),
                         ("expert_model_parallel_size", "expert_parallel_degree"),
                         ("fuse_rms_norm", "use_fused_rms_norm"), ("apply_rope_fusion", "use_fused_rope")):
        assert f"{theirs}: read as {ours} (PaddleFormers' name for it)" in notes
    for key in ("reorder_pipeline_priority", "num_nextn_predict_layers"):
        assert f"{key}: accepted but has no effect here" in notes
    assert "using_fake_gate" not in notes  # PaddleFormers' default (false): nothing to say


def test_two_names_of_one_degree_in_one_file_are_refused(tmp_path):
    with pytest.raises(UserError, match="`sharding_parallel_size` and `sharding_degree` are one key"):
        parse_config(_write(tmp_path, {"sharding_parallel_size": 2, "sharding_degree": 4}))


def test_every_unknown_key_and_bad_value_of_a_file_is_named_at_once(tmp_path):
    """A file is fixed in one round: all its unknown keys and bad values, each on its own line (the first one alone
    stopped the parse)."""
    keys = {**PADDLEFORMERS_QWEN3_MOE, "moe_router_topk_scaling_factor": 1.0, "stage": "SFT",
            "evaluation_strategy": "epochs", "save_strategy": "step"}
    with pytest.raises(UserError) as e:
        parse_config(_write(tmp_path, keys), ["--max_steps", "x"])
    lines = e.value.lines
    assert len(lines) == 5, lines
    assert any("unknown key `moe_router_topk_scaling_factor`" in line for line in lines)
    assert any("stage: 'SFT' is not pretraining" in line for line in lines)  # (a PaddleFormers key: its SFT refused)
    assert any("`evaluation_strategy` must be one of" in line for line in lines)
    assert any("`save_strategy` must be one of" in line for line in lines)
    assert any(line.startswith("command line: key `max_steps`") for line in lines)


@pytest.mark.parametrize("folder", sorted(UNBUILT))
def test_a_model_of_a_family_not_built_here_is_refused_as_such(folder):
    """PaddleNLP's Mixtral, Baichuan, ChatGLM2, Yuan and GPT files name models no download makes trainable here:
    the line says so (it said to download the model, which config.json's model_type would then refuse)."""
    with pytest.raises(UserError) as e:
        resolve_model_dir(UNBUILT[folder])
    message = str(e.value)
    assert "a family pretrain-cli does not build" in message and "deepseek_v3" in message
    assert "huggingface-cli download" not in message


def test_the_note_on_offload_optim_says_what_happens_here(tmp_path):
    """Both PaddleFormers files set offload_optim: its note read "accepted but has no effect here: Optimizer state
    offloaded to host memory between steps", as if it were."""
    args = parse_config(_write(tmp_path, PADDLEFORMERS_QWEN3_MOE))
    notes = resolve(args, model_config("micro-qwen3-moe"), Target("cpu", 1, 0, 0, None)).notes
    said = {n.split(":")[0]: n for n in notes}
    assert "stays in device memory" in said["offload_optim"]


def test_paddlenlp_deepseek_v3_layout_runs_as_the_file_says():
    """Its pp2 x sharding stage1 x 4 x ep 4 on 8 processes resolves as written (it was refused: the experts were not
    kept out of fleet's sharding optimizer inside a pipeline; tests/distributed/test_expert_zero1_hybrid.py runs it);
    without the sharding stage, sharding_parallel_degree 4 is a note (PaddleNLP warns the same), not silence."""
    keys = [f"--{k}={v}" for k, v in PADDLENLP_DEEPSEEK_V3_LAYOUT.items()]
    p = resolve_run(*keys, world=8, model="micro-deepseek-v3").parallel
    assert (p.pp_degree, p.sharding_stage, p.sharding_degree, p.dp_degree, p.ep_degree) == (2, 1, 4, 1, 4)
    assert p.engine == "pipeline"
    notes = resolve_run(*keys, "--sharding=", world=8, model="micro-deepseek-v3").notes
    assert any(n.startswith("sharding_parallel_degree: 4 has no effect without a sharding stage") for n in notes)

