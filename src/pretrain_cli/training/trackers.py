"""The experiment trackers a run reports to (`report_to`): VisualDL, TensorBoard and Weights & Biases.

The names are PaddleNLP's (`visualdl`, `tensorboard`, `wandb`, `all`, `none`; a string or a list), and
each tracker gets the same things through the library's own writer: every numeric value of every
metrics.jsonl record as the scalar `<kind>/<key>` at the record's step (`train/loss`, `eval/eval_loss`,
...), and the run's configuration (what args.json holds). VisualDL ships with pretrain-cli; TensorBoard
(written with `tensorboardX`, which needs neither TensorFlow nor torch) and wandb are optional extras, so
`config.resolve` asks `missing` at start and a run that names an absent one stops with one line naming
the `pip install` (`all` takes the installed ones).

Each shows the whole run as one curve across resumes and spike rollbacks, with no step twice and none of an
interrupted run's records past the checkpoint it resumes from (nor the first records of the steps a rollback
trains again: the trackers are opened again as of its checkpoint, `MetricsWriter.rewind`). VisualDL and
TensorBoard keep their files: a resume cuts them back to where its checkpoint's mark says they stood when that
step began logging (`training.record_files`), writes that step's kept records again and goes on, VisualDL in the
same file (it shows only the newest), TensorBoard in a new one; its start-up cost is that of a few records,
whatever the run's length. Without an intact mark (a checkpoint from before marks, another `logging_dir`, a
tracker added on resume, files rewritten since) the history up to the resume step is written into a new file
from metrics.jsonl and the older files are removed once it is on disk. wandb keeps one run across resumes and
rollbacks: the checkpoint's mark names the run and its wandb step, and the run is rewound there
(`trackers_wandb.Wandb`), so its start-up cost does not grow with the run either; its steps are the
`train/global_step` value, as in transformers' integration.
"""
from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import os
import re
import time
from pathlib import Path

from pretrain_cli import atomic
from pretrain_cli.errors import UserError
from pretrain_cli.training import record_files, trackers_wandb
from pretrain_cli.training.record_files import Start
from pretrain_cli.training.tracker_scalars import scalars

# tracker -> (the module its writer comes from, what installs it)
PACKAGES = {"visualdl": ("visualdl", "pip install visualdl"),
            "tensorboard": ("tensorboardX", "pip install tensorboardX  (or pip install -e '.[tensorboard]')"),
            "wandb": ("wandb", "pip install wandb  (or pip install -e '.[wandb]')")}
NAMES = tuple(PACKAGES)


def installed(name: str) -> bool:
    return importlib.util.find_spec(PACKAGES[name][0]) is not None


def choose(requested, notes: list) -> tuple:
    """`report_to` as written (None, a string, a list; names may be comma-separated) -> the trackers to open.

    None is `visualdl` (the default), `none` is no tracker, `all` is every installed one (a note names the
    others). Unknown names raise; installed-or-not of named trackers is `missing`'s question."""
    names = []
    for item in ([requested] if isinstance(requested, str) else requested or ["visualdl"]):
        names += [n.strip().lower() for n in str(item).split(",") if n.strip()]
    unknown = [n for n in names if n not in NAMES + ("all", "none")]
    if unknown:
        raise UserError(f"report_to: unknown tracker {unknown[0]!r}; use {', '.join(NAMES)}, all or none")
    if "none" in names:
        return ()
    if "all" in names:
        absent = [n for n in NAMES if not installed(n)]
        if absent:
            notes.append("report_to: all = the installed trackers; not installed: "
                         + "; ".join(f"{n} ({PACKAGES[n][1]})" for n in absent))
        names = [n for n in NAMES if n not in absent] + [n for n in names if n != "all"]
    return tuple(dict.fromkeys(names))


def missing(names) -> list[str]:
    """One line per named tracker whose package is not installed."""
    return [f"report_to: {n} needs the {PACKAGES[n][0]} package, which is not installed: {PACKAGES[n][1]}"
            for n in names if not installed(n)]


def open_trackers(names, logdir: str, output_dir: str, config: dict | None, history, start: Start | None = None,
                  begin: trackers_wandb.WandbFrom | None = None) -> list:
    """The writers for `names` (VisualDL and TensorBoard files in `logdir`, wandb's run under `output_dir`).
    `history`: the records up to where this run starts, iterable once per tracker that writes them anew;
    `start` (`record_files.Start`): where this run starts in each tracker's files; `begin`
    (`trackers_wandb.WandbFrom`): the wandb run it continues."""
    opened = []
    try:
        for name in sorted(names, key=lambda n: n != "wandb"):  # the one that can fail to start (a login) first
            if name == "wandb":
                opened.append(trackers_wandb.Wandb(logdir, output_dir, config or {}, history, start, begin))
                continue
            opened.append({"visualdl": VisualDL, "tensorboard": TensorBoard}[name](
                logdir, output_dir, config or {}, history, start))
    except BaseException:
        for tracker in opened:
            tracker.close()
        raise
    return opened


