"""The final output directory, as PaddleNLP lays it out, plus a loss-curve PNG.

`output_dir/` gets the HF-loadable model (weights, config.json, generation_config.json,
tokenizer files), `train_results.json`, `all_results.json`, `trainer_state.json`,
`loss_curve.png`; the kept `checkpoint-N/`, `metrics.jsonl` and `runs/` are already there.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from pretrain_cli.checkpoint import copy_tokenizer, write_json


def loss_series(metrics_path: Path) -> list[list[tuple[float, float]]]:
    train, evals = [], []
    if metrics_path.is_file():
        for line in metrics_path.read_text(encoding="utf-8").splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            if rec.get("kind") == "train" and "loss" in rec:
                train.append((rec["step"], rec["loss"]))
            elif rec.get("kind") == "eval" and "eval_loss" in rec:
                evals.append((rec["step"], rec["eval_loss"]))
    return [train, evals]


def write_final(out: Path, model, cfg, spec, trainer, results: dict, dtype: str) -> None:
    from pretrain_cli.convert import save_hf
    from pretrain_cli.plot import line_plot
    from pretrain_cli.train import run_args_json

    if not spec.args.training.do_train:  # eval/predict only: add to the run's record, rewrite nothing else
        previous = out / "all_results.json"
        merged = json.loads(previous.read_text(encoding="utf-8")) if previous.is_file() else {}
        write_json(previous, {**merged, **results})
        return
    save_hf(model, cfg, str(out), dtype=dtype)
    copy_tokenizer(spec.tokenizer_dir, out)
    write_json(out / "trainer_state.json", trainer.state_dict())
    write_json(out / "train_results.json", {k: v for k, v in results.items() if not k.startswith(("eval_", "test_"))})
    write_json(out / "all_results.json", results)
    write_json(out / "args.json", run_args_json(spec))
    png = line_plot(loss_series(out / "metrics.jsonl"))
    tmp = out / f"loss_curve.png.tmp{os.getpid()}"
    tmp.write_bytes(png)
    os.replace(tmp, out / "loss_curve.png")
