"""The final output directory, as PaddleNLP lays it out, plus the loss curve (`training.plot`).

`output_dir/` gets the HF-loadable model (weights, config.json, generation_config.json,
tokenizer files), `train_results.json`, `all_results.json`, `trainer_state.json`,
`loss_curve.png`; the kept `checkpoint-N/`, `metrics.jsonl` and `runs/` are already there.
"""
from __future__ import annotations

import json
from pathlib import Path

from pretrain_cli import atomic, run_dir
from pretrain_cli.data.tokenizer import export_files
from pretrain_cli.run_config import RunConfig


def write_final(run: RunConfig, model_cfg, model, tokenizer_dir, record: dict, state: dict, results: dict) -> None:
    """Rank 0: the final directory of `run` (`model_cfg` and `model` the unwrapped model, `record` what args.json
    holds, `state` the trainer's state). Its weights are streamed out of the last checkpoint (every run that
    trains saves one at its last step), one tensor at a time, whatever layout wrote it: no process holds
    the whole model and nothing is gathered."""
    from pretrain_cli.training.plot import write_loss_curve

    out = Path(run.output.output_dir)
    if not run.loop.do_train:  # eval/predict only: add to the run's record, rewrite nothing else
        previous = out / "all_results.json"
        merged = json.loads(previous.read_text(encoding="utf-8")) if previous.is_file() else {}
        atomic.write_json(previous, {**merged, **results})
        return
    write_weights(model, model_cfg, out, state["global_step"], run.precision.param_dtype)
    export_files(tokenizer_dir, out)  # AutoTokenizer gives the training data's ids (data/tokenizer.py)
    atomic.write_json(out / run_dir.STATE_FILE, state)
    atomic.write_json(out / "train_results.json",
                      {k: v for k, v in results.items() if not k.startswith(("eval_", "test_"))})
    atomic.write_json(out / "all_results.json", results)
    atomic.write_json(out / run_dir.ARGS_FILE, record)
    write_loss_curve(out)


def write_weights(model, cfg, out: Path, step: int, dtype: str) -> list[str]:
    """HF safetensors (sharded above 5 GiB as transformers shards) + config from checkpoint-`step`'s pieces;
    from `model` itself when that checkpoint does not exist (its weights are then whole on this rank)."""
    from pretrain_cli.distributed.pieces import split_name
    from pretrain_cli.models.convert import save_hf, write_hf_dir
    from pretrain_cli.training.checkpoint import open_reader

    ckpt = run_dir.checkpoint_dir(out, step)
    if not ckpt.is_dir():
        return save_hf(model, cfg, str(out), dtype=dtype)
    reader, _ = open_reader(ckpt, "weights")  # pieces, or whole tensors (a checkpoint from before the index)
    try:
        tensors = reader.index["tensors"]
        entries = [(n, tensors[n]["dtype"], tuple(tensors[n]["shape"]), lambda n=n: reader.read(n))
                   for n in _hf_order(model, [n for n in tensors if split_name(n)[1] is None])]
        return write_hf_dir(entries, cfg, str(out), dtype)
    finally:
        reader.close()


def _hf_order(model, names: list[str]) -> list[str]:
    """`names` in the model's parameter order (what `save_hf` writes), so the export does not depend on the layout.
    Under expert parallelism this rank's model holds some experts only: the others' names (in the checkpoint,
    written by their holders) take the place one process gives them, experts in index order within their layer,
    each expert's tensors in the order of this rank's first expert of that layer."""
    import re

    from pretrain_cli.models.convert import hf_params

    order = {hf: i for i, (hf, _, _) in enumerate(hf_params(model))}
    expert = re.compile(r"^(.*\.mlp\.experts\.)(\d+)(\..*)$")  # HF's per-expert names
    first: dict[str, int] = {}  # layer prefix -> the lowest expert index this rank holds there
    start: dict[str, int] = {}  # layer prefix -> where its experts begin in the model's order
    for name, i in order.items():
        m = expert.match(name)
        if m:
            first[m.group(1)] = min(first.get(m.group(1), int(m.group(2))), int(m.group(2)))
            start[m.group(1)] = min(start.get(m.group(1), i), i)

    def key(name: str) -> tuple:
        m = expert.match(name)
        if name in order and not m:
            return order[name], -1, 0
        prefix, e, rest = m.group(1), int(m.group(2)), m.group(3)
        return start[prefix], e, order[f"{prefix}{first[prefix]}{rest}"]

    return sorted((n for n in names if n in order or (expert.match(n) and expert.match(n).group(1) in first)),
                  key=key)
