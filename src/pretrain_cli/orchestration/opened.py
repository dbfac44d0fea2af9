"""What a run names, opened and checked before Paddle is imported: the model config (a local directory or a preset,
with the keys that resize it), the tokenizer (against the model's vocabulary; its bos/eos/pad ids for the config.json
a run writes), the token files and their splits, and the output directory `train` will write in. `prepare` decides
when each runs and collects what they report; `plan` builds the model config the same way (`planned`)."""
from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

from pretrain_cli.config.parser import Arguments
from pretrain_cli.errors import UserError
from pretrain_cli.json_mistakes import loads
from pretrain_cli.run_config import RunConfig


def build_model_config(args: Arguments):
    """(model directory, ModelConfig) from `model_name_or_path` (a local directory or a preset)."""
    from pretrain_cli.config.presets import resolve_model_dir
    from pretrain_cli.models import position_checks
    from pretrain_cli.models.config import ModelConfig, past_positions, read_generation
    from pretrain_cli.models.families import FAMILIES
    from pretrain_cli.storage.checkpoint_dir import CheckpointDir

    name, out = args.model.model_name_or_path, args.training.output_dir  # (resuming in it: its checkpoint is read)
    if args.model.continue_training and name and not (out and Path(name).resolve() == Path(out).resolve()):
        from pretrain_cli.training.final_model import unfinished_run

        unfinished_run(name, "model_name_or_path: ", "point it at")  # what eval reads there, never a download
    model_dir = resolve_model_dir(args.model.model_name_or_path)
    if args.model.continue_training:  # weights in files not read (pytorch_model.bin): named, with the conversion
        from pretrain_cli.models.foreign_weights import refuse_unread

        refuse_unread(model_dir, "model_name_or_path")
    path = model_dir / "config.json"
    try:  # (utf-8, not utf-8-sig: transformers reads it so, and refuses a byte-order mark: `explain` says it)
        raw = loads(path.read_bytes(), str(path), "a model config is one object of keys")
    except OSError as e:
        raise UserError(f"{path}: not a readable JSON model config ({e})") from None
    if not isinstance(raw, dict):
        raise UserError(f"{path}: must hold a JSON object")
    if args.model.num_hidden_layers is not None and args.model.num_hidden_layers >= 1:
        if args.model.continue_training and args.model.num_hidden_layers != raw.get("num_hidden_layers"):
            # (`train` would stop at the weights: "unexpected tensor 'model.layers.1…'", blaming the directory)
            raise UserError(f"num_hidden_layers: {args.model.num_hidden_layers} changes the model, but "
                            f"continue_training loads pretrained weights of {raw.get('num_hidden_layers')} layers; "
                            f"drop one of them")
        raw["num_hidden_layers"] = args.model.num_hidden_layers
    if args.model.vocab_size is not None and args.model.vocab_size >= 1:
        if args.model.continue_training:
            raise UserError(f"vocab_size: {args.model.vocab_size} resizes the model, but continue_training loads "
                            f"pretrained weights of vocab_size {raw.get('vocab_size')}; drop one of them")
        raw["vocab_size"] = args.model.vocab_size
    seq, limit = args.data.max_seq_length, raw.get("max_position_embeddings")
    left_out = limit is None and raw.get("model_type") in FAMILIES
    if left_out:  # what transformers' configuration class reads the directory as, and ModelConfig.from_dict too
        limit = FAMILIES[raw["model_type"]].with_defaults(raw)["max_position_embeddings"]
    if not args.model.continue_training and isinstance(limit, int) and isinstance(seq, int) and seq > limit:
        # a new model is sized to its samples, as PaddleNLP's run_pretrain.py does (max of the two), whether
        # config.json writes the range or leaves it to transformers' default; pretrained weights keep the range
        # they were trained for (below)
        raw["max_position_embeddings"] = seq
        whose = " (transformers' default: config.json leaves it out)" if left_out else ""
        args.rewritten += (f"max_position_embeddings: raised from {limit}{whose} to max_seq_length {seq} for the "
                           f"new model, whose positions are the ones it trains on (as in PaddleNLP)",)
    pretrained = bool(args.model.continue_training)  # (its refusals never advise another architecture)
    cfg = ModelConfig.from_dict(raw, source=str(path), pretrained=pretrained)
    cfg.generation = read_generation(model_dir)  # (a preset has none)
    cfg.validate(pretrained=pretrained)
    key = "--max_seq_length" if args.explicit.get("max_seq_length") == "command line" else "max_seq_length"
    if isinstance(seq, int):  # weights' sliding window, PaddleNLP's rope_scaling_type: where they change nothing
        args.rewritten += tuple(position_checks.length_notes(cfg, str(path), seq, key, pretrained))
    if past := past_positions(cfg, seq, trained=CheckpointDir(model_dir).trained_length):
        # pretrained weights train past their range, as PaddleNLP's continue_training does, and keep its number:
        # under llama3/yarn scaling it is part of the frequencies (transformers reads it as
        # original_max_position_embeddings where rope_scaling leaves that out; `rope_scaling._yarn_factor` divides
        # it where factor is left out), so another number would save another model; transformers runs any length
        args.rewritten += (f"{past}; this run trains on them, and the config.json it saves keeps "
                           f"max_position_embeddings {cfg.max_position_embeddings}, as PaddleNLP's "
                           f"continue_training does",)
    return model_dir, cfg


