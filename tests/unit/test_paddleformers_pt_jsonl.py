"""PaddleFormers' `stage: PT` files' jsonl data pipeline (their train_dataset_* keys, packing, mix_strategy): one
line naming the keys and the `pretrain-cli preprocess` command that makes their jsonl the token files read here;
following it trains; and the offline data file, whose dataset_type: pretrain reads token files already. (The files'
texts and sources: paddleformers_pt_texts.py.)"""
import re
import shlex

import pytest

from paddleformers_pt_texts import (FULL, FULL_OFFLINE_DATA, FULL_TP_PP, FULL_TP_PP_EP, JSONL_KEYS, notes_by_key,
                                    without_jsonl, write_file)
from pretrain_cli.cli import main as cli_main
from pretrain_cli.config.parser import check_override_keys, parse_config
from pretrain_cli.errors import UserError


@pytest.mark.parametrize("text,extra", [(FULL, ()), (FULL_TP_PP, ()), (FULL_TP_PP_EP, ("num_samples_each_epoch",))])
def test_the_jsonl_pipeline_is_one_line_with_the_preprocess_command(tmp_path, text, extra):
    """16 to 20 unknown-key lines each before; now one line for the data keys, naming them and the command that
    makes their jsonl the token files read here, and nothing else of the file is unknown."""
    path = write_file(tmp_path, text)
    with pytest.raises(UserError) as e:
        parse_config(path)
    assert len(e.value.lines) == 1, e.value.lines
    line = e.value.lines[0]
    assert line.startswith(f"{path}: train_dataset_path: PaddleFormers' jsonl data pipeline (")
    for key in (*JSONL_KEYS, *extra):
        assert key in line.split(") is not read here")[0], key
    assert ("`pretrain-cli preprocess --input_path ./tests/fixtures/dummy/pt/train.jsonl --output_prefix data/train "
            "--tokenizer Qwen/Qwen3-0.6B-Base --append_eos`") in line
    assert "set input_dir: data/train and remove these keys" in line


@pytest.mark.parametrize("text", [FULL, FULL_TP_PP, FULL_TP_PP_EP])
def test_without_the_jsonl_keys_every_key_of_the_file_reads(tmp_path, text):
    args = parse_config(write_file(tmp_path, without_jsonl(text)), ["--max_steps", "10"])  # (full.yaml's -1: see docs)
    t = args.training
    assert args.data.input_dir == "./data/train" and args.data.max_seq_length == 8192
    assert t.use_flash_attention and t.recompute_granularity == "full" and "fine_tuning" in args.extra
    said = notes_by_key(args)
    assert said["_attn_implementation"] == ("_attn_implementation: flashmask read as use_flash_attention: true (the "
                                            "attention path that never holds the [batch, heads, seq, seq] scores)")
    for quiet in ("fine_tuning", "recompute_method", "recompute_num_layers", "save_checkpoint_format"):
        assert quiet not in said, quiet  # full training, every layer its own unit, a format: what runs here
    assert said["recompute_granularity"].startswith("recompute_granularity: full without recompute: PaddleFormers "
                                                    "recomputes whenever recompute_granularity is set")
    assert "moe_token_dispatcher_type" not in text or "DeepEP" in said["moe_token_dispatcher_type"]

