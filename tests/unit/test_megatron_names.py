"""Megatron-LM's argument names, as a user of it types them (W4's walk): the unknown-key line names the key to use
here (`config.megatron_names`), where it named the nearest spelling among ours, another key (`--train_iters`: did
you mean `eval_iters`; `--data-path`: `data_cache`; `--vocab-file`: `vocab_size`), or none for a hyphenated name
(`--micro-batch-size`: see docs/COMPATIBILITY.md)."""
from __future__ import annotations

import json

import pytest

from pretrain_cli.config.parser import check_override_keys, parse_config
from pretrain_cli.errors import UserError


@pytest.mark.parametrize("typed,said", [
    ("--data-path", 'here set input_dir (the same forms as one value: a prefix, a blend "0.3 prefix_a 0.7 prefix_b" '
                    "quoted on the command line, or a directory)"),
    ("--data_path", "here set input_dir"),
    ("--seq-length", "here set max_seq_length"),
    ("--micro-batch-size", "here set per_device_train_batch_size"),
    ("--global-batch-size", "here set gradient_accumulation_steps: the global batch is per_device_train_batch_size x "
                            "gradient_accumulation_steps x data ranks"),
    ("--lr-decay-style", "here set lr_scheduler_type (linear, cosine, constant; WSD: warmup_stable_decay"),
    ("--train-iters", "here set max_steps"),
    ("--train_iters", "here set max_steps"),
    ("--lr", "here set learning_rate"),
    ("--min-lr", "here set min_learning_rate"),
    ("--lr-warmup-iters", "here set warmup_steps"),
    ("--lr-decay-iters", "here set decay_steps"),
    ("--clip-grad", "here set max_grad_norm"),
    ("--eval-interval", "here set eval_steps"),
    ("--save-interval", "here set save_steps"),
    ("--vocab-file", "here set tokenizer_name_or_path"),
    ("--tensor-model-parallel-size", "here set tensor_parallel_degree"),
    ("--num-layers", "here set num_hidden_layers"),
    ("--eod-mask-loss", "no key: the token after each EOS (the next document's first) stays a target of the loss, "
                        "as in PaddleNLP, attention_mask_type document too; to leave it out, put a .lsm loss mask "
                        "beside the .bin with a 0 byte at each document's first token"),
    ("--ffn-hidden-size", "here the model's config.json holds it as intermediate_size"),
    ("--hidden-size", "here the model's config.json holds it as hidden_size"),
    # Megatron flags with a key here that the no-suggestion list (config.megatron_flags) left without an answer
    # (review of 499b0321: their nearest key, which 499b0321 stopped suggesting, was the right one)
    # Megatron's dropouts default to 0.1: not a key to set, there is none here (review R17 of 47b1b225)
    ("--hidden-dropout", "no key: there is no dropout here (Llama and Qwen have none; hidden_dropout_prob is "
                         "accepted and ignored), where Megatron's default is 0.1"),
    ("--attention-dropout", "no key: there is no dropout here (Llama and Qwen have none; attention_probs_dropout_prob "
                            "is accepted and ignored), where Megatron's default is 0.1"),
    ("--moe-z-loss-coeff", "here set router_z_loss_coef"),
    ("--moe-expert-capacity-factor", "here set capacity_factor"),
    ("--eval-micro-batch-size", "here set per_device_eval_batch_size"),
    ("--mtp-loss-scaling-factor", "here set mtp_loss_weight"),
    ("--start-weight-decay", "here set weight_decay"),
    ("--ckpt-step", "here set resume_from_checkpoint (the directory output_dir/checkpoint-N of that step)"),
    ("--batch-size", "here set per_device_train_batch_size (Megatron's old name of micro-batch-size)"),
    ("--model-parallel-size", "here set tensor_parallel_degree (Megatron's old name of tensor-model-parallel-size)"),
    ("--batch_size", "here set per_device_train_batch_size"),
    # review R17 of 47b1b225: the old --checkpoint-activations recomputed whole layers (granularity full), not
    # --recompute-activations' selective core_attn; --optimizer lost its answer (optim); WSD's computed decay steps
    # got the LR decay's key
    ("--checkpoint-activations", "here set recompute: true (recompute_granularity full, the default), as the old "
                                 "flag recomputed whole layers"),
    ("--optimizer", "here set optim adamw (the only one;"),
    ("--wsd_decay_steps", "here set num_decay_steps (with lr_scheduler_type warmup_stable_decay)"),
    ("--wsd-decay-steps", "here set num_decay_steps"),
    ("--wd_incr_steps", "here set weight_decay (one value for the whole run: no increment schedule here)"),
    ("--mtp-num-layers", "here the model's config.json holds it as num_nextn_predict_layers"),
])
def test_a_megatron_flag_names_the_key_to_use(typed, said):
    with pytest.raises(UserError) as e:
        parse_config(None, [typed, "1"])
    assert str(e.value).startswith(f"command line: `{typed[2:]}` is Megatron-LM's argument; {said}")
    assert "\n" not in str(e.value)


def test_a_megatron_key_in_the_argument_file(tmp_path):
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"train_iters": 10, "seq_length": 128}))
    with pytest.raises(UserError) as e:
        parse_config(str(path))
    assert e.value.lines == [f"{path}: `train_iters` is Megatron-LM's argument; here set max_steps",
                             f"{path}: `seq_length` is Megatron-LM's argument; here set max_seq_length"]