def beside_the_file(args: Arguments) -> str | None:
    """The line for a run started elsewhere than where its file's relative paths lead: they are read from the current
    directory (as PaddleNLP reads them), and the ones missing there but found from the file's directory or one or
    two above it (a file in `configs/` naming `./demo/data`; a run's `out/args.json` or `out/checkpoint-N/args.json`
    naming the paths it was started with) are named, with where to run. A command-line path is not judged."""
    if not args.config_path:
        return None
    here, there = Path.cwd(), Path(args.config_path).resolve().parent
    values = {"model_name_or_path": args.model.model_name_or_path,
              "tokenizer_name_or_path": args.model.tokenizer_name_or_path, "input_dir": args.data.input_dir}
    missing = {key: value for key, value in values.items() if args.explicit.get(key) == "file"
               and isinstance(value, str) and value.strip() and " " not in value.strip()  # (a blend: not judged)
               and not Path(value).is_absolute() and not _present(here / value)}
    tried = [([k for k, v in missing.items() if _present(d / v)], d) for d in (there, *there.parents[:2]) if d != here]
    keys, where = max(tried, key=lambda t: len(t[0]), default=([], None))  # the most found; of equals the nearest
    if not keys:
        return None
    are = "are" if len(keys) > 1 else "is"
    return (f"{args.config_path}: {', '.join(keys)} {are} read from the current directory ({here}), and {are} found "
            f"from {where}: run from there, or give absolute paths")


def _present(path: Path) -> bool:
    """A directory or file, or a token-file prefix (`data/c` for data/c.bin/.idx)."""
    return path.exists() or path.with_name(path.name + ".idx").exists()


