"""PaddleFormers' `stage: PT` files (paddleformers-cli train), as a user copies them: what `check` says of their jsonl
data pipeline, their own keys, and the defaults where paddleformers-cli differs from PaddleNLP.

The files' text is embedded as published (no download): examples/config/pt/full.yaml (commit 14e8e54),
full_tp_pp_ep.yaml (f85ac72), full_offline_data.yaml (66ba238; full_tp_pp.yaml is full.yaml with tp 2 x pp 2 and
sequence parallelism), and the keys of tests/config/benchmark/config/pt/DeepSeek-V3.yaml (0fdeb45) not in the
best-practices file of test_paddleformers_files. What the keys mean there: paddleformers/cli/hparams (DataArguments'
pipeline, ModelArguments' attn_impl and fine_tuning, FinetuningArguments' bf16 and global_batch_size),
paddleformers/trainer/training_args.py (min_lr 0.0, pad_token_id, the promoted flags), cli/train/sft/workflow.py
(dataset_type pretrain: input_dir's .bin/.idx files) and datasets/SFTDataset.py (PT packing: tokens + EOS per
document, concatenated and cut into max_seq_len samples).
"""
import json
import re
import shlex

import pytest

from pretrain_cli.cli import main as cli_main
from pretrain_cli.config.parser import check_override_keys, parse_config
from pretrain_cli.config.resolve import resolve
from pretrain_cli.errors import UserError
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


