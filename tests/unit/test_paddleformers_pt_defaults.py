"""The defaults where paddleformers-cli differs from PaddleNLP (min_lr 0.0, flashmask attention, bf16, going on from
model_name_or_path's weights): taken by a file that is PaddleFormers' (its names or its stage) where it leaves a key
out, never by a PaddleNLP file, nor over what a file or the command line sets. (The files' texts:
paddleformers_pt_texts.py.)"""
import json

import pytest

from paddleformers_pt_texts import FULL, notes_by_key, without_jsonl, write_file
from pretrain_cli.cli import main as cli_main
from pretrain_cli.config.parser import parse_config
from pretrain_cli.config.resolve import resolve
from pretrain_cli.run_config import Target
from run_helpers import model_config


def test_a_paddleformers_file_takes_its_defaults_where_it_leaves_a_key_out(tmp_path):
    """min_lr 0.0 (PaddleNLP's min_learning_rate: 1e-5), flashmask attention and bf16 (PaddleNLP's: off): a PT file
    that leaves them out trains as in paddleformers-cli, with a note naming both values; the schedule decays to 0."""
    path = write_file(tmp_path, "stage: PT\nfine_tuning: full\ninput_dir: d\noutput_dir: o\nmax_steps: 5\ndo_train: true\n"
                            "lr_scheduler_type: cosine\ndevice: cpu\n")
    args = parse_config(path)
    t = args.training
    assert (t.min_learning_rate, t.use_flash_attention, t.bf16, args.model.continue_training) == (0.0, True, True, True)
    assert args.explicit["min_learning_rate"] == "PaddleFormers' default"
    said = notes_by_key(args)
    assert said["min_learning_rate"] == (
        "min_learning_rate: 0.0, PaddleFormers' default (its TrainingArguments' min_lr, the floor its linear and cosine "
        "schedules decay to), as the file is PaddleFormers' (it sets stage); a file without its names or stage gets "
        "1e-05 (PaddleNLP's)")
    assert "attn_impl flashmask" in said["use_flash_attention"] and "compute_type" in said["bf16"]
    run = resolve(args, model_config("micro-qwen2"), Target("cpu", 1, 0, 0, None))
    assert run.schedule.min_lr == 0.0 and run.schedule.lr_at(5) == 0.0


def test_the_weights_line_says_continue_training_is_paddleformers_default(tmp_path, capsys):
    """paddleformers-cli goes on from model_name_or_path's weights unless told otherwise: a PT file that leaves
    continue_training out asks for the weights, and the line that says how to fetch them says why."""
    path = write_file(tmp_path, without_jsonl(FULL).replace("max_steps: -1", "max_steps: 5"))
    assert cli_main(["check", path]) == 2
    assert ("error: model_name_or_path: continue_training (PaddleFormers' default: the file leaves it out) loads "
            "pretrained weights, but 'Qwen/Qwen3-0.6B-Base' is a preset here") in capsys.readouterr().err


def test_what_the_file_or_the_command_line_sets_and_a_paddlenlp_file_keep_their_values(tmp_path):
    pf = write_file(tmp_path, "stage: PT\nmin_lr: 2.0e-6\nattn_impl: eager\nbf16: false\n")
    args = parse_config(pf, ["--no_use_flash_attention", "--continue_training", "0"])
    t = args.training
    assert (t.min_learning_rate, t.use_flash_attention, t.bf16, args.model.continue_training) == (2e-6, False, False,
                                                                                                   False)
    t = parse_config(write_file(tmp_path, "stage: PT\n"), ["--min_learning_rate", "1e-6"]).training
    assert (t.min_learning_rate, t.use_flash_attention, t.bf16) == (1e-6, True, True)
    assert not parse_config(write_file(tmp_path, "stage: PT\nfp16: true\n")).training.bf16  # (fp16 chose the precision)
    nlp = write_file(tmp_path, '{"input_dir": "d", "output_dir": "o", "max_steps": 5, "do_train": true, "device": "cpu", '
                           '"learning_rate": 3e-5, "recompute_granularity": "full"}', "nlp.json")
    args = parse_config(nlp)
    assert (args.training.min_learning_rate, args.training.use_flash_attention, args.training.bf16) == (1e-5, False, False)
    assert not any("PaddleFormers" in n for n in notes_by_key(args).values())


# keys PaddleFormers reads that PaddleNLP-era files carry too: PaddleNLP's own llm/config/deepseek-v3/
# sft_128k_argument.json sets the first three; the last two are common to other Paddle trainers' files
SHARED_KEYS = {"using_fake_gate": False, "pre_alloc_memory": 60, "tensorwise_offload_optimizer": True,
               "global_batch_size": 32, "num_nextn_predict_layers": 1}


@pytest.mark.parametrize("name", ["nlp.json", "nlp.yaml"])
def test_a_paddlenlp_file_with_keys_paddleformers_also_reads_keeps_paddlenlp_defaults(tmp_path, name):
    """Keys without effect here that PaddleFormers also reads do not make a file PaddleFormers', in JSON or YAML: it
    trains with PaddleNLP's min_learning_rate, attention, precision and fresh weights, no PaddleFormers note."""
    path = write_file(tmp_path, json.dumps({"input_dir": "d", "output_dir": "o", "max_steps": 5, "do_train": True,
                                        "device": "cpu", "tensor_parallel_degree": 1, **SHARED_KEYS}), name)
    args = parse_config(path)
    t = args.training
    assert (t.min_learning_rate, t.use_flash_attention, t.bf16, args.model.continue_training) == (1e-5, False, False,
                                                                                                   False)
    assert not any("PaddleFormers' default" in n for n in args.rewritten), args.rewritten
    assert "PaddleFormers' default" not in args.explicit.values()


@pytest.mark.parametrize("key,value", [("max_seq_len", 64), ("tensor_model_parallel_size", 1),
                                       ("data_parallel_size", 1), ("stage", "PT")])
def test_a_paddleformers_name_or_stage_makes_the_file_paddleformers(tmp_path, key, value):
    """Its own name for a PaddleNLP key, or its workflow's `stage`, is PaddleFormers' evidence, with the keys it
    shares with PaddleNLP-era files beside it or not."""
    text = "".join(f"{k}: {str(v).lower()}\n" for k, v in SHARED_KEYS.items()) + f"{key}: {value}\ninput_dir: d\n"
    args = parse_config(write_file(tmp_path, text, "pf.yaml"))
    assert (args.training.min_learning_rate, args.training.bf16, args.model.continue_training) == (0.0, True, True)
    assert any(f"as the file is PaddleFormers' (it sets {key})" in n for n in args.rewritten), args.rewritten
