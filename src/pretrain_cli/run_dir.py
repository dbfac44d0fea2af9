"""The names inside a run's `output_dir`, and which checkpoint a run resumes from.

`config` (deciding a resume before Paddle starts), `training` (writing) and `eval --config`
(finding the newest model) all read the same layout, so it lives here, below all of them.
A directory named `checkpoint-N` is complete by construction (see `training.checkpoint`).
"""
from __future__ import annotations

import re
from pathlib import Path

CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")
STATE_FILE = "trainer_state.json"
OPTIMIZER_FILE = "optimizer.safetensors"
ARGS_FILE = "args.json"
METRICS_FILE = "metrics.jsonl"


def is_record(args) -> bool:
    """Whether `args` (args.json read) is the record a run of ours writes (its `arguments` and `run`), which is
    what tells our run's directories from others that ship an args.json or a trainer state."""
    return isinstance(args, dict) and isinstance(args.get("arguments"), dict) and "run" in args


def checkpoint_dir(output_dir, step: int) -> Path:
    return Path(output_dir) / f"checkpoint-{step}"


def list_checkpoints(output_dir) -> list[tuple[int, Path]]:
    """Published checkpoints, oldest first (by step number, not mtime); whether each is still complete and
    undamaged is `storage.intact`'s to say."""
    root = Path(output_dir)
    if not root.is_dir():
        return []
    out = []
    for p in root.iterdir():
        m = CHECKPOINT.match(p.name)
        if m and p.is_dir():
            out.append((int(m.group(1)), p))
    return sorted(out)


def checkpoints_past(output_dir, step: int) -> list[Path]:
    """The published checkpoints of `output_dir` past `step`, oldest first: the one judge of what lies beyond a
    named checkpoint, which a resume from it is refused beside (`orchestration.resumed.later_checkpoints`) and the
    re-run advice predicts (`distributed.launcher.rerun.past`), and of what overwrite_output_dir removes past the
    step a run starts at (0 keeps a checkpoint-0): the run's removal (`training.checkpoint.remove_past`), check's
    line (`orchestration.opened.overwritten`) and a launch.sh restart's (`distributed.launcher.rerun.restart`)."""
    return [p for n, p in list_checkpoints(output_dir) if n > step]


def latest_checkpoint(output_dir) -> Path | None:
    ckpts = list_checkpoints(output_dir)
    return ckpts[-1][1] if ckpts else None
