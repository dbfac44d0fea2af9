"""What a multi-process file's parallel keys mean when it runs as one process (`train` without the launcher,
`check` without `--world_size`): every degree has no effect, each noted the way a launch notes a setting it
ignores, and the note names the launch the file was written for, so `check` says what to check it with."""
from __future__ import annotations

from pretrain_cli.config.pipeline import resolve_pipeline
from pretrain_cli.errors import Problems


def one_process_notes(args, model_cfg, degrees: dict, stage: int, notes: list, problems: Problems) -> None:
    """Notes for `degrees` ({key: degree}: tensor, pipeline, sep, context) and sharding `stage` on one process;
    `sequence_parallel` and `virtual_pp_degree` get the notes they get on many when they are without their axis."""
    t = args.training
    dropped = [f"{k}={v}" for k, v in degrees.items() if v > 1]
    tp, pp = degrees["tensor_parallel_degree"], degrees["pipeline_parallel_degree"]
    if t.sequence_parallel and tp > 1:
        dropped.append("sequence_parallel=True")
    if t.virtual_pp_degree > 1 and pp > 1:
        dropped.append(f"virtual_pp_degree={t.virtual_pp_degree}")
    if stage:
        dropped.append(f"sharding={t.sharding!r}")
    need = 1
    for v in degrees.values():
        need *= v
    if dropped:
        launch = (f"; the file's layout needs {need} processes: `check --world_size {need}` checks it as they run "
                  f"it" if need > 1 else "")
        notes.append(f"parallel: one process, so {', '.join(dropped)} has no effect{launch}")
    if t.sequence_parallel and tp == 1:
        notes.append("sequence_parallel: only meaningful with tensor parallelism; ignored")
    if pp == 1:  # virtual_pp_degree and pipeline_parallel_config without a pipeline: noted as on many processes
        resolve_pipeline(args, model_cfg, 1, notes, problems)
