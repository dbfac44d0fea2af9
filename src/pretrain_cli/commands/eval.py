"""`pretrain-cli eval`: loss and perplexity of a model over a token file, or over a run's own eval batches."""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

from pretrain_cli.commands import check_counts
from pretrain_cli.counts import count
from pretrain_cli.errors import UserError

# `--key value` after the options: the training keys, applied to --config's file or to the record of the run that
# wrote --model (its args.json), as `train` applies them, or, for a model no run wrote, the kernel keys alone (cli.py
# hands them over as `ns.overrides`).
TAKES_RUN_OVERRIDES = True


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.usage = ("pretrain-cli eval {--model DIR --data PREFIX | --config FILE | --model RUN_DIR} [options] "
                    "[--key value ...]")
    parser.add_argument("--model", default=None,
                        help="model directory (HF safetensors, a run's output_dir or checkpoint-N) or a preset name "
                             "(random init, seeded by --seed); with --config defaults to its output_dir "
                             "(or its newest checkpoint). A directory a run wrote brings that run's settings "
                             "(its args.json): without --data, eval evaluates its --split as --config does; a "
                             "run's output_dir without its final model stands for its newest checkpoint")
    parser.add_argument("--data", default=None,
                        help="token file prefix (<prefix>.bin/.idx) to cut into windows; with --config (or a run's "
                             "--model) in that run's settings (default: none)")
    parser.add_argument("--max_seq_length", type=int, default=None,
                        help="window length L in tokens (default: the run's; required for a model no run wrote; "
                             "with --config, the run's max_seq_length for its split)")
    parser.add_argument("--config", default=None,
                        help="a training argument file (or a run's args.json): evaluate its --split (valid/test) "
                             "on the same batches the trainer uses (valid: eval_iters, test: 10 x eval_iters; a "
                             "run's args.json: times the data ranks it ran on, each of which read its slice); "
                             "`--key value` after the options "
                             "overrides its keys as in `train` (default: none)")
    parser.add_argument("--split", default=None, choices=("valid", "test"),
                        help="split of --config (or of a run's --model) to evaluate; not with --data, whose "
                             "windows are evaluated instead (default: valid)")
    parser.add_argument("--batch_size", type=int, default=None,
                        help="windows per forward pass (default: 4; with --config, the run's "
                             "per_device_eval_batch_size, which this overrides)")
    parser.add_argument("--max_batches", type=int, default=None,
                        help="stop after this many batches (default: the whole file; with --config, the run's: "
                             "eval_iters for valid, 10 x eval_iters for test, times a recorded run's data ranks)")
    parser.add_argument("--attention_mask_type", default=None, choices=("causal", "document"),
                        help="document: a token attends only to earlier tokens of its own document (boundaries "
                             "from the token file's index), as a run with attention_mask_type: document trains "
                             "(default: causal for --data; with --config the run's own setting, which this "
                             "overrides)")
    parser.add_argument("--reset_position_ids", default=None, choices=("true", "false"),
                        help="with document masking: RoPE positions restart at each document (default: true for "
                             "--data; with --config the run's own setting, which this overrides)")
    parser.add_argument("--seed", type=int, default=42,
                        help="init seed when --model has no weights (a config.json alone, a preset), as `train` "
                             "seeds a new model: the run's seed default (default: %(default)s)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a summary line")


def _model_config(name: str, length: int, length_key: str, key: str = "--model"):
    """(model_dir, cfg) without Paddle, so a bad model fails in well under a second; weights in files not read
    (pytorch_model.bin) are refused here, never evaluated at random init, and windows of `length` tokens are judged
    as `train` judges its samples (`position_checks.length_notes`, naming `length_key`): beside weights, a sliding
    window they reach or PaddleNLP's dynamic_ntk past max_position_embeddings is refused; a model without weights
    is the one `train` would build for `length` (its range raised to it), never refused. `key`: where the model was
    named (--model, or the --config file's output_dir)."""
    from pretrain_cli.config.presets import resolve_model_dir
    from pretrain_cli.models import position_checks
    from pretrain_cli.models.config import ModelConfig
    from pretrain_cli.models.model_files import has_weights
    from pretrain_cli.models.foreign_weights import refuse_unread

    model_dir = str(resolve_model_dir(name, key=key))
    refuse_unread(model_dir, key)
    pretrained = has_weights(model_dir)
    cfg = ModelConfig.from_file(model_dir, pretrained=pretrained)  # (the window: judged below)
    for note in position_checks.length_notes(cfg, os.path.join(model_dir, "config.json"), length, length_key,
                                           pretrained):
        print(f"note: {note}", file=sys.stderr)
    return model_dir, cfg