def test_following_the_line_trains_the_jsonl(tmp_path, monkeypatch, capsys):
    """The command of the line, run as written in the file's directory, makes the token files that the file, as the
    line says to change it, checks against."""
    monkeypatch.chdir(tmp_path)
    jsonl = tmp_path / "tests/fixtures/dummy/pt/train.jsonl"
    jsonl.parent.mkdir(parents=True)
    words = "the quick brown fox jumps over a lazy dog while seven wizards quietly hex every jovial zebra".split()
    jsonl.write_text("".join(f'{{"text": "{" ".join(words[i:] + words[:i])}"}}\n' for i in range(len(words))) * 4)
    assert cli_main(["train-tokenizer", "--input_path", str(jsonl), "--output_dir", "tok", "--vocab_size", "300"]) == 0
    text = FULL.replace("model_name_or_path: Qwen/Qwen3-0.6B-Base", "model_name_or_path: micro-qwen2\n"
                        "tokenizer_name_or_path: tok")
    with pytest.raises(UserError) as e:
        parse_config(write_file(tmp_path, text))
    command = e.value.lines[0].split("`")[1]
    assert cli_main(shlex.split(command)[1:]) == 0  # (pretrain-cli preprocess ...)
    capsys.readouterr()
    fixed = write_file(tmp_path, without_jsonl(text, "data/train"), "fixed.yaml")
    assert cli_main(["check", fixed, "--max_steps", "2", "--max_seq_length", "16", "--split", "80,20",
                     "--continue_training", "false", "--device", "cpu"]) == 0
    assert "check: OK" in capsys.readouterr().out


def test_several_jsonl_sources_are_blended_by_their_weights(tmp_path):
    text = FULL.replace('train_dataset_path: ./tests/fixtures/dummy/pt/train.jsonl\ntrain_dataset_prob: "1.0"',
                        'train_dataset_path: ./a/web.jsonl,./b/code.jsonl\ntrain_dataset_prob: "0.7,0.3"')
    with pytest.raises(UserError) as e:
        parse_config(write_file(tmp_path, text))
    assert 'set input_dir: "0.7 data/web 0.3 data/code"' in e.value.lines[0]


def test_the_command_line_names_its_jsonl_keys_in_one_line_too():
    check_override_keys(["--train_dataset_path", "x.jsonl", "--packing", "true"])  # cli.py's early check: known
    with pytest.raises(UserError) as e:
        parse_config(None, ["--train_dataset_path", "x.jsonl", "--packing", "true", "--no_such_key", "1"])
    lines = e.value.lines
    assert len(lines) == 2 and lines[0].startswith("command line: train_dataset_path: PaddleFormers' jsonl data "
                                                   "pipeline (train_dataset_path, packing)"), lines
    assert "--input_path x.jsonl --output_prefix data/x --tokenizer TOKENIZER" in lines[0]


@pytest.mark.parametrize("kind,lead", [("offline", "dataset_type: 'offline' (dataset_type, train_dataset_path) reads "
                                                   "PaddleFormers' own pre-tokenized files"),
                                       ("map", "train_dataset_path: PaddleFormers' jsonl data pipeline")])
def test_a_dataset_type_that_reads_no_token_files_is_the_same_line(tmp_path, kind, lead):
    path = write_file(tmp_path, f"dataset_type: {kind}\ntrain_dataset_path: t.jsonl\nstage: PT\n")
    with pytest.raises(UserError, match=f"^{re.escape(path)}: {re.escape(lead)}"):
        parse_config(path)


def test_the_offline_data_file_reads_every_key_as_its_token_files(tmp_path):
    """dataset_type, mix_strategy, attn_impl and fine_tuning were four unknown keys; dataset_type: pretrain is
    PaddleFormers' reading of input_dir's .bin/.idx files, as here, so its concat mix changes nothing."""
    args = parse_config(write_file(tmp_path, FULL_OFFLINE_DATA))
    d, t = args.data, args.training
    assert (d.input_dir, d.split, d.max_seq_length) == ("1.0 ./data/pre-training/demo_data/data-1-part0", "998,2", 8192)
    assert t.use_flash_attention and t.recompute and t.min_learning_rate == 0.0
    said = notes_by_key(args)
    assert said["attn_impl"].startswith("attn_impl: flashmask read as use_flash_attention: true")
    assert "mix_strategy" not in said and "dataset_type" not in said
    packed = parse_config(write_file(tmp_path, FULL_OFFLINE_DATA.replace("mix_strategy: concat", "packing: true")))
    assert notes_by_key(packed)["packing"] == ("packing: accepted but has no effect here: dataset_type: pretrain reads "
                                         "input_dir's token files (in PaddleFormers too)")
