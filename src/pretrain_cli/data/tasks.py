"""Splitting a preprocess job into tasks, and the per-task progress record that makes a killed task resumable.

Task i of N reads a contiguous slice of the sorted input files (`files[i*n//N:(i+1)*n//N]`): a pure
function of the file names, so any scheduler (a SLURM array, a Kubernetes indexed job, the Paddle
launcher's ranks) can run the tasks anywhere, and joining the task outputs in task order gives
exactly the bytes one single run over all files would write (`merge-data`).

After each finished input file the task fsyncs its in-progress files and atomically republishes
`<task prefix>.progress.json` (the lengths to keep, the reader's counters, and a hash of the
finished files' names, sizes and modification times). A re-run with the same inputs and settings
truncates the in-progress files back to that record and continues with the next file, so a kill
loses at most the file in flight. A finished task leaves a sidecar whose `inputs_sha256` lets a
re-run of the whole array skip it.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

from pretrain_cli import atomic
from pretrain_cli.errors import UserError

PROGRESS_FORMAT = "pretrain-cli-progress/1"
_TASK_SUFFIX = re.compile(r"-\d{5}-of-\d{5}$")


def check_task(num_tasks: int, task_index: int) -> None:
    if num_tasks < 1:
        raise UserError(f"--num_tasks: {num_tasks} must be >= 1")
    if not 0 <= task_index < num_tasks:
        raise UserError(f"--task_index: {task_index} must be in [0, {num_tasks - 1}] for --num_tasks {num_tasks} "
                        "(SLURM: $SLURM_ARRAY_TASK_ID with --array=0-N-1; Kubernetes: $JOB_COMPLETION_INDEX)")


def task_share(files: list, num_tasks: int, task_index: int) -> list:
    """Task i's contiguous share of the sorted input files."""
    n = len(files)
    return files[task_index * n // num_tasks : (task_index + 1) * n // num_tasks]


def task_prefix(prefix: str, num_tasks: int, task_index: int) -> str:
    """`PREFIX-00003-of-00016` (sorts in task order; one directory holds a job's outputs), or PREFIX for one task."""
    return prefix if num_tasks == 1 else f"{prefix}-{task_index:05d}-of-{num_tasks:05d}"


def is_own_output(path: Path, prefix: str) -> bool:
    """A file this job writes (a sidecar or progress record of any task): never read back as input."""
    p = os.path.abspath(path)
    base = os.path.abspath(prefix)
    for ext in (".progress.json", ".json"):
        if p.endswith(ext):
            stem = p[: -len(ext)]
            return stem == base or (stem.startswith(base) and bool(_TASK_SUFFIX.fullmatch(stem[len(base):])))
    return False


def file_key(path: Path) -> str:
    st = os.stat(path)
    return f"{path}\t{st.st_size}\t{st.st_mtime_ns}\n"


def files_sha256(files, settings: dict) -> str:
    """What the output depends on: the settings and each file's name, size and modification time."""
    h = hashlib.sha256(json.dumps(settings, sort_keys=True).encode())
    for f in files:
        h.update(file_key(f).encode())
    return h.hexdigest()


def progress_path(prefix: str) -> str:
    return prefix + ".progress.json"


def load_progress(prefix: str, files: list, settings: dict, note=lambda line: None) -> dict | None:
    """The record to resume from, or None (none, or made with other inputs or settings: start over, said on stderr)."""
    path = progress_path(prefix)
    try:
        with open(path, encoding="utf-8") as f:
            rec = json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        note(f"preprocess: ignoring unreadable {path} ({e}); starting over")
        return None
    why = None
    if not isinstance(rec, dict) or rec.get("format") != PROGRESS_FORMAT:
        why = "not a progress record of this version"
    elif rec.get("settings") != settings:
        diff = sorted(k for k in set(settings) | set(rec.get("settings", {}))
                      if settings.get(k) != rec.get("settings", {}).get(k))
        why = f"made with other settings ({', '.join(diff)})"
    elif (not 0 < rec.get("done_files", 0) <= len(files)
          or files_sha256(files[: rec["done_files"]], settings) != rec.get("done_sha256")):
        why = "its finished files differ from this task's inputs (renamed, resized or modified)"
    if why:
        note(f"preprocess: {path}: {why}; starting this task over")
        return None
    return rec


def save_progress(prefix: str, files: list, done: int, settings: dict, writer_state: dict, counters: dict) -> None:
    atomic.write_json(progress_path(prefix), {
        "format": PROGRESS_FORMAT, "settings": settings, "done_files": done, "last_file": str(files[done - 1]),
        "done_sha256": files_sha256(files[:done], settings), "writer": writer_state, "counters": counters,
    }, sort_keys=True)


def remove_progress(prefix: str) -> None:
    try:
        os.remove(progress_path(prefix))
    except FileNotFoundError:
        pass
