"""Where a run's record files stood at a checkpoint, so that a resume from it cuts them back there instead of
writing the run's history into them again.

A resumed run shows one curve: every record up to its checkpoint, none of the later ones the interrupted run
logged. The files only grow (metrics.jsonl a line per record, VisualDL's and TensorBoard's files a framed record
per value), so where each stood when the checkpoint's step began logging (`MetricsWriter.mark`, kept in the
checkpoint's trainer state) is all a resume needs: each file is cut back to that length (one truncate), and the
few records written after the mark that the resume keeps (that step's own train, eval and checkpoint records)
are read from metrics.jsonl's tail and written again (`Start`). Writing the whole history again instead took
145 s (TensorBoard) and 71 s (VisualDL) per 100,000 records on rank 0, while the other ranks waited in a
collective: a run of 10^6 log steps took 15 minutes or more to resume, and a launch of several processes ended in
gloo's 30 s timeout from ~50,000 records (TensorBoard).

A spike rollback (`spike_policy: rollback`) goes back to a checkpoint within the run and trains the steps after it
again: the files are cut back to that checkpoint's mark in the same way (`MetricsWriter.rewind`), so each step keeps
one record, the one of the weights the run went on from, instead of a second one after the first (a zig-zag
curve). What the cut drops is not lost without a word: the rollback's own record says which records it dropped
and their losses (`dropped`), and it, like the records of earlier rollbacks to the same checkpoint, is kept
(`ROLLBACK_KEEPS`).

A mark holds each file's length and a digest of the bytes before it. A file that is shorter, or whose bytes
there differ (rewritten since: a resume of an older checkpoint, a file restored from elsewhere), is not cut;
the caller writes that file's history again from metrics.jsonl (`training.metrics`, `training.trackers`).
"""
from __future__ import annotations

import collections
import hashlib
import json
import os
from pathlib import Path

from pretrain_cli import atomic

TAIL = 64  # bytes before a mark whose digest says the file still holds what the mark saw
# per-rank records (`startup`): a tracker's series has one value per step, so these stay in metrics.jsonl only
UNTRACKED = ("startup",)
# what a rollback keeps past its checkpoint's step: the records of the process, not of a step trained again (the
# rollbacks themselves, the first step's `layout`)
ROLLBACK_KEEPS = ("spike", "layout")


class Kept:
    """The lines of metrics.jsonl a resumed (or rolled back) run keeps, read from the file each time: a long run's
    file (a line per log step, ~680 bytes per train record) is never held whole (its records as dicts took ~5 KB
    each: 520 MB at 100,000 records, at every resume). Iterated, the kept records the trackers get (each tracker
    anew). `also`: kinds kept whatever their step (`ROLLBACK_KEEPS`)."""

    def __init__(self, path: Path, keep_until: float, redo: tuple = (), also: tuple = ()):
        self.path, self.keep_until, self.redo, self.also = path, keep_until, redo, also

    def keeps(self, record: dict) -> bool:
        """Whether the run keeps `record`: before its step, of its step and not of a kind it writes again, or of a
        kind it keeps whatever the step."""
        step, kind = record.get("step", 0), record.get("kind")
        return step < self.keep_until or (step == self.keep_until and kind not in self.redo) or kind in self.also

    def lines(self, dropped: list | None = None):
        """(line, record) of every kept line, in order; the records not kept are appended to `dropped`."""
        with open(self.path, encoding="utf-8") as f:
            for line in f:
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:  # a line cut short by a kill
                    continue
                if self.keeps(record):
                    yield (line if line.endswith("\n") else line + "\n"), record
                elif dropped is not None:
                    dropped.append(record)

    def __iter__(self):
        return (record for _, record in self.lines() if record.get("kind") not in UNTRACKED)


def dropped(records: list) -> dict:
    """What a rollback's cut removed, for its record: the first and last step, the records of each kind, and the
    train and eval losses ([step, loss]), so that metrics.jsonl still says what those steps did."""
    records = [r for r in records if isinstance(r, dict)]
    steps = [r["step"] for r in records if isinstance(r.get("step"), (int, float))]
    out = {"steps": [min(steps), max(steps)] if steps else [],
           "records": dict(collections.Counter(str(r.get("kind")) for r in records))}
    for kind, key in (("train", "loss"), ("eval", "eval_loss")):
        values = [[r["step"], r[key]] for r in records
                  if r.get("kind") == kind and isinstance(r.get(key), (int, float)) and "step" in r]
        if values:
            out[key] = values
    return out


