"""`pretrain-cli eval`: loss and perplexity of a model over a token file.

Windows are consecutive and unshuffled so the number is reproducible and comparable across
runs and tools: window k holds tokens k·L … k·L+L (L+1 tokens, neighbours share one boundary
token), so every token after the first is predicted exactly once. The loss is the mean over
every predicted token (not a mean of per-batch means, which would overweight a short last batch).
"""
from __future__ import annotations

import argparse
import glob
import json
import math
import os
import time

import numpy as np

from pretrain_cli.errors import UserError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=None,
                        help="model directory (HF safetensors or one of our checkpoints) or a preset name "
                             "(random init, seeded by --seed); with --config defaults to its output_dir")
    parser.add_argument("--data", default=None, help="token file prefix (<prefix>.bin/.idx)")
    parser.add_argument("--max_seq_length", type=int, default=None, help="window length L")
    parser.add_argument("--config", default=None,
                        help="a training argument file: evaluate its --split (valid/test) on the same eval_iters "
                             "batches the trainer uses, instead of --data windows")
    parser.add_argument("--split", default="valid", choices=("valid", "test"), help="split of --config to use")
    parser.add_argument("--batch_size", type=int, default=4, help="windows per forward pass")
    parser.add_argument("--max_batches", type=int, default=None, help="stop after this many batches")
    parser.add_argument("--seed", type=int, default=42, help="init seed when --model has no weights")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a text line")


def read_tokens(prefix: str) -> np.ndarray:
    """The whole token stream as a flat array view (memmap; nothing is loaded up front)."""
    from pretrain_cli.data.indexed import open_token_file

    ds = open_token_file(prefix)
    return ds.tokens(0, ds.num_tokens)


def windows(tokens: np.ndarray, seq_len: int, batch_size: int, max_batches: int | None = None):
    """Yield int64 batches `[b, L+1]` of consecutive windows sharing one boundary token."""
    n_windows = (len(tokens) - 1) // seq_len
    n_batches = math.ceil(n_windows / batch_size)
    if max_batches is not None:
        n_batches = min(n_batches, max_batches)
    for b in range(n_batches):
        first = b * batch_size
        last = min(first + batch_size, n_windows)
        yield np.stack([np.asarray(tokens[k * seq_len: k * seq_len + seq_len + 1], dtype=np.int64)
                        for k in range(first, last)])  # [b, seq_len+1]


def _has_weights(model_dir: str) -> bool:
    """Whether a directory holds weights at all (a preset or bare config.json does not)."""
    from pretrain_cli import convert

    return os.path.isfile(os.path.join(model_dir, convert.INDEX_FILE)) or bool(
        glob.glob(os.path.join(model_dir, "*.safetensors")))


def _model_config(name: str):
    """(model_dir, cfg) without Paddle, so a bad --model fails in well under a second."""
    from pretrain_cli.models.config import ModelConfig
    from pretrain_cli.presets import resolve_model_dir

    model_dir = str(resolve_model_dir(name, key="--model"))
    return model_dir, ModelConfig.from_file(model_dir)


def _load_model(name: str, seed: int):
    """(model, cfg, source) for `--model` NAME (a directory or a preset); used by eval and generate."""
    model_dir, cfg = _model_config(name)
    model, source = _build_and_load(model_dir, cfg, seed)
    return model, cfg, source


def _build_and_load(model_dir: str, cfg, seed: int):
    """(model, source): weights when the directory has them, else a seeded random init.

    A directory with weights that cannot be read is an error, never a silent random init."""
    from pretrain_cli import runtime

    paddle = runtime.import_paddle()
    from pretrain_cli import convert
    from pretrain_cli.models import build_model

    has_weights = _has_weights(model_dir)
    if has_weights:
        convert.find_weights(model_dir)  # a damaged index fails here, before the model is built
    paddle.seed(seed)
    model = build_model(cfg)
    if has_weights:
        convert.load_weights(model, cfg, model_dir)
    return model, ("weights" if has_weights else f"random init (seed {seed})")


def evaluate(model, tokens: np.ndarray, seq_len: int, batch_size: int, max_batches: int | None = None) -> dict:
    """Token-weighted mean loss over the windows; returns loss, ppl, tokens, windows."""
    import paddle

    from pretrain_cli.loss import causal_lm_loss_sum, loss_kernel

    model.eval()
    total, count, n_windows = 0.0, 0, 0
    with paddle.no_grad():
        for batch in windows(tokens, seq_len, batch_size, max_batches):
            ids = paddle.to_tensor(batch)  # [b, seq_len+1] int64
            logits = model(ids[:, :-1])  # [b, seq_len, vocab]
            loss_sum, n = causal_lm_loss_sum(logits, ids[:, 1:], loss_kernel(model))
            total += float(loss_sum)
            count += int(n)
            n_windows += batch.shape[0]
    loss = total / count
    return {"loss": loss, "ppl": math.exp(min(loss, 700.0)), "tokens": count, "windows": n_windows}


