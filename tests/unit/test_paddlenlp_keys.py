"""PaddleNLP's argument files beyond our dataclasses (config/paddlenlp_keys.py, config/parser.py's `_post_init`):
its other TrainingArguments keys, its other names for ours, its flag strings checked where PaddleNLP checks them,
and the rules its __post_init__ and run_pretrain.py apply (evaluation_strategy, eval_steps 0, fp16_opt_level O0, the
pipeline's eval batch)."""
import pytest

from pretrain_cli.config.parser import parse_config
from pretrain_cli.config.resolve import resolve
from pretrain_cli.errors import UserError
from pretrain_cli.run_config import Target
from run_helpers import model_config, resolve_run
from test_arg_parser import BASE, write


def test_paddlenlps_other_training_keys_parse_with_a_note_and_stay_out_of_args_json(tmp_path):
    """PaddleNLP's own files set keys of its TrainingArguments (and the legacy run_pretrain.py's model keys) that
    have no field here: a file with them runs; a value other than PaddleNLP's default is a note; args.json keeps
    our keys only."""
    cfg = write(tmp_path, {**BASE, "model_type": "llama", "pp_recompute_interval": 1, "eval_accumulation_steps": 16,
                           "load_best_model_at_end": True, "config_name": None})
    args = parse_config(cfg, ["--do_export", "false", "--ckpt_quant_stage", "O1"])
    assert "eval_accumulation_steps" not in args.to_dict() and args.extra["eval_accumulation_steps"] == 16
    r = resolve(args, model_config("micro-qwen2"), Target("cpu", 1, 0, 0, None))
    said = [n.split(":")[0] for n in r.notes if "accepted but has no effect here" in n]
    assert sorted(said) == ["ckpt_quant_stage", "eval_accumulation_steps", "load_best_model_at_end"]


def test_paddlenlps_other_names_are_read_as_ours_and_both_in_one_place_are_refused(tmp_path):
    r = resolve_run("--use_async_save", "true")
    assert r.loop.async_save and "use_async_save: read as async_save" in "\n".join(r.notes)
    assert parse_config(None, ["--sharding_degree", "2"]).training.sharding_parallel_degree == 2
    with pytest.raises(UserError, match="`sharding_degree` and `sharding_parallel_degree` are one key"):
        parse_config(write(tmp_path, {**BASE, "sharding_degree": 2, "sharding_parallel_degree": 4}))


@pytest.mark.parametrize("key,value,layout", [
    ("tensor_parallel_config", "enable_mp_async_allreduce typo_flag", ["--tensor_parallel_degree", "2"]),
    ("sharding_parallel_config", "enable_stage1_overlap,bogus", ["--sharding", "stage1"]),
    ("data_parallel_config", "bogus", []),
    ("unified_checkpoint_config", "bogus", []),
    ("hybrid_parallel_topo_order", "bogus", [])])
def test_a_flag_paddlenlp_would_refuse_is_refused_where_it_checks_it(key, value, layout):
    """PaddleNLP raises for an unknown flag of an axis the run has (tensor parallelism's with tp > 1, sharding's with
    a sharding degree > 1, ...); a flag of an axis the run lacks it never reads, and neither do we."""
    with pytest.raises(UserError, match=f"{key}: .*bogus|{key}: unknown flag 'typo_flag'"):
        resolve_run("--max_steps", "10", f"--{key}", value, *layout, world=2)
    if key.endswith("parallel_config"):
        resolve_run("--max_steps", "10", f"--{key}", value, world=1)  # one process: no such axis


def test_unified_checkpoint_async_save_saves_in_the_background_unless_async_save_says_otherwise():
    assert resolve_run("--max_steps", "10", "--unified_checkpoint_config", "async_save").loop.async_save
    assert resolve_run("--max_steps", "10", "--unified_checkpoint_config", "enable_all_options").loop.async_save
    assert not resolve_run("--max_steps", "10", "--unified_checkpoint_config", "async_save",
                           "--async_save", "false").loop.async_save
    r = resolve_run("--max_steps", "10", "--unified_checkpoint_config", "skip_save_model_weight")
    assert not r.loop.async_save and "skip_save_model_weight has no effect here" in "\n".join(r.notes)