def _digest(path: Path, size: int) -> str:
    with open(path, "rb") as f:
        f.seek(max(size - TAIL, 0))
        return hashlib.sha1(f.read(min(size, TAIL))).hexdigest()[:16]


def mark(path: Path) -> list:
    """[length, digest of the bytes before it] of a file someone has just flushed."""
    size = path.stat().st_size
    return [size, _digest(path, size)]


def intact(path: Path, marked) -> bool:
    """`path` still begins with what it held when `marked` (`mark`) was taken."""
    try:
        size, digest = int(marked[0]), str(marked[1])
        return path.stat().st_size >= size and _digest(path, size) == digest
    except (OSError, TypeError, ValueError, IndexError):
        return False


def cut(path: Path, size: int) -> None:
    """`path` back to its first `size` bytes: one truncate, the file is whole before and after it."""
    if path.stat().st_size != size:
        os.truncate(path, size)
        with open(path, "rb+") as f:
            os.fsync(f.fileno())


def where(logdir: Path, output_dir: Path) -> str:
    """The trackers' directory as a mark names it: relative to output_dir when inside it (a shared output_dir may
    be mounted elsewhere on the node that resumes)."""
    try:
        return str(logdir.resolve().relative_to(output_dir.resolve()))
    except ValueError:
        return str(logdir.resolve())


class Start:
    """Where a resumed (or rolled back) run starts in its record files: `step`; the tracker files of the
    checkpoint's mark (`marks`, `MetricsWriter.mark`) in `logdir`, which `files` gives a tracker when intact; and
    `tail`, the records written after the mark that the run keeps, for the trackers to write again. `Start(step)`,
    no mark: every tracker writes its history again. `configured`: the files as marked already hold this process's
    configuration (a rollback to a checkpoint after the step the process started from), not written again."""

    def __init__(self, step: float, marks: dict | None = None, logdir: Path | None = None, tail: list = (),
                 configured: bool = False):
        self.step = 0 if step == float("inf") else step  # (an evaluation-only run without a checkpoint)
        self.tail, self.configured = list(tail), configured
        self._files = marks.get("files") if isinstance(marks, dict) and isinstance(marks.get("files"), dict) else {}
        self._logdir = logdir

    def files(self, tracker: str, root: Path) -> dict | None:
        """{path: marked length} of `tracker`'s files in `root` when every one is intact, else None (it writes its
        history again): a tracker the run did not report to then, another logging_dir, or files rewritten since."""
        marked = self._files.get(tracker)
        if not isinstance(marked, dict) or not marked or self._logdir is None or \
                root.resolve() != self._logdir.resolve():
            return None
        for name, m in marked.items():
            if Path(name).name != name or not intact(root / name, m):
                return None
        return {root / name: int(m[0]) for name, m in marked.items()}


def tail(path: Path, marks: dict | None, keep) -> list | None:
    """[(line, record, kept)] of metrics.jsonl after the mark's length (`keep(record)`: the resume keeps it), or
    None when the mark is missing or the file no longer begins with what it marked."""
    if not isinstance(marks, dict) or not intact(path, marks.get("metrics")):  # (none, or not one of ours)
        return None
    out = []
    with open(path, "rb") as f:
        f.seek(int(marks["metrics"][0]))
        for line in f:
            try:
                record = json.loads(line)
            except (json.JSONDecodeError, UnicodeDecodeError):  # a line cut short by a kill
                out.append((line, None, False))
                continue
            out.append((line, record, isinstance(record, dict) and keep(record)))
    return out


def keep_tail(path: Path, size: int, lines: list) -> None:
    """metrics.jsonl as its first `size` bytes and the kept lines of `lines` (`tail`). Kept lines that all come
    first (the usual case: this step's records, then the interrupted run's later ones) need one truncate; others
    a new file, the first `size` bytes copied as they are (no record read), published whole."""
    kept = [line for line, _, k in lines if k]
    if all(k for _, _, k in lines[: len(kept)]) and all(line.endswith(b"\n") for line in kept):
        cut(path, size + sum(len(line) for line in kept))
        return
    with open(path, "rb") as src, atomic.publishing(path, "wb") as f:
        left = size
        while left:
            chunk = src.read(min(left, 1 << 24))
            if not chunk:
                break
            f.write(chunk)
            left -= len(chunk)
        f.writelines(line if line.endswith(b"\n") else line + b"\n" for line in kept)
