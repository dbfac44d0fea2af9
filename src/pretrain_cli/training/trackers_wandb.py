"""Weights & Biases as a tracker (`report_to: wandb`, opened by `trackers.open_trackers`): one run across resumes and
spike rollbacks. A resume or rollback in the same directory rewinds the run to the checkpoint's mark, another
directory's run is forked there, and a new run (when wandb refuses both) gets the history only up to `REPLAY_BYTES`,
so wandb's start-up cost does not grow with the run. The file trackers (VisualDL, TensorBoard) cut their files back
instead and live in `trackers`, which chooses the trackers and opens them; `wandb` itself is imported when a run
starts.
"""
from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from pretrain_cli import atomic
from pretrain_cli.errors import UserError
from pretrain_cli.training.record_files import Start
from pretrain_cli.training.tracker_scalars import scalars

log = logging.getLogger("pretrain_cli")


WANDB_RUN_FILE = "wandb_run.json"  # in output_dir: the wandb run its records are in ({"id", "project"})
# a wandb run that cannot continue its checkpoint's run gets the history up to this size of metrics.jsonl (~15,000
# records, ~9 CPU-s at wandb's ~0.6 CPU-s per 1,000); past it only the records from where it starts on
REPLAY_BYTES = 10e6


class WandbFrom:
    """What a wandb run starts from: the checkpoint's wandb `mark` ({"id", "step", "project"}: the run, and the wandb
    step of its next row when the checkpoint's step began logging; `Wandb.mark`), whether metrics.jsonl still holds
    what the checkpoint's mark saw (`intact`: the run's rows before that step are this directory's records up to the
    mark, and `Start.tail` the ones after it), and the size of the history a new run would get (`history_bytes`)."""

    def __init__(self, mark=None, intact: bool = False, history_bytes: float = 0):
        ok = isinstance(mark, dict) and isinstance(mark.get("id"), str) and isinstance(mark.get("step"), int) \
            and isinstance(mark.get("project"), str)
        self.mark, self.intact, self.history_bytes = (mark if ok else None), intact, history_bytes


def _accepts(init, name: str) -> bool:
    """Whether this wandb's `init` takes `name` (`resume_from`: wandb >= 0.17.1; `fork_from`: >= 0.16.5)."""
    import inspect

    try:
        return name in inspect.signature(init).parameters
    except (TypeError, ValueError):
        return False