def test_paddlenlps_post_init_rules_and_fallbacks():
    """evaluation_strategy steps turns do_eval on; eval_steps 0 falls back to logging_steps; fp16_opt_level O0 is
    fp32 (Paddle's AMP level O0 casts nothing); the sharding error names the whole world and every axis."""
    r = resolve_run("--max_steps", "10", "--evaluation_strategy", "steps", "--eval_steps", "0", "--logging_steps", "4")
    assert r.loop.do_eval and r.loop.eval_steps == 4
    assert "evaluation_strategy: steps turns on do_eval" in "\n".join(r.notes)
    assert not resolve_run("--max_steps", "10", "--evaluation_strategy", "no").loop.do_eval
    r = resolve_run("--max_steps", "10", "--bf16", "--fp16_opt_level", "O0", device="gpu", gpu_name="A100-80GB")
    assert r.precision.amp_dtype is None and "O0 runs no op in half precision" in "\n".join(r.notes)
    r = resolve_run("--max_steps", "16", "--gradient_accumulation_steps", "8", "--pipeline_parallel_degree", "2",
                    "--do_eval", "--per_device_eval_batch_size", "4", world=2, model="tiny-llama")
    assert "per_device_eval_batch_size = micro-batch x gradient_accumulation_steps = 64" in "\n".join(r.notes)
    with pytest.raises(UserError, match=r"does not divide the 2 data-parallel processes \(world 16 / \(tp 2 x pp 4\)\)"):
        resolve_run("--max_steps", "16", "--gradient_accumulation_steps", "8", "--tensor_parallel_degree", "2",
                    "--pipeline_parallel_degree", "4", "--sharding", "stage1", "--sharding_parallel_degree", "4",
                    world=16, model="tiny-llama")


def test_epoch_strategies_evaluate_and_save_once_after_the_last_step_as_paddlenlps_one_epoch():
    """PaddleNLP's ChatGLM2 file's `evaluation_strategy` / `save_strategy: epoch` (refused before): run_pretrain.py's
    train dataset holds max_steps global batches, so its Trainer's one epoch ends at the last step, where
    DefaultFlowCallback's on_epoch_end evaluates and saves; eval_steps and save_steps act only under `steps`."""
    r = resolve_run("--max_steps", "10", "--eval_steps", "2", "--save_steps", "5", "--evaluation_strategy", "epoch",
                    "--save_strategy", "epoch")
    assert r.loop.do_eval and (r.loop.eval_steps, r.loop.save_steps) == (10, 10)
    text = "\n".join(r.notes)
    assert "evaluation_strategy: epoch turns on do_eval" in text
    assert "evaluation_strategy: epoch evaluates once, after the last step (10)" in text and "eval_steps unused" in text
    assert "save_strategy: epoch saves one checkpoint, after the last step (10)" in text
    assert "accepted but" not in text
    r = resolve_run("--max_steps", "10", "--eval_steps", "2", "--save_steps", "5", "--evaluation_strategy", "steps",
                    "--logging_strategy", "epoch")
    assert (r.loop.eval_steps, r.loop.save_steps) == (2, 5)
    assert "logging_strategy: accepted but has no effect here" in "\n".join(r.notes)
    with pytest.raises(UserError, match="save_strategy: epoch saves only the last step, so spike_policy: rollback has "
                                        "no checkpoint to roll back to; set save_strategy: steps"):
        resolve_run("--max_steps", "10", "--save_strategy", "epoch", "--spike_policy", "rollback")


def test_paddlenlps_fused_linear_key_is_its_own_not_the_fused_loss(tmp_path):
    """`use_fused_linear` (PaddleNLP's fused linear layer, its benchmark scripts set it) was answered "did you mean
    use_fused_linear_cross_entropy": another feature. It parses with its note, like use_fused_dropout_add, and
    leaves the fused head + loss as it was."""
    args = parse_config(write(tmp_path, {**BASE, "use_fused_linear": True}))
    assert args.extra["use_fused_linear"] is True and "use_fused_linear" not in args.to_dict()
    r = resolve(args, model_config("micro-qwen2"), Target("cpu", 1, 0, 0, None))
    note = next(n for n in r.notes if n.startswith("use_fused_linear:"))
    assert "accepted but has no effect here" in note and "fused linear layer" in note
    assert "cpu_fused_ops" not in note  # (one note for every device: a GPU run has no CPU kernels)
    assert r.kernels.fused_loss == resolve_run().kernels.fused_loss