def _write(tmp_path, text: str, name: str = "full.yaml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def _without_jsonl(text: str, input_dir: str = "./data/train") -> str:
    """The file as the one line says to make it: the jsonl keys gone, input_dir set."""
    lines = [line for line in text.splitlines() if line.split(":")[0] not in (*JSONL_KEYS, "num_samples_each_epoch")]
    return "\n".join(lines + [f"input_dir: {input_dir}", ""])


def _notes(args, model: str = "micro-qwen2") -> dict:
    run = resolve(args, model_config(model), Target("cpu", 1, 0, 0, None))
    return {n.split(":")[0]: n for n in run.notes}


@pytest.mark.parametrize("text,extra", [(FULL, ()), (FULL_TP_PP, ()), (FULL_TP_PP_EP, ("num_samples_each_epoch",))])
def test_the_jsonl_pipeline_is_one_line_with_the_preprocess_command(tmp_path, text, extra):
    """16 to 20 unknown-key lines each before; now one line for the data keys, naming them and the command that
    makes their jsonl the token files read here, and nothing else of the file is unknown."""
    path = _write(tmp_path, text)
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
    args = parse_config(_write(tmp_path, _without_jsonl(text)), ["--max_steps", "10"])  # (full.yaml's -1: see docs)
    t = args.training
    assert args.data.input_dir == "./data/train" and args.data.max_seq_length == 8192
    assert t.use_flash_attention and t.recompute_granularity == "full" and "fine_tuning" in args.extra
    said = _notes(args)
    assert said["_attn_implementation"] == ("_attn_implementation: flashmask read as use_flash_attention: true (the "
                                            "attention path that never holds the [batch, heads, seq, seq] scores)")
    for quiet in ("fine_tuning", "recompute_method", "recompute_num_layers", "save_checkpoint_format"):
        assert quiet not in said, quiet  # full training, every layer its own unit, a format: what runs here
    assert said["recompute_granularity"].startswith("recompute_granularity: full without recompute: PaddleFormers "
                                                    "recomputes whenever recompute_granularity is set")
    assert "moe_token_dispatcher_type" not in text or "DeepEP" in said["moe_token_dispatcher_type"]


def test_the_promoted_flags_of_the_ep_file_are_notes_where_they_ask_for_something():
    base = ["--output_dir", "o", "--input_dir", "d", "--max_steps", "5", "--device", "cpu", "--do_train"]
    said = _notes(parse_config(None, [*base, "--clear_every_step_cache", "--partial_send_recv", "false", "--tp_sync_param",
                                      "--sync_grad", "true", "--batch_p2p_comm", "false"]))
    for key in ("clear_every_step_cache", "partial_send_recv", "tp_sync_param", "sync_grad", "batch_p2p_comm"):
        assert said[key].startswith(f"{key}: accepted but has no effect here: "), key
    assert "partial_send_recv" not in _notes(parse_config(None, [*base, "--partial_send_recv"]))


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
        parse_config(_write(tmp_path, text))
    command = e.value.lines[0].split("`")[1]
    assert cli_main(shlex.split(command)[1:]) == 0  # (pretrain-cli preprocess ...)
    capsys.readouterr()
    fixed = _write(tmp_path, _without_jsonl(text, "data/train"), "fixed.yaml")
    assert cli_main(["check", fixed, "--max_steps", "2", "--max_seq_length", "16", "--split", "80,20",
                     "--continue_training", "false", "--device", "cpu"]) == 0
    assert "check: OK" in capsys.readouterr().out


def test_several_jsonl_sources_are_blended_by_their_weights(tmp_path):
    text = FULL.replace('train_dataset_path: ./tests/fixtures/dummy/pt/train.jsonl\ntrain_dataset_prob: "1.0"',
                        'train_dataset_path: ./a/web.jsonl,./b/code.jsonl\ntrain_dataset_prob: "0.7,0.3"')
    with pytest.raises(UserError) as e:
        parse_config(_write(tmp_path, text))
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
    path = _write(tmp_path, f"dataset_type: {kind}\ntrain_dataset_path: t.jsonl\nstage: PT\n")
    with pytest.raises(UserError, match=f"^{re.escape(path)}: {re.escape(lead)}"):
        parse_config(path)


def test_the_offline_data_file_reads_every_key_as_its_token_files(tmp_path):
    """dataset_type, mix_strategy, attn_impl and fine_tuning were four unknown keys; dataset_type: pretrain is
    PaddleFormers' reading of input_dir's .bin/.idx files, as here, so its concat mix changes nothing."""
    args = parse_config(_write(tmp_path, FULL_OFFLINE_DATA))
    d, t = args.data, args.training
    assert (d.input_dir, d.split, d.max_seq_length) == ("1.0 ./data/pre-training/demo_data/data-1-part0", "998,2", 8192)
    assert t.use_flash_attention and t.recompute and t.min_learning_rate == 0.0
    said = _notes(args)
    assert said["attn_impl"].startswith("attn_impl: flashmask read as use_flash_attention: true")
    assert "mix_strategy" not in said and "dataset_type" not in said
    packed = parse_config(_write(tmp_path, FULL_OFFLINE_DATA.replace("mix_strategy: concat", "packing: true")))
    assert _notes(packed)["packing"] == ("packing: accepted but has no effect here: dataset_type: pretrain reads "
                                         "input_dir's token files (in PaddleFormers too)")


def test_a_paddleformers_file_takes_its_defaults_where_it_leaves_a_key_out(tmp_path):
    """min_lr 0.0 (PaddleNLP's min_learning_rate: 1e-5), flashmask attention and bf16 (PaddleNLP's: off): a PT file
    that leaves them out trains as in paddleformers-cli, with a note naming both values; the schedule decays to 0."""
    path = _write(tmp_path, "stage: PT\nfine_tuning: full\ninput_dir: d\noutput_dir: o\nmax_steps: 5\ndo_train: true\n"
                            "lr_scheduler_type: cosine\ndevice: cpu\n")
    args = parse_config(path)
    t = args.training
    assert (t.min_learning_rate, t.use_flash_attention, t.bf16, args.model.continue_training) == (0.0, True, True, True)
    assert args.explicit["min_learning_rate"] == "PaddleFormers' default"
    said = _notes(args)
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
    path = _write(tmp_path, _without_jsonl(FULL).replace("max_steps: -1", "max_steps: 5"))
    assert cli_main(["check", path]) == 2
    assert ("error: model_name_or_path: continue_training (PaddleFormers' default: the file leaves it out) loads "
            "pretrained weights, but 'Qwen/Qwen3-0.6B-Base' is a preset here") in capsys.readouterr().err


def test_what_the_file_or_the_command_line_sets_and_a_paddlenlp_file_keep_their_values(tmp_path):
    pf = _write(tmp_path, "stage: PT\nmin_lr: 2.0e-6\nattn_impl: eager\nbf16: false\n")
    args = parse_config(pf, ["--no_use_flash_attention", "--continue_training", "0"])
    t = args.training
    assert (t.min_learning_rate, t.use_flash_attention, t.bf16, args.model.continue_training) == (2e-6, False, False,
                                                                                                   False)
    t = parse_config(_write(tmp_path, "stage: PT\n"), ["--min_learning_rate", "1e-6"]).training
    assert (t.min_learning_rate, t.use_flash_attention, t.bf16) == (1e-6, True, True)
    assert not parse_config(_write(tmp_path, "stage: PT\nfp16: true\n")).training.bf16  # (fp16 chose the precision)
    nlp = _write(tmp_path, '{"input_dir": "d", "output_dir": "o", "max_steps": 5, "do_train": true, "device": "cpu", '
                           '"learning_rate": 3e-5, "recompute_granularity": "full"}', "nlp.json")
    args = parse_config(nlp)
    assert (args.training.min_learning_rate, args.training.use_flash_attention, args.training.bf16) == (1e-5, False, False)
    assert not any("PaddleFormers" in n for n in _notes(args).values())


# keys PaddleFormers reads that PaddleNLP-era files carry too: PaddleNLP's own llm/config/deepseek-v3/
# sft_128k_argument.json sets the first three; the last two are common to other Paddle trainers' files
SHARED_KEYS = {"using_fake_gate": False, "pre_alloc_memory": 60, "tensorwise_offload_optimizer": True,
               "global_batch_size": 32, "num_nextn_predict_layers": 1}


@pytest.mark.parametrize("name", ["nlp.json", "nlp.yaml"])
def test_a_paddlenlp_file_with_keys_paddleformers_also_reads_keeps_paddlenlp_defaults(tmp_path, name):
    """Keys without effect here that PaddleFormers also reads do not make a file PaddleFormers', in JSON or YAML: it
    trains with PaddleNLP's min_learning_rate, attention, precision and fresh weights, no PaddleFormers note."""
    path = _write(tmp_path, json.dumps({"input_dir": "d", "output_dir": "o", "max_steps": 5, "do_train": True,
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
    args = parse_config(_write(tmp_path, text, "pf.yaml"))
    assert (args.training.min_learning_rate, args.training.bf16, args.model.continue_training) == (0.0, True, True)
    assert any(f"as the file is PaddleFormers' (it sets {key})" in n for n in args.rewritten), args.rewritten


@pytest.mark.parametrize("value,on", [("flashmask", True), ("sdpa", True), ("eager", False)])
def test_each_attention_implementation_reads_as_use_flash_attention(value, on):
    assert parse_config(None, ["--attn_impl", value]).training.use_flash_attention is on
    assert parse_config(None, ["--_attn_implementation", value]).training.use_flash_attention is on


def test_another_attention_implementation_or_both_names_are_refused(tmp_path):
    with pytest.raises(UserError, match="attn_impl: 'sink' is not an attention implementation run here; set it to "
                                        "one of flashmask, sdpa, eager"):
        parse_config(_write(tmp_path, "attn_impl: sink\n"))
    with pytest.raises(UserError, match="`attn_impl` and `use_flash_attention` are one key"):
        parse_config(_write(tmp_path, "attn_impl: eager\nuse_flash_attention: true\n"))


def test_lora_is_refused_and_an_omitted_fine_tuning_is_a_note(tmp_path):
    """PaddleFormers' fine_tuning defaults to LoRA (adapters beside a frozen model), which a PT file leaves out at
    its peril: refused when set, a note when left out of a PT file (every parameter trains here)."""
    for where in (lambda: parse_config(_write(tmp_path, "stage: PT\nfine_tuning: LoRA\n")),
                  lambda: parse_config(None, ["--fine_tuning", "lora"])):
        with pytest.raises(UserError, match="fine_tuning: '(LoRA|lora)' trains LoRA adapters beside a frozen model"):
            where()
    said = _notes(parse_config(_write(tmp_path, "stage: PT\ninput_dir: d\noutput_dir: o\nmax_steps: 5\ndo_train: 1\n")))
    assert said["fine_tuning"] == ("fine_tuning: not set: PaddleFormers' default, LoRA, trains LoRA adapters under "
                                   "stage PT; every parameter trains here (as fine_tuning: full)")


def test_the_benchmark_files_own_keys_are_notes(tmp_path):
    said = _notes(parse_config(_write(tmp_path, "stage: dsv3_pretrain\ninput_dir: d\noutput_dir: o\nmax_steps: 5\n"
                                                "do_train: true\n" + BENCHMARK_KEYS)))
    for key in ("pad_token_id", "global_batch_size", "tensorwise_offload_optimizer"):
        assert said[key].startswith(f"{key}: accepted but has no effect here: "), key
    assert "recomputes it" in said["global_batch_size"] and "moe_deep_gemm" not in said  # (false: its default)


def test_plan_fit_writes_use_flash_attention_in_attn_impls_place(tmp_path, capsys):
    """The fit turns flash attention on: the fitted file says so where the file's attn_impl stood, which it replaces
    (both names in one file are refused when read)."""
    src = _write(tmp_path, "stage: PT\ninput_dir: ./data\nmodel_name_or_path: Qwen/Qwen2.5-0.5B\noutput_dir: ./ck\n"
                           "max_seq_len: 4096\nattn_impl: eager\ntensor_model_parallel_size: 1\n"
                           "per_device_train_batch_size: 8\ngradient_accumulation_steps: 4\nmax_steps: 100\ndo_train: true\n")
    out = str(tmp_path / "fitted.yaml")
    assert cli_main(["plan", src, "--device", "A100-40GB", "--gpus", "8", "--fit", "-o", out]) == 0
    assert "use_flash_attention: false -> true" in capsys.readouterr().out
    lines = (tmp_path / "fitted.yaml").read_text().splitlines()
    assert "attn_impl" not in "\n".join(lines) and lines[5] == "use_flash_attention: true"
    assert parse_config(out).training.use_flash_attention