class Wandb:
    """A wandb run (project `WANDB_PROJECT`, default pretrain-cli; named after output_dir; its files under
    `output_dir/wandb` unless `WANDB_DIR` says where) that a resume or a spike rollback continues instead of starting
    another one holding the whole history (~0.6 CPU-s per 1,000 records, past the 600 s start-up allowance near 10^6).

    A checkpoint's mark names the run and the wandb step of its next row (`mark`: wandb numbers each `log` call's row,
    `_step`, from 0); `output_dir/wandb_run.json` names the run this directory's records are in, written atomically
    when a run starts. A resume or rollback in the same directory rewinds that run to the mark (`resume_from
    "<id>?_step=<step - 1>"`: wandb keeps its rows up to that step and numbers the next one `step`) and writes that
    step's kept records again (`start.tail`), as the file trackers do. A checkpoint of another directory's run is
    forked from (`fork_from`: a new run whose history is the other's up to the mark; the other run is left as it is).
    Where wandb refuses (no rewind on the server, a wandb older than 0.17.1) the fork, then a new run, is tried; a new
    run gets the history from metrics.jsonl only up to `REPLAY_BYTES`, else the records from where it starts on. Each
    such start says what it did in one `report_to: wandb` line. Offline (`WANDB_MODE=offline`) the rewind is recorded
    in the new `offline-run-*-<id>` directory (its run record's branch point), which holds the rows from the mark on;
    `wandb sync` uploads a run's directories in the order they started."""

    def __init__(self, logdir: str, output_dir: str, config: dict, history, start: Start | None = None,
                 begin: WandbFrom | None = None):
        import wandb

        out, start, begin = Path(output_dir).resolve(), start or Start(0), begin or WandbFrom()
        self.project = os.environ.get("WANDB_PROJECT", "pretrain-cli")
        base = {"project": self.project, "name": out.name, "config": config,
                "dir": None if os.environ.get("WANDB_DIR") else str(out)}
        tries, mark, own = [], begin.mark, self._own(out)
        if mark is not None and mark["step"] > 0:  # (a mark before the run's first row: nothing to continue)
            at, there = f"{mark['id']}?_step={mark['step'] - 1}", {**base, "project": mark["project"]}
            if own == mark["id"] and begin.intact and _accepts(wandb.init, "resume_from"):
                tries.append(("rewind", {**there, "id": mark["id"], "resume_from": at}))
            if (own != mark["id"] or begin.intact) and _accepts(wandb.init, "fork_from"):
                tries.append(("fork", {**there, "fork_from": at}))
        tries.append(("new", base))
        refused = []
        for how, kwargs in tries:
            try:
                self.run = wandb.init(**kwargs)
                break
            except Exception as e:  # not logged in, no network, no rewind on this server: the next way, or one line
                first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
                refused.append(f"{how}: {first}")
        else:
            raise UserError(f"report_to: wandb could not start a run ({refused[-1].split(': ', 1)[1]}); run `wandb "
                            "login`, or set WANDB_MODE=offline to write a local run to upload later with `wandb sync`")
        if self.run.id != own:
            out.mkdir(parents=True, exist_ok=True)
            atomic.write_json(out / WANDB_RUN_FILE, {"id": self.run.id, "project": kwargs["project"]})
        self.project = kwargs["project"]
        self.run.define_metric("train/global_step")
        self.run.define_metric("*", step_metric="train/global_step", step_sync=True)
        self._row = mark["step"] if how != "new" else 0  # the wandb step of the next row (`mark`)
        records = start.tail if how != "new" else self._history(history, begin, start)
        note = self._note(how, mark, own, begin, start, refused, wandb)
        if note:
            log.info(f"report_to: wandb: {note}")
        for record in records:
            self.add(record)

    @staticmethod
    def _own(out: Path) -> str | None:
        """The id of the run `output_dir`'s records are in (`WANDB_RUN_FILE`), or None."""
        try:
            found = json.loads((out / WANDB_RUN_FILE).read_text(encoding="utf-8")).get("id")
        except (OSError, ValueError, AttributeError):
            return None
        return found if isinstance(found, str) else None

    @staticmethod
    def _history(history, begin: WandbFrom, start: Start):
        """What a new run gets: the history, when metrics.jsonl is within `REPLAY_BYTES`, else the records after the
        checkpoint's mark only."""
        return history if begin.history_bytes <= REPLAY_BYTES else start.tail

    def _note(self, how: str, mark, own, begin: WandbFrom, start: Start, refused: list, wandb) -> str:
        """The one line a start from a checkpoint says (how it goes on from it, and why not as asked), or ''."""
        step, run, version = int(start.step), self.run.id, getattr(wandb, "__version__", "?")
        why = "; ".join(refused)
        if how == "rewind":
            return (f"run {run} rewound to checkpoint-{step}'s mark (wandb step {mark['step']}) and continued"
                    + (f"; offline: in a new directory offline-run-*-{run}, which `wandb sync` uploads after the "
                       "run's earlier ones" if getattr(self.run, "offline", False) else ""))
        if how == "fork":
            return (f"run {run} forks run {mark['id']} at checkpoint-{step}'s mark (wandb step {mark['step']}): "
                    + (f"not the run {WANDB_RUN_FILE} names (another output_dir's)" if own != mark["id"] else
                       why or f"wandb {version} cannot rewind a run (resume_from: wandb >= 0.17.1)"))
        kept = f"{begin.history_bytes / 1e6:.1f} MB of metrics.jsonl"
        kept = f"holding the history ({kept})" if begin.history_bytes <= REPLAY_BYTES else \
            f"without the history (the steps before are in metrics.jsonl: {kept}, over {REPLAY_BYTES / 1e6:.0f} MB)"
        if mark is None or mark["step"] == 0:
            return "" if begin.history_bytes <= REPLAY_BYTES else f"new run {run} from step {step}, {kept}"
        reason = why or ("metrics.jsonl changed since the mark" if own == mark["id"] and not begin.intact else
                         f"wandb {version} cannot rewind or fork a run")
        return f"new run {run} from step {step}, {kept}; run {mark['id']} had the steps before it: {reason}"

    def mark(self) -> dict:
        """The run and the wandb step of its next row, for a checkpoint: a resume from it rewinds the run there."""
        return {"id": self.run.id, "step": self._row, "project": self.project}

    def add(self, record: dict) -> None:
        values = scalars(record)
        if values:
            self.run.log({**values, "train/global_step": int(record["step"])})
            self._row += 1

    def close(self) -> None:
        self.run.finish()
