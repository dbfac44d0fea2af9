"""The final output directory, as PaddleNLP lays it out, plus the loss curve (`training.plot`).

`output_dir/` gets the HF-loadable model (weights, config.json, generation_config.json,
tokenizer files), `train_results.json`, `all_results.json`, `trainer_state.json`,
`loss_curve.png`; the kept `checkpoint-N/`, `metrics.jsonl` and `runs/` are already there.
"""
from __future__ import annotations

import json
from pathlib import Path

from pretrain_cli import atomic, run_dir
from pretrain_cli.training.checkpoint import copy_tokenizer


def write_final(spec, model, trainer, results: dict, weights: dict | None = None) -> None:
    """`weights`: full parameters gathered from a sharded layout (None: read `model` itself)."""
    from pretrain_cli.models.convert import save_hf
    from pretrain_cli.training.plot import write_loss_curve

    out = Path(spec.run.output.output_dir)
    if not spec.run.loop.do_train:  # eval/predict only: add to the run's record, rewrite nothing else
        previous = out / "all_results.json"
        merged = json.loads(previous.read_text(encoding="utf-8")) if previous.is_file() else {}
        atomic.write_json(previous, {**merged, **results})
        return
    save_hf(model, spec.model_cfg, str(out), dtype=spec.run.precision.param_dtype, values=weights)
    copy_tokenizer(spec.tokenizer_dir, out)
    atomic.write_json(out / run_dir.STATE_FILE, trainer.state_dict())
    atomic.write_json(out / "train_results.json",
                      {k: v for k, v in results.items() if not k.startswith(("eval_", "test_"))})
    atomic.write_json(out / "all_results.json", results)
    atomic.write_json(out / run_dir.ARGS_FILE, spec.record())
    write_loss_curve(out)