def _past_positions(cfg, model_dir: str, length: int, source: str) -> None:
    """A note when windows of `length` reach positions the weights have not been trained on
    (`models.config.past_positions`): past config.json's max_position_embeddings and past the length the run that
    wrote `model_dir` trained at (its args.json: a run continued past that number keeps it in config.json). A model
    without weights has no such positions: it is the one `train` builds for `length` (its range raised to it, as
    `_model_config`'s note says), so, as `train` does for a new model, nothing is said."""
    from pretrain_cli.models.config import past_positions
    from pretrain_cli.models.model_files import has_weights
    from pretrain_cli.storage.checkpoint_dir import CheckpointDir

    if not has_weights(model_dir):
        return
    if past := past_positions(cfg, length, source, trained=CheckpointDir(model_dir).trained_length):
        print(f"note: {past}", file=sys.stderr)


def _random_init(name: str, model_dir: str, source: str, seed: int) -> None:
    """Said on stderr before any number when the model has no weights (a config.json alone, a preset)."""
    if source != "trained weights":
        from pretrain_cli.config.presets import is_preset
        from pretrain_cli.models.foreign_weights import random_init_note

        print(random_init_note(name, is_preset(model_dir), seed), file=sys.stderr)


def _dropless_note(source: str, cfg, factor) -> None:
    """A run that trained with a capacity dropped assignments its evaluation computes (`models.moe`: evaluation is
    dropless, the run's own eval_loss too, as transformers runs the model): one note, so a loss is not read as the
    training computation's."""
    if getattr(cfg, "num_experts", 0) and isinstance(factor, (int, float)) and factor > 0:
        print(f"note: {source}: its run trained with capacity_factor {factor:g} (the assignments past an expert's "
              f"capacity dropped); eval runs every token (dropless), as the run's own evaluation and transformers do",
              file=sys.stderr)


def _report(ns: argparse.Namespace, result: dict, t0: float, what: str) -> int:
    """Print one JSON object (`--json`) or one line that says in words what was measured (the kernels that
    measured it on stderr, as `train` logs them)."""
    result["seconds"] = round(time.perf_counter() - t0, 3)
    print(f"kernels: {result['kernels']}", file=sys.stderr)
    if ns.json:
        print(json.dumps(result, ensure_ascii=False))
    else:
        print(f"eval: {what}; loss {result['loss']:.4f}; perplexity {result['ppl']:.2f} ({result['tokens']:,} "
              f"predicted tokens; {result['model']}, {result['model_weights']}; {result['seconds']:.1f} s)")
    return 0


def _loss_sum(model, batches, total: int):
    """`evaluation.loss_sum` with a progress bar on stderr when it is a terminal (as `train` shows one);
    never in a pipe or a log file, and never on stdout, which holds only the result."""
    from pretrain_cli.training.evaluation import loss_sum

    bar = None
    if sys.stderr.isatty():
        from tqdm import tqdm

        bar = tqdm(total=total, desc="eval", unit="batch", dynamic_ncols=True, mininterval=0.5, leave=False)
    try:
        return loss_sum(model, batches, progress=bar)
    finally:
        if bar is not None:
            bar.close()


def _check_tokenizer(data: str, model_dir: str) -> None:
    """`--data` made by another tokenizer than the one beside the model (a run's output or an HF directory with a
    tokenizer.json) is refused, as `train` refuses it (`data.check_tokenizer`); beside a model without one (a run
    without a tokenizer), than the one its args.json records (`tokenizer_lineage.recorded_problem`, as a resume is
    judged). A model directory with neither, or a token file without its sidecar, is not judged."""
    from pathlib import Path

    from pretrain_cli.data import check_tokenizer
    from pretrain_cli.data.indexed import strip_prefix
    from pretrain_cli.data.tokenizer import load_tokenizer
    from pretrain_cli.training.tokenizer_lineage import recorded_problem

    if (Path(model_dir) / "tokenizer.json").is_file():
        check_tokenizer([strip_prefix(data)], load_tokenizer(model_dir), where="--data: ")
    elif (found := recorded_problem(model_dir, None, [strip_prefix(data)], "", "--data")) is not None:
        raise UserError(f"{found[0]}; pass --data made with that tokenizer")


