"""What a PaddleFormers file asks for beyond its names for our keys (`paddlenlp_keys` reads those): its jsonl data
pipeline, which `train` does not build, and its defaults where they differ from PaddleNLP's (ours).

A `stage: PT` file of paddleformers-cli (examples/config/pt/*.yaml) reads its data through the jsonl pipeline of its
DataArguments (`train_dataset_path`, `packing`, `mix_strategy`, ...: `PIPELINE`). Those keys are one line together,
naming the `pretrain-cli preprocess` command that turns the file's jsonl into the .bin/.idx token files read here:
its PT packing is this one (each document's tokens and an EOS, concatenated and cut into max_seq_len samples:
paddleformers/datasets/SFTDataset.py). `dataset_type: pretrain` is its own reading of .bin/.idx files from
`input_dir` (`create_pretrained_dataset`, Megatron's sample index), as here: the pipeline's keys change nothing then.

A file is PaddleFormers' when it sets a key that names PaddleFormers as its reader (`IDENTIFYING`): its own names for
keys PaddleNLP names otherwise (`tensor_model_parallel_size`, `max_seq_len`, `min_lr`, `attn_impl`, ...,
`data_parallel_size`) and `stage`, its paddleformers-cli workflow (no field of PaddleNLP's run_pretrain.py or llm/
finetune argument classes). Its other keys without effect here do not count: PaddleNLP's own files set some
(llm/config/deepseek-v3/sft_128k_argument.json: `using_fake_gate`, `pre_alloc_memory`, `tensorwise_offload_optimizer`),
others are common to other Paddle trainers' files (`global_batch_size`, `num_nextn_predict_layers`), and such a file
trains with PaddleNLP's defaults. Nor does YAML alone: every command here takes a YAML argument file of PaddleNLP's
keys. Where a PaddleFormers file leaves out a key whose default differs there (`DEFAULTS`), the parser takes
PaddleFormers' value with a note naming both, so that the file trains as it does there; another file, or a key the
file or the command line sets, keeps its value.
"""
from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path

from pretrain_cli.config.arguments import SECTIONS
from pretrain_cli.config.paddlenlp_keys import ALIAS_OF
from pretrain_cli.errors import UserError

# its DataArguments' jsonl pipeline (paddleformers/cli/hparams/data_args.py) -> its default
PIPELINE = {
    "train_dataset_type": None, "train_dataset_path": None, "train_dataset_prob": None,
    "eval_dataset_type": "erniekit", "eval_dataset_path": "examples/data/sft-eval.jsonl", "eval_dataset_prob": "1.0",
    "dataset_name": "KnowledgeBasedSFTReader", "offline_dataset_path": None, "num_samples_each_epoch": 6000000,
    "random_shuffle": True, "greedy_intokens": True, "buffer_size": 500, "in_tokens_batching": True,
    "packing": False, "truncate_packing": True, "mix_strategy": "concat",
}
# `dataset_type`: its default "iterable" (and "map") read the jsonl; "pretrain" reads input_dir's .bin/.idx files, as
# here; "offline" its own pre-tokenized files (input_dir/train, input_dir/eval), another format than .bin/.idx
READS_TOKEN_FILES = "pretrain"

# the keys that make a file PaddleFormers': its names for PaddleNLP's keys (PaddleNLP defines none of them) and `stage`
IDENTIFYING = frozenset({*(k for k, who in ALIAS_OF.items() if who == "PaddleFormers"), "data_parallel_size", "stage"})

# our key -> (PaddleFormers' value where its file leaves the key out, where the value comes from there)
DEFAULTS = {
    "min_learning_rate": (0.0, "its TrainingArguments' min_lr, the floor its linear and cosine schedules decay to"),
    "use_flash_attention": (True, "its ModelArguments: attn_impl flashmask (use_flash_attention true before it)"),
    "bf16": (True, "its FinetuningArguments train in bf16 unless compute_type is fp16; not taken where fp16 is set"),
    "continue_training": (True, "its ModelArguments: training goes on from model_name_or_path's weights"),
}
OUR_DEFAULTS = {f.name: f.default for _, cls in SECTIONS for f in fields(cls)}


def _shown(value) -> str:
    return json.dumps(value) if isinstance(value, (bool, type(None))) else str(value)


def whose_file(given: dict) -> str | None:
    """The first key of the file that names PaddleFormers as its reader (`IDENTIFYING`: the file is PaddleFormers'),
    or None."""
    return next((key for key in given if key in IDENTIFYING), None)


