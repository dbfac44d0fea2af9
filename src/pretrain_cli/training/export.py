"""The final output directory, as PaddleNLP lays it out, plus the loss curve (`training.plot`); and
`pretrain-cli export`: any checkpoint, of any layout, to a Hugging Face directory.

`output_dir/` gets the HF-loadable model (weights, config.json, generation_config.json,
tokenizer files), `train_results.json`, `all_results.json`, `trainer_state.json`,
`loss_curve.png`; the kept `checkpoint-N/`, `metrics.jsonl` and `runs/` are already there.
Both write the weights the same way (`write_weights`): each tensor assembled from the checkpoint's pieces
(`training.weight_source.open_reader`: the index's block reader), cast to the dtype asked for and streamed into
transformers' shards, one tensor in memory at a time.
"""
from __future__ import annotations

import json
import logging
import time
from pathlib import Path

from pretrain_cli import atomic, run_dir
from pretrain_cli.data.tokenizer import export_files
from pretrain_cli.models.convert import ROUTER_BIAS
from pretrain_cli.models.model_files import hf_weight_names
from pretrain_cli.run_config import RunConfig
from pretrain_cli.training.final_model import leftover_weights, unfinished_run


def write_final(run: RunConfig, model_cfg, model, tokenizer_dir, record: dict, state: dict, results: dict) -> None:
    """Rank 0: the final directory of `run` (`model_cfg` and `model` the unwrapped model, `record` what args.json
    holds, `state` the trainer's state). Its weights are streamed out of the last checkpoint (every run that
    trains saves one at its last step), one tensor at a time, whatever layout wrote it: no process holds
    the whole model and nothing is gathered. An earlier model's weights beside them go or are named
    (`leftover_weights`)."""
    from pretrain_cli.training.plot import write_loss_curve

    out = Path(run.output.output_dir)
    if not run.loop.do_train:  # eval/predict only: add to the run's record, rewrite nothing else
        previous = out / "all_results.json"
        merged = json.loads(previous.read_text(encoding="utf-8")) if previous.is_file() else {}
        atomic.write_json(previous, {**merged, **results})
        return
    dtype, log, started = run.output.export_dtype, logging.getLogger("pretrain_cli"), time.perf_counter()
    log.info(f"final export: writing {dtype} weights (export_dtype; its default auto: the half dtype of a bf16/fp16 "
             f"run, float32 otherwise) to {out}")
    earlier = hf_weight_names(out) if out.is_dir() else []
    files, note = write_weights(model, model_cfg, out, state["global_step"], dtype,
                                capacity_factor=run.moe.capacity_factor)
    for line in ([note] if note else []) + leftover_weights(out, files, earlier):
        log.info(line)
    export_files(tokenizer_dir, out)  # AutoTokenizer gives the training data's ids (data/tokenizer.py)
    atomic.write_json(out / run_dir.STATE_FILE, state)
    atomic.write_json(out / "train_results.json",
                      {k: v for k, v in results.items() if not k.startswith(("eval_", "test_"))})
    atomic.write_json(out / "all_results.json", results)
    atomic.write_json(out / run_dir.ARGS_FILE, record)
    write_loss_curve(out)
    size = sum((out / f).stat().st_size for f in files) / 2**20
    weights = files[0] if len(files) == 1 else f"{len(files)} transformers shards"
    log.info(f"final export: written to {out} in {time.perf_counter() - started:.1f} s ({weights}, {size:,.1f} MiB)")


def write_weights(model, cfg, out: Path, step: int, dtype: str, ckpt: Path | None = None,
                  max_shard_bytes: int | None = None, capacity_factor=None) -> tuple[list[str], str | None]:
    """HF safetensors in `dtype` (sharded above 5 GiB as transformers shards) + config from the pieces of `ckpt`
    (default: `out`'s checkpoint-`step`); from `model` itself when that checkpoint does not exist (its weights
    are then whole on this rank). Returns (the weight files, `export_notes.note` of the run's routing bias and
    `capacity_factor`, or None)."""
    from pretrain_cli.training.export_notes import note as export_note
    from pretrain_cli.distributed.layout.pieces import split_name
    from pretrain_cli.models.convert import DEFAULT_MAX_SHARD_BYTES, export_dtype, save_hf, write_hf_dir
    from pretrain_cli.storage.shard_files import CODES, cast
    from pretrain_cli.training.weight_source import open_reader

    limit = max_shard_bytes or DEFAULT_MAX_SHARD_BYTES
    ckpt = ckpt or run_dir.checkpoint_dir(out, step)
    if not Path(ckpt).is_dir():
        biases = [p.numpy() for n, p in model.named_parameters() if n.endswith(ROUTER_BIAS)]
        return save_hf(model, cfg, str(out), dtype=dtype, max_shard_bytes=limit), export_note(cfg, biases,
                                                                                             capacity_factor)
    reader, _ = open_reader(ckpt, "weights", "export")  # pieces, or whole tensors (a checkpoint from before the index)
    try:
        tensors = reader.index["tensors"]
        entries = []
        for n in _hf_order(model, [n for n in tensors if split_name(n)[1] is None]):
            code = CODES[export_dtype(n, cfg, dtype)]  # (the router DeepSeek keeps fp32 stays so)
            entries.append((n, code, tuple(tensors[n]["shape"]),
                            lambda n=n, code=code: cast(reader.read(n), tensors[n]["dtype"], code)))
        note = export_note(cfg, [reader.read(n) for n in tensors if n.endswith(ROUTER_BIAS)], capacity_factor)
        return write_hf_dir(entries, cfg, str(out), dtype, limit), note
    finally:
        reader.close()