def _trained_model(config: str, out: str) -> str:
    """The model a run's output_dir holds (`recorded.trained_model`: its final directory, else its newest
    checkpoint, which a note names)."""
    from pretrain_cli.orchestration.recorded import trained_model

    model, note = trained_model(out)
    if model is None:
        raise UserError(f"{config}: output_dir {out} holds no trained model or checkpoint yet; pass --model")
    if note:
        print(note, file=sys.stderr)
    return str(model)


def _main_config(ns: argparse.Namespace, overrides: list[str]) -> int:
    """`--config`: the run's own split, model from --model or the run's output_dir / newest checkpoint. Of a run's
    record (its args.json), the model it evaluates, when that run wrote it, is also the architecture the split is
    prepared with (`recorded_paths.evaluated_model`): the path the run named its model by, relative to where it
    started, is never read."""
    from pretrain_cli.orchestration.prepare import prepare
    from pretrain_cli.orchestration.targets import inference_kernels, inference_target
    from pretrain_cli.config.compute import forward_kernels
    from pretrain_cli.config.parser import parse_config
    from pretrain_cli.orchestration.recorded import SPLIT_KEYS, data_ranks, differences, idle_kernel_keys, no_effect
    from pretrain_cli.orchestration.recorded_paths import (evaluated_model, input_dir_of, record_of, run_output,
                                                           same_run)
    from pretrain_cli.config.presets import resolve_model_dir
    from pretrain_cli.training.weight_source import load_for_inference
    from pretrain_cli.training.evaluation import perplexity, split_batches

    no_effect(overrides, "eval", SPLIT_KEYS)  # (--learning_rate 3 changes nothing here: said, not ignored)
    ns.split = ns.split or "valid"
    changes = {"do_train": False, "do_eval": ns.split == "valid", "do_predict": ns.split == "test"}
    if ns.attention_mask_type is not None:
        changes["attention_mask_type"] = ns.attention_mask_type
    if ns.reset_position_ids is not None:
        changes["reset_position_ids"] = ns.reset_position_ids == "true"
    if ns.max_seq_length is not None:  # the options apply to the run's split as its keys would
        changes["max_seq_length"] = ns.max_seq_length
    if ns.batch_size is not None:
        changes["per_device_eval_batch_size"] = ns.batch_size
    model_name, model_key = ns.model, "--model" if ns.model else f"{ns.config}: output_dir"
    if (record := record_of(ns.config)) is not None:  # a run's args.json: its model is the directory evaluated
        model_name = model_name or _trained_model(ns.config, str(run_output(ns.config)))  # (wherever it started)
        if same_run(ns.config, model_dir := resolve_model_dir(model_name, key=model_key)):
            changes.update(evaluated_model(model_dir))  # never the path the run named it by
        read_from, note = input_dir_of(ns.config, record, overrides)  # (a relative one: where the run started)
        changes.update(read_from)
        if note:
            print(note, file=sys.stderr)
    target = inference_target()
    spec = prepare(ns.config, overrides, target, changes, record="arguments",  # (as the run took them)
                   command="eval")
    # (--fp16 true on CPU changes no kernel: said, as for --data; `changes` set no kernel key, so the file parsed
    # once, by `prepare`, is the one to judge, and again only without each kernel key given)
    for note in idle_kernel_keys(spec.args, lambda tokens: parse_config(ns.config, tokens), overrides, "eval"):
        print(note, file=sys.stderr)
    lp = spec.run.loop
    model_name = model_name or _trained_model(ns.config, spec.run.output.output_dir)
    length_key = "--max_seq_length" if ns.max_seq_length is not None else f"{ns.config}: max_seq_length"
    model_dir, cfg = _model_config(model_name, spec.run.data.max_seq_length, length_key, model_key)
    d = spec.run.data
    for note in differences(model_dir, d.max_seq_length, d.attention_mask_type, d.reset_position_ids):
        print(note, file=sys.stderr)
    _past_positions(cfg, model_dir, d.max_seq_length, length_key)
    if cfg.vocab_size != spec.model_cfg.vocab_size:
        raise UserError(f"{model_key}: vocab_size {cfg.vocab_size} differs from the config's model "
                        f"({spec.model_cfg.vocab_size}); evaluate the model this config trains")
    _dropless_note(ns.config, cfg, spec.run.moe.capacity_factor)
    # as `train` runs it, but a forward alone of the model loaded (`forward_kernels`: flash-attn at 193-256 anywhere)
    run = forward_kernels(spec.run, spec.args, cfg, target)
    model, source = load_for_inference(model_dir, cfg, ns.seed, *inference_kernels(run))
    _random_init(model_name, model_dir, source, ns.seed)
    t0 = time.perf_counter()
    # what the run's own evaluation read: its iterations' global batches, on each of its data ranks a slice
    per_rank, ranks = lp.eval_iters if ns.split == "valid" else lp.test_iters, data_ranks(ns.config)
    batches, bs = per_rank * ranks if ns.max_batches is None else ns.max_batches, lp.eval_batch
    if ranks > 1 and ns.max_batches is None:
        print(f"note: {ns.config}: its run evaluated {count(per_rank, 'batch')} of {bs} on each of "
              f"{count(ranks, 'data rank')}; the same {count(per_rank * ranks * bs, 'window')} here, as "
              f"{count(batches, 'batch')} of {bs}", file=sys.stderr)
    held = len(spec.splits.get(ns.split))
    if batches * bs > held:  # the run's count too: its start-up note (the test split's: do_predict only) is in its log
        once = (f"; --max_batches {held // bs} reads each at most once" if held >= bs
                else f"; --batch_size {held} --max_batches 1 reads each once" if held else "")  # (a batch > the split)
        print(f"note: the {ns.split} split holds {count(held, 'sample')}: {count(batches, 'batch')} of {bs} read "
              f"{batches * bs}, "
              f"so samples repeat{once}", file=sys.stderr)
    total, predicted, samples = _loss_sum(model, split_batches(spec.splits.get(ns.split), bs, batches), batches)
    loss = total / max(predicted, 1.0)
    mask = spec.run.data.attention_mask_type
    result = {"loss": loss, "ppl": perplexity(loss), "tokens": int(predicted), "batches": batches,
              "model": model_name, "config": ns.config, "split": ns.split, "model_weights": source,
              "attention_mask_type": mask, "kernels": model.kernels.describe()}
    masked = ", document-masked" if mask == "document" else ""
    return _report(ns, result, t0, f"{count(samples, 'sample')} of {spec.run.data.max_seq_length} tokens from the "
                   f"{ns.split} split of {ns.config} ({count(batches, 'batch')} of {bs}{masked})")