def _report(ns: argparse.Namespace, result: dict, t0: float, text: str) -> int:
    """Print one JSON object (`--json`) or one human line, with the elapsed time added."""
    result["seconds"] = round(time.perf_counter() - t0, 3)
    print(json.dumps(result) if ns.json else text.format(**result))
    return 0


def _main_config(ns: argparse.Namespace) -> int:
    """`--config`: the run's own split, model from --model or the run's output_dir / newest checkpoint."""
    from pretrain_cli import checkpoint, train

    flag = "--do_eval" if ns.split == "valid" else "--do_predict"
    spec = train.prepare(ns.config, ["--do_train", "false", "--do_eval", "false", "--do_predict", "false",
                                     flag, "true"])
    t = spec.args.training
    model_name = ns.model
    if model_name is None:
        out = t.output_dir
        model_name = out if _has_weights(out) else str(checkpoint.latest_checkpoint(out) or "")
        if not model_name:
            raise UserError(f"{ns.config}: output_dir {out} holds no trained model or checkpoint yet; pass --model")
    model_dir, cfg = _model_config(model_name)
    if cfg.vocab_size != spec.model_cfg.vocab_size:
        raise UserError(f"--model: vocab_size {cfg.vocab_size} differs from the config's model "
                        f"({spec.model_cfg.vocab_size}); evaluate the model this config trains")
    from pretrain_cli.trainer import split_loss

    model, source = _build_and_load(model_dir, cfg, ns.seed)
    t0 = time.perf_counter()
    batches, bs = ns.max_batches or t.eval_iters, t.per_device_eval_batch_size
    total, count = split_loss(model, spec.splits.get(ns.split), bs, batches)
    loss = total / max(count, 1.0)
    result = {"loss": loss, "ppl": math.exp(min(loss, 50.0)), "tokens": int(count), "batches": batches,
              "model": model_name, "config": ns.config, "split": ns.split, "weights": source}
    return _report(ns, result, t0, "eval: {split} loss {loss:.4f} ppl {ppl:.2f} over {tokens} tokens "
                   f"({batches} batches of {bs}; {{weights}}; {{seconds:.1f}}s)")


def main(ns: argparse.Namespace) -> int:
    if ns.config is not None:
        return _main_config(ns)
    if ns.model is None or ns.data is None or ns.max_seq_length is None:
        raise UserError("eval: pass --model, --data and --max_seq_length (or --config CFG.json)")
    if ns.max_seq_length < 1:
        raise UserError(f"--max_seq_length: must be >= 1, got {ns.max_seq_length}")
    if ns.batch_size < 1:
        raise UserError(f"--batch_size: must be >= 1, got {ns.batch_size}")
    if ns.max_batches is not None and ns.max_batches < 1:
        raise UserError(f"--max_batches: must be >= 1, got {ns.max_batches}")
    tokens = read_tokens(ns.data)
    if (len(tokens) - 1) // ns.max_seq_length < 1:
        raise UserError(f"--data: {ns.data} has {len(tokens)} tokens, fewer than one window of "
                        f"{ns.max_seq_length + 1}; lower --max_seq_length")
    model_dir, cfg = _model_config(ns.model)
    from pretrain_cli.data.indexed import open_token_file
    from pretrain_cli.models.config import check_seq_len

    check_seq_len(cfg, ns.max_seq_length, source="--max_seq_length")
    top = open_token_file(ns.data).max_token_id()  # sidecar value, else one chunked scan
    if top >= cfg.vocab_size:
        raise UserError(f"--data: token id {top} is outside the model's vocabulary ({cfg.vocab_size}); "
                        f"the data was tokenized for another model")
    model, source = _build_and_load(model_dir, cfg, ns.seed)
    t0 = time.perf_counter()
    result = evaluate(model, tokens, ns.max_seq_length, ns.batch_size, ns.max_batches)
    result.update(model=ns.model, data=ns.data, max_seq_length=ns.max_seq_length, weights=source)
    return _report(ns, result, t0, "eval: loss {loss:.4f} ppl {ppl:.2f} over {tokens} tokens "
                   "({windows} windows of {max_seq_length}; {weights}; {seconds:.1f}s)")