def open_tokenizer(args: Arguments, model_cfg):
    """(directory, tokenizer) or (None, None); checked against the model's vocabulary when it is known."""
    from pretrain_cli.config.presets import resolve_tokenizer_dir

    tok_dir = resolve_tokenizer_dir(args.model.tokenizer_name_or_path, args.model.model_name_or_path)
    if tok_dir is None:
        if args.data.sample_mode == "padded":
            raise UserError("tokenizer_name_or_path: sample_mode 'padded' needs a tokenizer for [BOT]/[EOT]/[PAD]; "
                            "set tokenizer_name_or_path to a tokenizer directory")
        return None, None
    from pretrain_cli.data.tokenizer import load_tokenizer

    tok = load_tokenizer(tok_dir)
    if model_cfg is not None and tok.vocab_size > model_cfg.vocab_size:
        said = (f"tokenizer_name_or_path: the tokenizer in {tok_dir} has {tok.vocab_size} tokens but the model's "
                f"vocab_size is {model_cfg.vocab_size}")
        if args.model.continue_training:  # vocab_size resizes a new model only (`build_model_config` refuses it)
            raise UserError(f"{said}, the size of its pretrained weights; resize them with transformers "
                            f"(`model.resize_token_embeddings({tok.vocab_size})`, then `save_pretrained`) and "
                            f"continue from that directory, or use a tokenizer of at most {model_cfg.vocab_size} "
                            f"tokens (the model's own, without tokens added to it)")
        raise UserError(f"{said}; build the model to the tokenizer's size with --vocab_size {tok.vocab_size} (the key "
                        f"vocab_size), or use a smaller tokenizer")
    return tok_dir, tok


def unused_vocab(args: Arguments, model_cfg, tokenizer) -> list[str]:
    """A note when most of a new model's vocabulary is rows no token id reaches: a preset's 151,936 with an 8,192-token
    tokenizer of one's own are 147 M of Qwen3-0.6B's parameters trained, saved and in every softmax for nothing. Not
    for pretrained weights (their vocabulary is theirs), a vocab_size the user set, or a vocabulary padded past its
    tokenizer (Qwen's 151,665 tokens in 151,936 rows): only a model at least twice its tokenizer's size. The size
    it names is the tokenizer's rounded up to a multiple of 128 x tensor_parallel_degree, as Megatron pads a
    vocabulary: whole 128-row tiles for the head's matmul on each tensor-parallel slice."""
    have, used = model_cfg.vocab_size, tokenizer.vocab_size
    if args.model.continue_training or args.model.vocab_size or have < 2 * used:
        return []
    tp = max(1, int(args.training.tensor_parallel_degree or 1))
    fit = -(-used // (128 * tp)) * 128 * tp  # the tokenizer's size, rounded up
    if fit >= have:  # the padding asked for is no smaller than what the model has
        return []
    from pretrain_cli.models.flops import param_counts

    rows = (have - used) * model_cfg.hidden_size * (1 if model_cfg.tie_word_embeddings else 2)  # embedding (+ head)
    share = rows / param_counts(model_cfg)["total"]
    return [f"vocab_size: the model has {have:,} rows, its tokenizer {used:,} tokens: {rows / 1e6:.1f} M parameters "
            f"({share:.0%} of the model) that no token id reaches, trained, saved and in the head's softmax; "
            f"--vocab_size {fit} builds the model to the tokenizer's size rounded up to a multiple of "
            f"{f'128 x tensor_parallel_degree {tp} = {128 * tp}' if tp > 1 else '128'}"]


def tokenizer_ids(model_cfg, tokenizer) -> tuple[object, list[str]]:
    """(`model_cfg` with the tokenizer's bos/eos/pad ids, notes): the config.json a run writes (checkpoints, final
    export) names the tokens its data holds, so transformers' `generate` stops at the EOS the model learned, where
    `pretrain-cli generate` stops. A preset's ids are its published tokenizer's (Qwen's 151643): with another
    tokenizer they name another token, or none in the vocabulary. An eos list that holds the tokenizer's EOS
    (Llama-3-Instruct's) is kept; a role the tokenizer lacks keeps the config's id; an id the config lacked is
    filled in without a note."""
    changes, replaced = {}, []
    for role in ("bos", "eos", "pad"):
        key, ours = f"{role}_token_id", getattr(tokenizer, f"{role}_token_id")
        have = getattr(model_cfg, key)
        if ours is None or have == ours or (isinstance(have, list) and ours in have):
            continue
        changes[key] = ours
        if have is not None:
            replaced.append(f"{key} {ours} ({tokenizer.special_tokens.get(role)}) for {have}")
    notes = [f"token ids: the run's config.json takes the tokenizer's {', '.join(replaced)} (the model's), the ids "
             f"its token files hold, so transformers' generate stops where pretrain-cli generate does"
             ] if replaced else []
    return (replace(model_cfg, **changes) if changes else model_cfg), notes


def open_splits(run: RunConfig, model_cfg, tokenizer):
    from pretrain_cli.data import build_datasets

    lp, d = run.loop, run.data
    per_batch = lp.eval_batch * run.parallel.data_world_size  # an evaluation batch over every data rank
    reads = (("train", lp.do_train, 1), ("valid", lp.do_eval, lp.eval_iters * per_batch),
             ("test", lp.do_predict, lp.test_iters * per_batch))
    need = {name: n for name, flag, n in reads if flag}  # each split the run uses: the samples it reads there
    return build_datasets(input_dir=d.input_dir, split=d.split, max_seq_length=d.max_seq_length, seed=lp.seed,
                          sample_mode=d.sample_mode, tokenizer=tokenizer, data_cache=d.data_cache, need=need,
                          vocab_size=model_cfg.vocab_size, document_mask=d.document_mask,
                          reset_position_ids=d.reset_position_ids, split_text=d.split_text)


def open_token_files(input_dir: str) -> None:
    """Every source of `input_dir` opens as a token file (what `open_splits` needs first, whatever the split)."""
    from pretrain_cli.data import open_token_file
    from pretrain_cli.data.blend import parse_input_dir

    for _, prefix in parse_input_dir(input_dir):
        open_token_file(prefix, key="input_dir")


def check_output_dir(output_dir: str) -> Path:
    """`output_dir` is a directory this process can create and write in (what `train` needs before its first
    save; `check` asks the same). Probed by creating and removing an empty directory: permission bits do not
    tell (root passes `access()` on /sys and on read-only mounts, where mkdir still fails)."""
    import tempfile

    out = Path(output_dir)
    if out.exists() and not out.is_dir():
        raise UserError(f"output_dir: {out} is a file, not a directory; choose another output_dir")
    here = out
    while not here.exists() and here != here.parent:
        here = here.parent
    if not here.is_dir():
        raise UserError(f"output_dir: {here} (part of {out}) is a file, not a directory; choose another output_dir")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".pretrain-cli-probe-", dir=here))
    except OSError as e:
        raise UserError(f"output_dir: cannot create {out} ({here}: {e.strerror}); choose a directory you can "
                        f"write to") from None
    return out


