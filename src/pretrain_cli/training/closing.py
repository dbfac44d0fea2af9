"""What `train` says last, on rank 0 and once: the run's closing metrics as PaddleNLP's Trainer prints them
(`***** train metrics *****`, its names, its number and time formats, keys sorted: `log_metrics`; with do_predict
its `***** test metrics *****` too), then one line saying where the model is and what to run on it next. A user
coming from PaddleNLP looks for that block to know the run is over and how it went, and the line says what reads the
result without a look into the docs.

Three ends say it, each what is true of it: a finished run (after its export is on disk: the model's directory and
the commands for it), a run stopped by a signal (its metrics so far; what reads its newest checkpoint, and the step
of an earlier end's final model where output_dir holds one), and a run found already complete (the blocks of the
results its export recorded, read back from all_results.json). The train block's metrics are recorded once per final
export, by the finished run, as a `train_metrics` record (`RECORD_KIND`) in metrics.jsonl and the trackers: a `train`
record there is a log line's, which every reader of the loss curve takes for one. `progress_or_epoch`, a closing
metric the log line gives too, is computed here for both, so the two never differ.
"""
from __future__ import annotations

import datetime
import json
import shlex
from pathlib import Path

from pretrain_cli import run_dir
from pretrain_cli.training.metrics import log

CLOSING_KEYS = ("progress_or_epoch", "train_loss", "train_runtime", "train_samples_per_second",
                "train_steps_per_second")  # PaddleNLP's closing metrics (its `speed_metrics("train")` + loss, epoch)
RECORD_KIND = "train_metrics"  # metrics.jsonl's kind for them (trackers: `train_metrics/train_loss`, ...)


def progress_or_epoch(global_step: int, max_steps: int) -> float:
    """PaddleNLP's `progress_or_epoch`, as the log line and the closing metrics both give it: the share of max_steps
    done (PaddleNLP's share of the built dataset, which it sizes to max_steps), 4 decimals."""
    return round(global_step / max_steps, 4)


def closing_metrics(results: dict) -> dict:
    """The closing keys of `results` (train_results.json's keys, `run_end.train_results`), those it holds; none
    where it trained nothing (no `train_runtime`): an evaluation-only run's eval keys hold a `progress_or_epoch`."""
    return {k: results[k] for k in CLOSING_KEYS if k in results} if "train_runtime" in results else {}


def effective_tokens_lines(results: dict) -> list[str]:
    """PaddleNLP run_pretrain's last two lines, in its words, with our figure: the tokens every launch trained over
    every launch's time (`tokens_seen` / `train_runtime`: train_results.json's `train_tokens_per_second`), the same
    whether the run finishes now or was found complete. PaddleNLP's (`total_effective_tokens`: max_steps x this
    launch's global batch x max_seq_length, over its launch's time) counts steps it did not train after a resume, and
    at another batch than they had (docs/TRAINING.md, "How `train` ends"); none where nothing was trained."""
    if "train_runtime" not in results:
        return []
    rate = results.get("train_tokens_per_second")  # (unrounded runtime: the figure train_results.json holds)
    if rate is None and "tokens_seen" in results:
        rate = results["tokens_seen"] / max(results["train_runtime"], 1e-9)
    if rate is None:  # (results recorded before tokens_seen: no figure of ours to give)
        return []
    return [f"Effective Tokens per second: {rate:.2f}", f"ips: {rate:.2f} tokens/s"]


def _runtime(secs: float) -> str:
    """PaddleNLP's `_secs2timedelta`: h:mm:ss and hundredths, truncated (12.345 s -> 0:00:12.34)."""
    return f"{datetime.timedelta(seconds=int(secs))}.{int(abs(secs - int(secs)) * 100):02d}"


