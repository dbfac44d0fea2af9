"""The experiment trackers a run reports to (`report_to`): VisualDL, TensorBoard and Weights & Biases.

The names are PaddleNLP's (`visualdl`, `tensorboard`, `wandb`, `all`, `none`; a string or a list), and
each tracker gets the same things through the library's own writer: every numeric value of every
metrics.jsonl record as the scalar `<kind>/<key>` at the record's step (`train/loss`, `eval/eval_loss`,
...), and the run's configuration (what args.json holds). VisualDL ships with pretrain-cli; TensorBoard
(written with `tensorboardX`, which needs neither TensorFlow nor torch) and wandb are optional extras, so
`config.resolve` asks `missing` at start and a run that names an absent one stops with one line naming
the `pip install` (`all` takes the installed ones).

A tracker opened after a resume first receives the history (metrics.jsonl up to the step this process
continues from), so each shows the whole run as one curve, with no step twice after a rollback to a
checkpoint: VisualDL and TensorBoard get a new records file and the older ones are removed once it is on
disk; wandb starts a new run (offline with `WANDB_MODE=offline`: a local run for `wandb sync`) whose steps
are the `train/global_step` value, as in transformers' integration, so its own step counter never refuses
an earlier step.
"""
from __future__ import annotations

import importlib.util
import json
import os
import re
import time
from pathlib import Path

from pretrain_cli import atomic
from pretrain_cli.errors import UserError

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


def _number(val) -> bool:
    return isinstance(val, (int, float)) and not isinstance(val, bool)


def scalars(record: dict) -> dict:
    """The numeric values of one metrics.jsonl record as `<kind>/<key>` -> float; a list of numbers (a MoE
    model's per-layer expert load) as one series per entry, `<kind>/<key>/<index>`."""
    out = {}
    for key, val in record.items():
        if key in ("kind", "step", "time"):
            continue
        if _number(val):
            out[f"{record['kind']}/{key}"] = float(val)
        elif isinstance(val, list) and val and all(_number(v) for v in val):
            out.update({f"{record['kind']}/{key}/{i}": float(v) for i, v in enumerate(val)})
    return out


def open_trackers(names, logdir: str, output_dir: str, config: dict | None, history: list) -> list:
    """The writers for `names` (VisualDL and TensorBoard files in `logdir`, wandb's run under `output_dir`)."""
    opened = []
    try:
        for name in sorted(names, key=lambda n: n != "wandb"):  # the one that can fail to start (a login) first
            opened.append({"visualdl": VisualDL, "tensorboard": TensorBoard, "wandb": Wandb}[name](
                logdir, output_dir, config or {}, history))
    except BaseException:
        for tracker in opened:
            tracker.close()
        raise
    return opened


class _Records:
    """A tracker whose records are files in one directory, rebuilt from the history at every start."""

    pattern: re.Pattern

    def __init__(self, logdir: str, output_dir: str, config: dict, history: list):
        self.root = Path(logdir)
        self.root.mkdir(parents=True, exist_ok=True)
        old = [p for p in self.root.iterdir() if self.pattern.match(p.name) and p.is_file()]
        self.open(old)
        self.text("config", json.dumps(config, indent=2, default=str))
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
        return [p for p in self.root.iterdir() if self.pattern.match(p.name) and p.is_file()]

    def add(self, record: dict) -> None:
        walltime = record["time"] if isinstance(record.get("time"), (int, float)) else None
        for tag, val in scalars(record).items():
            self.scalar(tag, val, int(record["step"]), walltime)

    def close(self) -> None:
        self.writer.close()


class VisualDL(_Records):
    """VisualDL shows only the newest `vdlrecords.*.log` of a directory, so the new file gets a name that sorts
    after every existing one."""

    pattern = re.compile(r"^vdlrecords\.(\d+)\.log")

    def open(self, old: list) -> None:
        from visualdl import LogWriter

        stamp = max([int(time.time())] + [int(self.pattern.match(p.name).group(1)) + 1 for p in old])
        self.writer = LogWriter(logdir=str(self.root), file_name=f"vdlrecords.{stamp:010d}.log")

    def text(self, tag: str, text: str) -> None:
        self.writer.add_text(tag, text, 0)

    def scalar(self, tag, val, step, walltime) -> None:
        self.writer.add_scalar(tag, val, step, None if walltime is None else round(walltime * 1000))


class TensorBoard(_Records):
    """TensorBoard reads every `events.out.tfevents.*` file of the directory; only the new one is kept.

    tensorboardX names its file `events.out.tfevents.<whole seconds>.<hostname>` and opens it for writing from the
    start: a run resumed within the same second as the previous one started (a short run, or the same host's
    second process) got the name of the file it was about to replace, truncated it, and then removed it as an old
    file, leaving no file at all. So the file also carries this process's id and the time in nanoseconds."""

    pattern = re.compile(r"^events\.out\.tfevents\.")

    def open(self, old: list) -> None:
        from tensorboardX import SummaryWriter

        self.writer = SummaryWriter(logdir=str(self.root), flush_secs=10,
                                    filename_suffix=f".{os.getpid()}.{time.time_ns()}")

    def text(self, tag: str, text: str) -> None:
        self.writer.add_text(tag, text, 0)

    def scalar(self, tag, val, step, walltime) -> None:
        self.writer.add_scalar(tag, val, step, walltime)


class Wandb:
    """One wandb run per process (project `WANDB_PROJECT`, default pretrain-cli; named after output_dir; its
    files under `output_dir/wandb` unless `WANDB_DIR` says where), holding the whole history."""

    def __init__(self, logdir: str, output_dir: str, config: dict, history: list):
        import wandb

        out = Path(output_dir).resolve()
        try:
            self.run = wandb.init(project=os.environ.get("WANDB_PROJECT", "pretrain-cli"), name=out.name,
                                  config=config, dir=None if os.environ.get("WANDB_DIR") else str(out))
        except Exception as e:  # not logged in, no network: say so at start, in one line
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise UserError(f"report_to: wandb could not start a run ({first}); run `wandb login`, or set "
                            "WANDB_MODE=offline to write a local run to upload later with `wandb sync`") from None
        self.run.define_metric("train/global_step")
        self.run.define_metric("*", step_metric="train/global_step", step_sync=True)
        for record in history:
            self.add(record)

    def add(self, record: dict) -> None:
        values = scalars(record)
        if values:
            self.run.log({**values, "train/global_step": int(record["step"])})

    def close(self) -> None:
        self.run.finish()