def main(ns: argparse.Namespace) -> int:
    from pretrain_cli.config.presets import resolve_model_dir
    from pretrain_cli.orchestration.recorded import WINDOW_KEYS, model_argument, no_effect, record_path, run_arguments

    check_counts(ns, "max_seq_length", "batch_size", "max_batches")  # 0 is no "use the run's"
    if not 0 <= ns.seed < 2**32:  # train's range for its seed; Paddle refuses a negative one with a traceback
        raise UserError(f"--seed: must be in [0, 2^32), got {ns.seed}")
    if ns.split is not None and ns.data is not None:  # evaluating --data's windows would drop --split silently
        raise UserError(f"--split {ns.split}: picks a split of a run's own data, but --data {ns.data} is evaluated "
                        f"instead; drop --split to evaluate --data's windows, or drop --data to evaluate the split")
    overrides = list(getattr(ns, "overrides", None) or [])
    if ns.model is not None:  # a run stopped before its export: its newest checkpoint, as --config takes it
        ns.model, note = model_argument(ns.model)
        if note:
            print(note, file=sys.stderr)
    if ns.config is None and ns.data is None and ns.model is not None:
        record = record_path(resolve_model_dir(ns.model, key="--model"))
        if record is not None:  # a run's directory: its own split, as `--config` its args.json
            ns.config = str(record)
    if ns.config is not None and ns.data is None:
        return _main_config(ns, overrides)
    reads, model_key = WINDOW_KEYS, "--model"  # --data's windows: their length and mask, and the kernels
    # --config's file with the overrides, parsed once: its output_dir names the model when --model does not
    args, recorded, notes = run_arguments(ns.config, None, overrides, "eval") if ns.config else (None, False, [])
    if ns.config is not None and ns.model is None:
        ns.model = _trained_model(ns.config, args.training.output_dir)
        model_key = f"{ns.config}: output_dir"
        reads = (*WINDOW_KEYS, "output_dir")  # (the model is the one the file's output_dir holds)
    if ns.model is not None and ns.data is None:  # not a run's directory (an export, a download): no split of its own
        raise UserError(f"eval: --model {ns.model} is not a run's directory (no args.json of a run), so it names no "
                        f"data: pass --data PREFIX (a .bin/.idx token file made with this model's tokenizer), or "
                        f"--config CFG.json")
    if ns.model is None or ns.data is None:
        raise UserError("eval: pass --model and --data (or --config CFG.json)")
    model_path = resolve_model_dir(ns.model, key=model_key)
    if ns.config is None:  # the record of the run that wrote --model, if one did
        args, recorded, notes = run_arguments(None, model_path, overrides, "eval")
    no_effect(overrides, "eval", reads)
    for note in notes:
        print(note, file=sys.stderr)
    # what sets the windows' length, named by its notes and refusals: the option, else --config's file or the record
    source = ("--max_seq_length" if ns.max_seq_length is not None else
              f"{ns.config or record_path(model_path)}: max_seq_length")
    # the run's windows, mask and kernels unless the options say otherwise; of a model no run wrote, `args` holds the
    # kernel overrides alone (no run's windows to take)
    if recorded:
        d = args.data
        ns.max_seq_length = d.max_seq_length if ns.max_seq_length is None else ns.max_seq_length
        ns.attention_mask_type = ns.attention_mask_type or d.attention_mask_type
        if ns.reset_position_ids is None and d.reset_position_ids is not None:
            ns.reset_position_ids = str(d.reset_position_ids).lower()
        if ns.config is not None:
            print(f"note: --data {ns.data}: its windows, in {ns.config}'s settings (not that run's --split)",
                  file=sys.stderr)
    if ns.max_seq_length is None:
        raise UserError("eval: pass --max_seq_length (--model is no directory a run wrote, so it has no default)")
    from pretrain_cli.data.indexed import check_token_ids, open_token_file
    from pretrain_cli.training.evaluation import (document_starts, perplexity, read_tokens, window_batches,
                                                  window_count)

    tokens, loss_mask = read_tokens(ns.data)
    if (len(tokens) - 1) // ns.max_seq_length < 1:
        raise UserError(f"--data: {ns.data} has {count(len(tokens), 'token')}, fewer than one window of "
                        f"{ns.max_seq_length + 1}; lower --max_seq_length")
    model_dir, cfg = _model_config(ns.model, ns.max_seq_length, source, model_key)
    _past_positions(cfg, model_dir, ns.max_seq_length, source)
    check_token_ids(open_token_file(ns.data), cfg.vocab_size, vocab=f"the model's vocab_size {cfg.vocab_size}",
                    fix="the data was tokenized for another model")  # (sidecar values, else one chunked scan)
    _check_tokenizer(ns.data, model_dir)
    from pretrain_cli.orchestration.targets import inference_kernels
    from pretrain_cli.orchestration.recorded import differences
    from pretrain_cli.training.weight_source import load_for_inference

    mask = ns.attention_mask_type or "causal"
    for note in differences(model_dir, ns.max_seq_length, mask, None if ns.reset_position_ids is None
                            else ns.reset_position_ids == "true"):
        print(note, file=sys.stderr)
    if recorded:
        _dropless_note(ns.config or f"{model_path}/args.json", cfg, args.get("capacity_factor"))
    kernels = inference_kernels(arguments=args, model_cfg=cfg, mask=mask)  # (judged with the mask its windows run)
    model, source = load_for_inference(model_dir, cfg, ns.seed, *kernels)
    _random_init(ns.model, model_dir, source, ns.seed)
    t0 = time.perf_counter()
    ns.batch_size = 4 if ns.batch_size is None else ns.batch_size
    n_windows, n_batches = window_count(len(tokens), ns.max_seq_length, ns.batch_size, ns.max_batches)
    documents = document_starts(ns.data) if mask == "document" else None
    batches = window_batches(tokens, ns.max_seq_length, ns.batch_size, ns.max_batches, loss_mask, documents,
                             ns.reset_position_ids != "false")
    total, predicted, _ = _loss_sum(model, batches, n_batches)
    if predicted == 0:
        raise UserError(f"--data: {ns.data}.lsm masks every target token of these windows; nothing to evaluate")
    loss = total / predicted
    result = {"loss": loss, "ppl": perplexity(loss), "tokens": int(predicted), "windows": n_windows,
              "model": ns.model, "data": ns.data, "max_seq_length": ns.max_seq_length, "model_weights": source,
              "attention_mask_type": mask, "kernels": model.kernels.describe()}
    masked = ", document-masked" if documents is not None else ""
    return _report(ns, result, t0, f"{count(n_windows, 'window', grouped=True)} of {ns.max_seq_length} tokens from "
                   f"{ns.data}{masked}")