def test_a_command_option_wins_and_other_keys_are_unchanged():
    with pytest.raises(UserError, match=r"`data-path` is Megatron-LM's argument; here pass --data$"):
        check_override_keys(["--data-path", "x"], ["--data", "--model"])  # eval's own --data
    with pytest.raises(UserError, match=r"unknown key `max_seq`; did you mean `max_seq_length`\?"):
        parse_config(None, ["--max_seq", "3"])
    # a hyphenated typo gets the suggestion its underscored spelling gets
    with pytest.raises(UserError, match=r"unknown key `max-seq-lenght`; did you mean `max_seq_length`\?"):
        parse_config(None, ["--max-seq-lenght", "3"])
    # the underscored model key keeps its own line; Megatron names that are keys here are read
    with pytest.raises(UserError, match="`hidden_size` is a key of the model's config.json"):
        parse_config(None, ["--hidden_size", "64"])
    args = parse_config(None, ["--split", "969,30,1", "--eval-iters", "2", "--weight-decay", "0.1", "--seed", "3"])
    assert (args.data.split, args.training.eval_iters, args.training.weight_decay) == ("969,30,1", 2, 0.1)


def test_a_blend_given_as_megatron_gives_it_names_the_quoted_value():
    """`--data-path 0.3 a 0.7 b` is Megatron's blend on the command line; `--input_dir` takes it as one text."""
    with pytest.raises(UserError) as e:
        parse_config(None, ["--input_dir", "0.3", "a", "0.7", "b"])
    assert str(e.value) == ('command line: --input_dir takes one value, got 4: 0.3 a 0.7 b; a blend is one value: '
                            'quote it, --input_dir "0.3 a 0.7 b"')
    assert parse_config(None, ["--input_dir", "0.3 a 0.7 b"]).data.input_dir == "0.3 a 0.7 b"


@pytest.mark.parametrize("typed", ["--wandb_project", "--adlr_autoresume", "--group-query-attention",
                                   "--wandb-project", "--adlr-autoresume", "--transformer-impl", "--decoder-seq-length",
                                   "--attention-softmax-in-fp32", "--dataloader-type", "--no-load-optim",
                                   # flags a field's metadata names (arg_names), not the field's own name
                                   "--disable-bias-linear", "--fp8-format", "--apply-layernorm-1p",
                                   "--tokenizer-special-tokens", "--no-initialization", "--profile",
                                   "--tokenizer_metadata"])
def test_another_megatron_flag_gets_no_unrelated_suggestion(typed):
    """A hyphenated Megatron-LM flag with no key here said 'see docs/COMPATIBILITY.md' until 827364be underscored it
    before suggesting: `batch-size` then got 'did you mean vocab_size', `model-parallel-size` sep_parallel_degree,
    `group-query-attention` fuse_attention_qkv, `wandb-project` do_predict (config.megatron_flags). Its underscored
    spelling too: `wandb_project` got do_predict, `adlr_autoresume` lr_schedule_on_resume (review of 499b0321);
    `batch-size` and `model-parallel-size`, Megatron's old names of keys here, are answered by that key above."""
    with pytest.raises(UserError) as e:
        parse_config(None, [typed, "1"])
    assert str(e.value) == f"command line: unknown key `{typed[2:]}`; see docs/COMPATIBILITY.md for the accepted keys"


@pytest.mark.parametrize("typed,near", [("--max-step", "max_steps"), ("--max-seq-lenght", "max_seq_length"),
                                        ("--learning-rat", "learning_rate"), ("--warmup-step", "warmup_steps"),
                                        ("--save-total", "save_total_limit"), ("--gradient-accumulation-step",
                                                                               "gradient_accumulation_steps")])
def test_a_hyphenated_typo_of_a_key_keeps_its_suggestion(typed, near):
    with pytest.raises(UserError) as e:
        parse_config(None, [typed, "1"])
    assert str(e.value) == f"command line: unknown key `{typed[2:]}`; did you mean `{near}`?"


def test_a_hyphenated_name_far_from_every_key_gets_none():
    """Only a near-exact spelling is suggested for a hyphenated name (`tensorboard-queue` is not one of Megatron's
    names, its `tensorboard-queue-size` is, and no key here is near it)."""
    with pytest.raises(UserError) as e:
        parse_config(None, ["--tensorboard-queue", "1"])
    assert str(e.value).endswith("see docs/COMPATIBILITY.md for the accepted keys")


@pytest.mark.parametrize("typed,near", [("--lr-warmup-steps", "warmup_steps"), ("--lr-decay-steps", "decay_steps")])
def test_a_computed_megatron_field_is_not_taken_for_a_flag(typed, near):
    """lr_warmup_steps and lr_decay_steps are `field(init=False)` in Megatron's training_config.py, which its
    ArgumentGroupFactory gives no flag: not Megatron's names, so their nearest key, the right one, is suggested."""
    with pytest.raises(UserError) as e:
        parse_config(None, [typed, "1"])
    assert str(e.value) == f"command line: unknown key `{typed[2:]}`; did you mean `{near}`?"