def export_checkpoint(src: Path, out: Path, dtype: str,
                      max_shard_bytes: int | None = None) -> tuple[list[str], int | None, str | None]:
    """`pretrain-cli export`: checkpoint or final directory `src` → HF directory `out` in `dtype`, published whole
    with one rename (`atomic.publish_dir`: a kill leaves `out.tmp`, never a half `out`). A damaged `src` is refused
    in one line (`storage.intact` decides), as is a run's output_dir without its final model (`unfinished_run`: the
    checkpoint eval would read is named). Returns (weight files, the step `src` was saved at when it says,
    `export_notes.note`'s note or None)."""
    from pretrain_cli import runtime
    from pretrain_cli.errors import UserError
    from pretrain_cli.models.config import ModelConfig
    from pretrain_cli.storage import intact
    from pretrain_cli.storage.checkpoint_dir import CheckpointDir

    src, out = Path(src), Path(out)
    unfinished_run(src, "", "export")  # a run's output_dir: its final model, never what it held before the run
    meta = CheckpointDir(src)  # its state and index read once: checked, then read from
    reason = intact.export_problem(meta)
    if reason is not None:
        from pretrain_cli.storage.shard_files import advice_for

        advice = advice_for(src, "export")
        if src.is_dir() and advice.kind != "checkpoint":  # a final model, an unfinished run's, one downloaded
            newest = run_dir.latest_checkpoint(src) if advice.kind == "unfinished" else None
            if newest is not None:  # our run's output_dir before its final export (still training?)
                raise UserError(f"{src}: cannot export: {reason} (the run has not written its final model: still "
                                f"training, or stopped before it); export its newest checkpoint, {newest}")
            raise UserError(f"{src}: cannot export: {reason}; {advice.said(reason.state)}")
        saved = run_dir.list_checkpoints(src.parent)  # a mistyped checkpoint-N: the ones its run directory holds
        there = f": {src.parent} holds {', '.join(p.name for _, p in saved)}" if saved and not src.exists() else ""
        raise UserError(f"{src}: cannot export: {reason}; export another checkpoint-N (or the final directory){there}")
    if meta.index is None:  # a model directory: which files are its model is judged before out.tmp is made
        import sys

        from pretrain_cli.models.model_files import find_weights, lost_index_note

        find_weights(src)
        if (lost := lost_index_note(src)) is not None:  # (a checkpoint whose weights are whole without its index)
            print(lost, file=sys.stderr)
    cfg = ModelConfig.from_file(str(src), pretrained=True)  # (its weights' config.json: read as they are)
    paddle = runtime.import_paddle()
    from pretrain_cli.models import build_model
    from pretrain_cli.ops.kernels import Kernels

    with paddle.LazyGuard():  # names and shapes for the tensors' order, no storage; Paddle's own ops: nothing built
        model = build_model(cfg, Kernels())
    tmp = out.with_name(out.name + ".tmp")
    if tmp.exists():
        atomic.remove_tree(tmp)  # a killed export's leftovers
    tmp.mkdir(parents=True)
    files, note = write_weights(model, cfg, tmp, 0, dtype, ckpt=meta, max_shard_bytes=max_shard_bytes,
                                capacity_factor=meta.run("moe", "capacity_factor"))
    if (src / "tokenizer.json").is_file() or (src / "vocab.json").is_file():  # a run without a tokenizer has none
        export_files(src, tmp)
    atomic.publish_dir(tmp, out)
    try:
        step = meta.state["global_step"]
    except UserError:  # a directory no run of ours wrote
        step = None
    return files, step, note


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