def foreign_model(run) -> None:
    """A training run's `output_dir` that holds model weights no run wrote there (no args.json: a downloaded or
    exported model, often the one `model_name_or_path` reads with continue_training): the run's final model
    replaces them at its end, so it is refused unless `overwrite_output_dir` says to (as transformers' example
    scripts refuse a non-empty output_dir). A run's own directory, which has its args.json, resumes as before."""
    from pretrain_cli.models.foreign_weights import weight_files
    from pretrain_cli.run_dir import ARGS_FILE

    out = Path(run.output.output_dir)
    if not run.loop.do_train or run.output.overwrite or not out.is_dir() or (out / ARGS_FILE).exists():
        return
    read, unread = weight_files(out)
    weights = read + unread
    if weights:
        raise UserError(f"output_dir: {out} holds a model no run wrote there ({weights[0]}, no {ARGS_FILE}), which "
                        f"this run's final model would replace; choose another output_dir, or set "
                        f"overwrite_output_dir: true to replace it")


def placeholder_config():
    """A model shape that passes every check, so argument problems are still found when config.json is broken."""
    from pretrain_cli.models.config import ModelConfig

    return ModelConfig(num_attention_heads=1, num_key_value_heads=1, intermediate_size=1)


def _named(names: list[str], most: int = 4) -> str:
    return ", ".join(names) if len(names) <= most else f"{', '.join(names[:most])}, ... {names[-1]}"