class _Records:
    """A tracker whose records are files in one directory. A resume cuts the files back to where its checkpoint's
    mark says they stood and writes on from there (`start.files`); without an intact mark the history is written
    into a new file, and the older ones are removed once it is on disk."""

    name: str
    pattern: re.Pattern

    def __init__(self, logdir: str, output_dir: str, config: dict, history, start: Start | None = None):
        self.root = Path(logdir)
        self.root.mkdir(parents=True, exist_ok=True)
        old = self.files()
        start = start or Start(0)
        marked = start.files(self.name, self.root)
        if marked is not None:
            self._continue(old, marked, config, start)
        else:
            self._rebuild(old, config, history, start.step)

    def _continue(self, old: list, marked: dict, config: dict, start: Start) -> None:
        """The files as the mark saw them (later files removed: they hold only records past it), then this run's
        configuration (unless they hold it already: a rollback past this process's start) and the records after
        the mark that the resume keeps."""
        later = [path for path in old if path not in marked]
        for path in later:
            path.unlink(missing_ok=True)
        if later:
            atomic.fsync_dir(self.root)
        for path, size in marked.items():
            record_files.cut(path, size)
        self.open(old, append=max(marked))
        if not start.configured:
            self.text("config", json.dumps(config, indent=2, default=str), int(start.step))
        for record in start.tail:
            self.add(record)
        self.flush()

    def _rebuild(self, old: list, config: dict, history, step) -> None:
        self.open(old)
        self.text("config", json.dumps(config, indent=2, default=str), int(step))
        for record in history:
            self.add(record)
        self.writer.flush()
        new = [path for path in self.files() if path not in old]
        for path in new:
            with open(path, "rb") as f:
                os.fsync(f.fileno())
        if not new:  # the history is not on disk in a file of its own: keep what there is
            return
        for path in old:
            path.unlink(missing_ok=True)
        if old:
            atomic.fsync_dir(self.root)

    def files(self) -> list[Path]:
        return sorted(p for p in self.root.iterdir() if self.pattern.match(p.name) and p.is_file())

    def add(self, record: dict) -> None:
        walltime = record["time"] if isinstance(record.get("time"), (int, float)) else None
        for tag, val in scalars(record).items():
            self.scalar(tag, val, int(record["step"]), walltime)

    def flush(self) -> None:
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class VisualDL(_Records):
    """VisualDL shows only the newest `vdlrecords.*.log` of a directory: a resume writes on in the marked one (the
    newest, once later ones are removed), and a file written anew gets a name that sorts after every existing one."""

    name, pattern = "visualdl", re.compile(r"^vdlrecords\.(\d+)\.log")

    def open(self, old: list, append: Path | None = None) -> None:
        from visualdl import LogWriter

        if append is not None:  # (it prints that it adds to an existing file: the run says where it starts)
            with contextlib.redirect_stdout(io.StringIO()):
                self.writer = LogWriter(logdir=str(self.root), file_name=append.name)
            return
        stamp = max([int(time.time())] + [int(self.pattern.match(p.name).group(1)) + 1 for p in old])
        self.writer = LogWriter(logdir=str(self.root), file_name=f"vdlrecords.{stamp:010d}.log")

    def text(self, tag: str, text: str, step: int) -> None:
        self.writer.add_text(tag, text, step)

    def scalar(self, tag, val, step, walltime) -> None:
        self.writer.add_scalar(tag, val, step, None if walltime is None else round(walltime * 1000))


class TensorBoard(_Records):
    """TensorBoard reads every `events.out.tfevents.*` file of the directory, in the order of their names (the
    seconds they were created at): a resume keeps the marked files and writes on in a new one, read after them.

    The events are written in the caller's thread (tensorboardX's `EventsWriter`, the file under its
    `SummaryWriter`): the SummaryWriter queues them for a thread of its own, and its `flush` does not wait for that
    queue, so a mark taken after it could miss events already added (a resume then cut them off). tensorboardX
    names the file `events.out.tfevents.<whole seconds>.<hostname>` and creates it from the start: a run resumed
    within the same second as the previous one started (a short run, or the same host's second process) got the
    name of the file it was about to replace. So the file also carries this process's id and the time in
    nanoseconds."""

    name, pattern = "tensorboard", re.compile(r"^events\.out\.tfevents\.")

    def open(self, old: list, append: Path | None = None) -> None:
        from tensorboardX.event_file_writer import EventsWriter

        self.writer = EventsWriter(str(self.root / "events"), f".{os.getpid()}.{time.time_ns()}")

    def add(self, record: dict) -> None:
        super().add(record)
        self.writer.flush()  # a record at a time, as metrics.jsonl: a viewer sees it now, not a buffer later

    def _write(self, summary, step: int, walltime) -> None:
        from tensorboardX.proto.event_pb2 import Event

        self.writer.write_event(Event(summary=summary, step=int(step),
                                      wall_time=time.time() if walltime is None else walltime))

    def text(self, tag: str, text: str, step: int) -> None:
        from tensorboardX.summary import text as summary

        self._write(summary(tag, text), step, None)

    def scalar(self, tag, val, step, walltime) -> None:
        from tensorboardX.summary import scalar

        self._write(scalar(tag, val), step, walltime)