def take_defaults(given: dict, values: dict, explicit: dict) -> list[str]:
    """PaddleFormers' values (`DEFAULTS`) for the keys a PaddleFormers file and the command line leave out, into
    `values` (where `explicit` says so), and their notes; notes too for two differences not taken: a set
    recompute_granularity without recompute, and stage PT's LoRA default. Nothing for another file."""
    own = whose_file(given)
    if own is None:
        return []
    why = f"the file is PaddleFormers' (it sets {own})"
    notes = []
    for key, (value, source) in DEFAULTS.items():
        if key in values or (key == "bf16" and values.get("fp16")):  # (fp16 set: the precision is chosen)
            continue
        values[key], explicit[key] = value, "PaddleFormers' default"
        notes.append(f"{key}: {_shown(value)}, PaddleFormers' default ({source}), as {why}; a file without "
                     f"its names or stage gets {_shown(OUR_DEFAULTS[key])} (PaddleNLP's)")
    if "recompute_granularity" in given and "recompute" not in values:
        notes.append(f"recompute_granularity: {given['recompute_granularity']} without recompute: PaddleFormers "
                     f"recomputes whenever recompute_granularity is set (its dsv3_pretrain workflow), here only with "
                     f"recompute: true; set it for PaddleFormers' activation memory")
    if str(given.get("stage")) in ("PT", "PT-V2") and "fine_tuning" not in given:
        notes.append("fine_tuning: not set: PaddleFormers' default, LoRA, trains LoRA adapters under stage "
                     f"{given['stage']}; every parameter trains here (as fine_tuning: full)")
    return notes


def pipeline(keys: dict, given: dict, where: str) -> list[str]:
    """The data keys of PaddleFormers' jsonl pipeline (`keys`: `PIPELINE`'s and `dataset_type` as given) against what
    `train` reads: notes where they change nothing (dataset_type: pretrain, or no jsonl named), else one UserError
    naming them all and the preprocess command for the file's jsonl. `given`: the file (its tokenizer)."""
    kind = keys.get("dataset_type")
    jsonl = str(kind) != READS_TOKEN_FILES and (
        kind is not None or keys.get("train_dataset_path") is not None or keys.get("eval_dataset_path") is not None)
    if not jsonl:
        why = ("dataset_type: pretrain reads input_dir's token files (in PaddleFormers too)" if kind is not None
               else "no jsonl is read: input_dir's token files are")
        return [f"{key}: accepted but has no effect here: {why}" for key, value in keys.items()
                if key != "dataset_type" and str(value).lower() != str(PIPELINE[key]).lower()]
    named = ", ".join(keys)
    lead = (f"dataset_type: 'offline' ({named}) reads PaddleFormers' own pre-tokenized files (input_dir/train, "
            f"input_dir/eval), not .bin/.idx token files" if str(kind) == "offline" else
            f"{'train_dataset_path' if 'train_dataset_path' in keys else next(iter(keys))}: PaddleFormers' jsonl data "
            f"pipeline ({named}) is not read here, which trains on .bin/.idx token files")
    raise UserError(f"{where}: {lead}; {_preprocess(keys, given)} and remove these keys (split's valid share of it "
                    f"takes eval_dataset_path's place)")


def _preprocess(keys: dict, given: dict) -> str:
    """The preprocess command(s) and the input_dir for the jsonl of `train_dataset_path` (comma-separated sources,
    each with its `train_dataset_prob` weight)."""
    tokenizer = given.get("tokenizer_name_or_path") or given.get("model_name_or_path") or "TOKENIZER"
    paths = [p.strip() for p in str(keys.get("train_dataset_path") or "").split(",") if p.strip()]
    probs = [p.strip() for p in str(keys.get("train_dataset_prob") or "").split(",") if p.strip()]

    def run(path: str, prefix: str) -> str:
        return (f"`pretrain-cli preprocess --input_path {path} --output_prefix {prefix} --tokenizer {tokenizer} "
                f"--append_eos`")

    if len(paths) <= 1:
        prefix = f"data/{Path(paths[0]).name.split('.')[0]}" if paths else "data/train"
        return (f"tokenize the jsonl once with {run(paths[0] if paths else 'FILE.jsonl', prefix)} (each document's "
                f"tokens and an EOS, packed into max_seq_len samples as its PT packing does), set input_dir: {prefix}")
    prefixes = [f"data/{Path(p).name.split('.')[0]}" for p in paths]
    weights = probs if len(probs) == len(paths) else ["1.0"] * len(paths)
    blend = " ".join(f"{w} {q}" for w, q in zip(weights, prefixes))
    return (f"tokenize each jsonl once with {run('FILE.jsonl', 'data/NAME')} (each document's tokens and an EOS, "
            f"packed into max_seq_len samples as its PT packing does), set input_dir: \"{blend}\"")