def _earlier_records(run, out: Path, start: int) -> list[str]:
    """What opening the run's records does to an earlier run's (`training.metrics.MetricsWriter`): metrics.jsonl is
    written anew at step 0 (cut to `start` on a resume), and report_to's VisualDL/TensorBoard files under logging_dir
    are replaced by the new run's at step 0 (`trackers._Records._rebuild`; cut to `start` on a resume)."""
    from pretrain_cli.counts import count
    from pretrain_cli.run_dir import METRICS_FILE
    from pretrain_cli.training.trackers import TensorBoard, VisualDL

    said, steps = [], []
    if (out / METRICS_FILE).is_file():
        with open(out / METRICS_FILE, "rb") as f:
            for line in f:
                try:
                    step = json.loads(line).get("step")
                except (ValueError, AttributeError, RecursionError):  # (a torn last line: dropped all the same)
                    step = None
                steps.append(step if isinstance(step, (int, float)) else 0)
    gone = [step for step in steps if start == 0 or step > start]
    if gone:
        upto = f"to step {max(gone):g}" if start == 0 else f"past step {start}"
        said.append(f"{count(len(gone), 'record')} of {METRICS_FILE} ({upto})")
    root = Path(run.output.logging_dir or out / "runs")
    for tracker in (VisualDL, TensorBoard):
        files = sorted(p.name for p in root.glob("*") if tracker.pattern.match(p.name)) \
            if tracker.name in run.output.report_to and root.is_dir() else []
        if files:
            said.append(f"{tracker.name}'s {count(len(files), 'file')} in {root} ({_named(files)})" if start == 0
                        else f"{tracker.name}'s records past step {start} in {root}")
    return said


def overwritten(run, start: int, reads=()) -> str | None:
    """What a training run under `overwrite_output_dir` removes from output_dir as it opens it
    (`training.run.open_output_dir`), named with their count before it does (`check`), or None: the checkpoints past
    `start` (0, or resume_from_checkpoint's step), an earlier run's final model unless the run reads its model or
    tokenizer there (`reads`), and the earlier run's records past `start` (`_earlier_records`: metrics.jsonl and the
    VisualDL/TensorBoard files; args.json, rewritten by every run, is named beside them). PaddleNLP's
    overwrite_output_dir removes nothing (it only skips the resume), so a PaddleNLP user's flag would otherwise lose
    them unannounced. They go at the start, not at this run's first save: its args.json and metrics.jsonl are
    rewritten then, and a re-run or a launcher restart (without the flag) would resume the earlier run's checkpoints
    into this run's records."""
    from pretrain_cli.counts import count
    from pretrain_cli.run_dir import ARGS_FILE, checkpoints_past
    from pretrain_cli.training.final_model import earlier_final

    out = Path(run.output.output_dir)
    if not (run.loop.do_train and run.output.overwrite and out.is_dir()):
        return None
    gone = [p.name for p in checkpoints_past(out, start)]  # as `training.checkpoint.remove_past` removes them
    what = [f"{count(len(gone), 'checkpoint')} past it ({_named(gone)})"] if gone else []
    if (out / ARGS_FILE).is_file() and not any(d and Path(d).resolve() == out.resolve() for d in reads):
        files, step = earlier_final(out)
        if files:
            what.append(f"the final model{'' if step is None else f' of step {step}'} an earlier run exported "
                        f"({count(len(files), 'file')}: {_named([f.name for f in files])})")
    what += _earlier_records(run, out, start)
    if not what:
        return None
    listed = ", ".join(what[:-1]) + " and " + what[-1] if len(what) > 1 else what[0]
    args = f", and rewrites its {ARGS_FILE}" if (out / ARGS_FILE).is_file() else ""
    return (f"overwrite_output_dir: train starts at step {start} and first removes from {out} {listed}{args}; "
            f"PaddleNLP's overwrite_output_dir removes nothing (it only skips the resume): to keep them, choose "
            f"another output_dir")