def block(metrics: dict, split: str = "train") -> list[str]:
    """The lines of PaddleNLP's `log_metrics(split, metrics)`: its `metrics_format` (a runtime as h:mm:ss.hh, a
    float to 4 decimals), keys sorted, both columns aligned."""
    shown = {k: _runtime(v) if "_runtime" in k else round(v, 4) if isinstance(v, float) else v
             for k, v in metrics.items()}
    k_width = max(len(str(k)) for k in shown)
    v_width = max(len(str(v)) for v in shown.values())
    return [f"***** {split} metrics *****", *(f"  {k: <{k_width}} = {shown[k]:>{v_width}}" for k in sorted(shown))]


def log_block(metrics: dict, split: str = "train") -> None:
    for line in block(metrics, split) if metrics else ():
        log.info(line)


def log_blocks(results: dict) -> None:
    """The blocks PaddleNLP's run_pretrain ends with, of the final `results` (`run_end.finish`'s): the train block
    (`closing_metrics`; none in a run that does not train), then do_predict's `log_metrics("test", ...)` (its
    `test_*` keys), then its effective tokens per second and `ips` (`effective_tokens_lines`). It prints no eval
    block: it evaluates only inside training, where each eval line says it."""
    log_block(closing_metrics(results))
    log_block({k: v for k, v in results.items() if k.startswith("test_")}, "test")
    for line in effective_tokens_lines(results):
        log.info(line)


def _commands(model: str) -> tuple[str, str]:
    """`eval` and `generate` on the directory `model`, quoted as they are typed."""
    q = shlex.quote(model)
    return f"pretrain-cli eval --model {q}", f"pretrain-cli generate --model {q}"


def next_commands(model: str) -> str:
    """The commands that read the model directory (or run directory) `model`, as they are typed."""
    evaluate, generate = _commands(model)
    return (f"{evaluate}; {generate} --prompt 'Hello'; in Python, "
            f"transformers.AutoModelForCausalLM.from_pretrained({json.dumps(model, ensure_ascii=False)})")


def finished(output_dir, step: int, dtype: str) -> str:
    """The last line of a run that wrote its final model (after it is on disk)."""
    return (f"train: done at step {step}; the final model, Hugging Face format ({dtype} weights), is in {output_dir}: "
            f"{next_commands(str(output_dir))}")


def already_complete(output_dir, step: int) -> str:
    """The last line of a run that found its final model already written (nothing trained now)."""
    return (f"train: nothing trained now; the final model of step {step} (Hugging Face format, written by an earlier "
            f"launch) is in {output_dir}: {next_commands(str(output_dir))}")


def stopped(message: str, output_dir, step: int) -> str:
    """A stop's line (`run_end.stop_message`) with what reads its weights until the run ends. `eval` and `generate`
    take a run directory without a final model for its newest checkpoint; one that holds an earlier end's final model
    (a run continued past its end, then stopped) stands for that model, so the checkpoint is named instead: whether
    there is one is decided as `eval` decides it, by the weights alone (`final_model.final_model`), its step named where
    its trainer state says it, else why it is unknown."""
    from pretrain_cli.training.final_model import final_model

    has, final, unknown = final_model(output_dir)
    if not has:
        evaluate, generate = _commands(str(output_dir))
        return f"{message}; no final model yet: {evaluate} and {generate} read checkpoint-{step} meanwhile"
    evaluate, generate = _commands(str(run_dir.checkpoint_dir(output_dir, step)))
    which = (f"a final model exported when the run ended earlier (its step unknown: {unknown})"
             if final is None else f"the final model of step {final} (exported when the run ended there)")
    return f"{message}; {output_dir} holds {which}: {evaluate} and {generate} read step {step}'s weights meanwhile"


def recorded(output_dir) -> dict:
    """The results a complete run's export wrote (all_results.json, whose training keys train_results.json copies, and
    with do_predict its `test_*` keys; {} if unreadable), for `log_blocks` to print as the run printed them."""
    try:
        results = json.loads((Path(output_dir) / "all_results.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return results if isinstance(results, dict) else {}
