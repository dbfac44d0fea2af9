"""What a run reports: the PaddleNLP log line plus honest throughput, FLOPs and MFU.

Names keep PaddleNLP's meaning where it is the same (`interval_tokens_per_second_per_device`)
and get new names where we change it: TFLOPs are 1e12 FLOP/s (PaddleNLP divides by 2^40 and
under-reports by 9 %), FLOPs per token are GQA-aware, and `mfu` is "unknown" rather than a wrong
number (never above 1). Each interval record carries the per-device peak its `mfu` is over
(`peak_tflops_per_device`): the peak depends on the layout (a CPU's cores are shared by its processes),
so a resumed run's `mfu` records are comparable only beside it; the start-up `flops:` line says where
it came from. On CPU the peak is the cores' theoretical one, stated as the assumption it is
(`planning.hardware.resolve_peak`, which `plan --device cpu`'s ETA uses too).
"""
from __future__ import annotations

import collections
import json
import logging
import os
import resource
import sys
import time
from pathlib import Path

from pretrain_cli import atomic
from pretrain_cli.planning import hardware
from pretrain_cli.run_dir import METRICS_FILE
from pretrain_cli.training import record_files, trackers, trackers_wandb
from pretrain_cli.run_config import RunConfig

log = logging.getLogger("pretrain_cli")
# A checkpoint's loss-curve drawing is skipped within this many seconds of the previous one or of the writer's start
# (the run's), unless the run stops there (a signal); the final export always draws. A drawing costs 0.35-0.9 CPU-s
# (seconds on a busy machine), and checkpoints seconds apart add nothing to a picture of the whole run: on a 10-step
# CPU run with four saves the redraws were 1.8 of its 4.3 CPU-s (measured).
REDRAW_SECONDS = 60.0


class _Stdout(logging.StreamHandler):
    """A handler on whatever `sys.stdout` is when a line is written, not the one it was when the run set up its
    logging: a run started in-process (`cli.main` from Python, the tests' captured streams) may outlive the stream
    it started with, and a line written to a closed stream is a logging error instead of output."""

    def __init__(self):
        super().__init__(sys.stdout)

    @property
    def stream(self):
        return sys.stdout

    @stream.setter
    def stream(self, _value):  # (set by StreamHandler's constructor and setStream; always the current one)
        pass

    def emit(self, record):
        """On a terminal the progress bar (stderr) and the log lines (stdout) share one screen line: a line
        written over the bar would follow its text (`train: 20%|██ | 20/100 [...][2026-…] INFO - loss: …`), so
        the bar is cleared first and redrawn below the line (tqdm's `external_write_mode`; no bar: as before)."""
        tqdm = sys.modules.get("tqdm")
        if tqdm is None or not getattr(tqdm.tqdm, "_instances", None):
            return super().emit(record)
        with tqdm.tqdm.external_write_mode(file=self.stream):
            super().emit(record)


def setup_logging(rank: int = 0) -> None:
    """PaddleNLP's line format: `[2025-01-01 12:00:00,123] [    INFO] - message`. Only rank 0 logs INFO."""
    handler = _Stdout()
    handler.setFormatter(logging.Formatter("[%(asctime)s] [%(levelname)8s] - %(message)s"))
    log.handlers[:] = [handler]
    log.setLevel(logging.INFO if rank == 0 else logging.WARNING)
    log.propagate = False


def host_memory_gib() -> tuple[float, float]:
    """(current RSS, peak RSS) of this process in GiB. The kernel updates `ru_maxrss` lazily, so just after the
    RSS grew it can read below the current figure: the peak is at least the current RSS."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux
    try:
        with open("/proc/self/statm") as f:
            current = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**30
    except OSError:
        current = peak
    return current, max(peak, current)


def resolve_peak(device: str, amp_dtype: str | None, user_peak: float | None) -> tuple[float | None, str]:
    """(peak TFLOPS per device, where it came from) for MFU: `planning.hardware.resolve_peak`, so the trainer's MFU
    and `plan`'s ETA rest on one peak (on CPU the cores' assumed one) named in the same words; without one, the
    reason ends with what to set (`hardware.NO_MFU`)."""
    given = (user_peak, "peak_tflops from the argument file") if user_peak else None
    if device == "cpu":  # a CPU run's peak is the CPU's, on a machine with a GPU too: the driver is not asked
        name, entry = "cpu", None
    else:
        from pretrain_cli import runtime

        name = runtime.gpu_name() or device  # the driver's name, looked up once per process
        entry = hardware.lookup(name)
    peak, source = hardware.resolve_peak(entry, name, amp_dtype, given)
    return peak, source if peak is not None or source.endswith(hardware.NO_MFU) else f"{source}: {hardware.NO_MFU}"


UNTRACKED = record_files.UNTRACKED  # (per-rank `startup` records: metrics.jsonl only)


class MetricsWriter:
    """metrics.jsonl + the trackers of `report_to` (`training.trackers`); rank 0 only (the caller guarantees it)."""

    def __init__(self, output_dir: str, logging_dir: str | None, report_to, keep_until: float | None,
                 config: dict | None = None, redo: tuple = (), marks: dict | None = None):
        """`report_to`: the resolved tracker names. `keep_until`: None starts a new file; a step number keeps the
        records up to it and appends (a resume drops what the interrupted run logged after its checkpoint, so no
        step appears twice). `config`: the run's record (args.json), given to every tracker. `redo`: the kinds
        of record at `keep_until` itself that this run writes again (a run resumed at its last step only to
        evaluate and export: its eval and test records of that step). `marks`: where the record files stood
        when the checkpoint's step began logging (`mark`, in its trainer state): the files are cut back there
        (`training.record_files`) and the wandb run rewound there; without them, or where a file changed since, it
        is written anew (wandb: `trackers_wandb.Wandb`)."""
        self.output_dir = Path(output_dir)
        self.path = self.output_dir / METRICS_FILE
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._plotter, self._plot_error = None, None  # the background loss-curve drawing (`plot`)
        self._curve = None  # its series (`plot.Curve`), kept between drawings: each reads only the new lines
        self._plotted_at = time.monotonic()  # when the last one started, or the writer (time.monotonic)
        self.logging_dir = logging_dir or str(self.output_dir / "runs")
        self._names, self._config = [n for n in (report_to or ()) if n != "none"], config
        self._started_at = keep_until if keep_until is not None else 0  # the step this process's records begin at
        self._trackers: list = []
        self._open(keep_until, redo, marks)

    def _open(self, keep_until: float | None, redo: tuple, marks: dict | None, also: tuple = ()) -> list:
        """metrics.jsonl and the trackers, as of `keep_until` (None: new files); returns the records dropped."""
        kept = record_files.Kept(self.path, keep_until, redo, also) \
            if keep_until is not None and self.path.is_file() else None
        tail = record_files.tail(self.path, marks, kept.keeps) if kept is not None else None
        if tail is not None:  # the history stays where it is; the kept records after the mark are written again
            start = record_files.Start(keep_until, marks, self.output_dir / str(marks.get("logdir", "")),
                                       [r for _, r, k in tail if k and r.get("kind") not in UNTRACKED],
                                       configured=keep_until > self._started_at)
        else:
            start = record_files.Start(keep_until if keep_until is not None else 0)
        anew = [n for n in self._names if kept is not None and n != "wandb"
                and start.files(n, Path(self.logging_dir)) is None]  # (wandb: `trackers_wandb.Wandb` says what it does)
        if anew and self.path.stat().st_size > 10e6:  # ~15,000 records: seconds, said
            log.info(f"report_to: {', '.join(anew)} first get the run's history, "
                     f"{self.path.stat().st_size / 1e6:.0f} MB of {METRICS_FILE} (VisualDL ~0.5, TensorBoard ~0.4 "
                     f"CPU-s per 1,000 records)")
        # the wandb run this one continues: the checkpoint's (`mark`), rewound where metrics.jsonl is as it marked
        begin = trackers_wandb.WandbFrom(marks.get("wandb") if isinstance(marks, dict) else None, tail is not None,
                                   self.path.stat().st_size if kept is not None else 0)
        # the trackers before any file is rewritten: one that fails to start (wandb not logged in) changes nothing
        self._trackers = trackers.open_trackers(self._names, self.logging_dir, str(self.output_dir), self._config,
                                                kept if kept is not None else (), start, begin=begin)
        dropped = []
        if tail is not None:
            record_files.keep_tail(self.path, int(marks["metrics"][0]), tail)
            dropped = [r for _, r, k in tail if r is not None and not k]
        elif kept is not None:
            with atomic.publishing(self.path, "w", encoding="utf-8") as f:
                f.writelines(line for line, _ in kept.lines(dropped))
        self._jsonl = open(self.path, "a" if keep_until is not None else "w", encoding="utf-8")
        return dropped

    def rewind(self, step: int, marks: dict | None) -> dict:
        """A spike rollback to the checkpoint of `step` (`marks`: its `record_files`): metrics.jsonl and the
        trackers as a resume from it would leave them, so the steps trained again keep one record each, the
        rollbacks' own records kept (`record_files.ROLLBACK_KEEPS`). Returns what was dropped
        (`record_files.dropped`), for the rollback's record. The loss curve is read again from the start at its
        next drawing (the file is shorter, then grows past where the drawing had read)."""
        if self._plotter is not None:
            self._plotter.join()  # (it reads metrics.jsonl)
        self._curve = None
        self._jsonl.close()
        for tracker in self._trackers:  # (their files are cut, or written anew, by the ones opened next)
            tracker.close()
        self._trackers = []
        return record_files.dropped(self._open(step, (), marks, record_files.ROLLBACK_KEEPS))

    def mark(self) -> dict:
        """Where metrics.jsonl and each tracker's files stand now, their writers flushed, and the wandb run's next
        row (`wandb`): a checkpoint keeps it, and a resume from that checkpoint cuts the files back there
        (`record_files`) and rewinds the wandb run there (`trackers_wandb.Wandb`). Taken when the checkpoint's step
        begins logging, so that every record of that step, the ones a resume writes again too, comes after it."""
        self._jsonl.flush()
        files, wandb = {}, None
        for tracker in self._trackers:
            if hasattr(tracker, "files"):
                tracker.flush()
                files[tracker.name] = {p.name: record_files.mark(p) for p in tracker.files()}
            elif isinstance(tracker, trackers_wandb.Wandb):  # its run and the wandb step of the next row
                wandb = tracker.mark()
        return {"metrics": record_files.mark(self.path), "files": files,
                "logdir": record_files.where(Path(self.logging_dir), self.output_dir),
                **({"wandb": wandb} if wandb is not None else {})}

    def write(self, kind: str, step: int, values: dict) -> None:
        """One record into metrics.jsonl and, unless of an `UNTRACKED` kind, the trackers."""
        record = {"kind": kind, "step": step, "time": round(time.time(), 3), **values}
        self._jsonl.write(json.dumps(record, default=float) + "\n")
        self._jsonl.flush()
        for tracker in self._trackers if kind not in UNTRACKED else ():
            tracker.add(record)

    def plot(self, stopping: bool = False) -> None:
        """Redraw `loss_curve.png` from what metrics.jsonl holds now, at a checkpoint.

        On a background thread: matplotlib takes seconds (3–9 s on a busy 2-core machine, the first import
        included), which would otherwise stall training at every save, async saves too. One drawing at a
        time; a request while one runs, or within `REDRAW_SECONDS` of the last one's start (or of the writer's,
        so a run shorter than that draws only at its end) is dropped (a later checkpoint or the final export
        redraws), unless the run is `stopping` at this checkpoint (a signal: no final export follows); `close`
        waits, so the final export's curve is the last one written."""
        import threading

        from pretrain_cli.training.plot import Curve, write_loss_curve

        self._raise_plot_error()
        if self._plotter is not None and self._plotter.is_alive():
            return
        if not stopping and time.monotonic() - self._plotted_at < REDRAW_SECONDS:
            return
        self._plotted_at = time.monotonic()
        if self._curve is None:  # (created after `__init__` rewrote metrics.jsonl for a resume)
            self._curve = Curve(self.path)

        def draw():
            try:
                write_loss_curve(self.output_dir, curve=self._curve)
            except OSError as e:  # disk full, read-only: raised on the training thread, like any write
                self._plot_error = e

        self._plotter = threading.Thread(target=draw, daemon=True, name="loss-curve")
        self._plotter.start()

    def _raise_plot_error(self) -> None:
        if self._plot_error is not None:
            error, self._plot_error = self._plot_error, None
            raise error

    def close(self) -> None:
        """Waits for a drawing in flight; its write error, if any, is left to the final export's redraw
        (close runs in `finally`, where raising would hide the error the run is already stopping for)."""
        if self._plotter is not None:
            self._plotter.join()
        self._jsonl.close()
        for tracker in self._trackers:
            tracker.close()


# PaddleNLP's log-line keys in its order (its Trainer's log dict, `progress_or_epoch` added last by its `log`), the
# memory ones on a device only: kept first and adjacent, so what is grepped or parsed for them (`global_step: 60,
# interval_runtime`) finds ours too; our keys (`eta`, `tokens_seen`, ...) follow them
PADDLENLP_LINE = ("loss", "learning_rate", "global_step", "current_memory_allocated", "current_memory_reserved",
                  "max_memory_allocated", "max_memory_reserved", "interval_runtime", "interval_samples_per_second",
                  "interval_tokens_per_second_per_device", "interval_hardware_tflops_per_device",
                  "interval_steps_per_second", "progress_or_epoch")


def paddlenlp_first(values: dict, keys: tuple = PADDLENLP_LINE) -> dict:
    """`values` with those of `keys` first, in that order, then the others in theirs."""
    return {**{k: values[k] for k in keys if k in values}, **{k: v for k, v in values.items() if k not in keys}}


def device_memory_gib() -> dict:
    """PaddleNLP's device memory keys: the GPU allocator's current and peak allocated and reserved bytes / 2**30
    (the statistics its `device_memory_stat_*_value` reads; a CPU run has none, as in PaddleNLP)."""
    import paddle

    gib = lambda n: round(n / 2**30, 4)  # noqa: E731
    return {"current_memory_allocated": gib(paddle.device.cuda.memory_allocated()),
            "current_memory_reserved": gib(paddle.device.cuda.memory_reserved()),
            "max_memory_allocated": gib(paddle.device.cuda.max_memory_allocated()),
            "max_memory_reserved": gib(paddle.device.cuda.max_memory_reserved())}


def format_line(values: dict) -> str:
    """`key: value, key: value` with PaddleNLP's number formats."""
    parts = []
    for key, val in values.items():
        if key == "learning_rate":
            parts.append(f"{key}: {val:.3e}")
        elif isinstance(val, float):
            parts.append(f"{key}: {round(val, 8) if key.endswith('loss') else round(val, 4)}")
        else:
            parts.append(f"{key}: {val}")
    return ", ".join(parts)


ETA_WINDOW = 50  # steps: the recent rate the time-remaining estimate (`eta`) uses, evaluations and saves included


def clock(seconds: float) -> str:
    """h:mm:ss, as tqdm prints a remaining time."""
    s = int(round(max(seconds, 0.0)))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


class Throughput:
    """Interval and run totals for the log line (PaddleNLP keys + ours), and the time remaining at the rate of the
    last ETA_WINDOW steps (so a slow first step, or a faster machine after a resume, fades out)."""

    def __init__(self, seq_len: int, global_batch: int, world_size: int, dp_size: int, flops_per_token: float,
                 hw_flops_per_token: float, peak_tflops: float | None):
        self.seq_len, self.global_batch, self.world, self.dp = seq_len, global_batch, world_size, dp_size
        self.flops, self.hw_flops, self.peak = flops_per_token, hw_flops_per_token, peak_tflops
        self.start = self.last = time.perf_counter()
        self._ends = collections.deque([self.start], maxlen=ETA_WINDOW + 1)  # when each recent step ended
        self.steps_since = 0
        self.tokens_this_launch = 0  # every rank's tokens (the global batch) since this launch began, not a resume's
        self.over_peak = False

    @classmethod
    def for_run(cls, run: RunConfig, model_cfg, peak_tflops: float | None) -> "Throughput":
        """Model FLOPs exclude recompute (comparable MFU); hardware FLOPs count the recomputed forward too."""
        from pretrain_cli.models.flops import flops_per_token

        seq, p = run.data.max_seq_length, run.parallel
        return cls(seq, run.global_batch_size, p.world_size, p.data_world_size, flops_per_token(model_cfg, seq),
                   flops_per_token(model_cfg, seq, recompute=run.recompute_granularity, hardware=True), peak_tflops)

    def step(self) -> None:
        self._ends.append(time.perf_counter())
        self.steps_since += 1
        self.tokens_this_launch += self.global_batch * self.seq_len

    def time_remaining(self, steps_left: int) -> str:
        """`steps_left` at the mean step time of the recent window, as h:mm:ss."""
        per_step = (self._ends[-1] - self._ends[0]) / max(len(self._ends) - 1, 1)
        return clock(steps_left * per_step)

    def _mfu(self, tokens_per_second_per_device: float):
        """The model FLOPs rate over the peak; "unknown" without a peak, and when the rate passes the peak
        (a figure that cannot be true is not printed: the peak is wrong, and the log says so once)."""
        if not self.peak:
            return "unknown"
        mfu = tokens_per_second_per_device * self.flops / (self.peak * 1e12)
        if mfu <= 1:
            return round(mfu, 6)
        if not self.over_peak:
            log.warning(f"mfu: {mfu:.2f} of the {self.peak * 1e3:.1f} GFLOP/s peak cannot be true, so mfu is "
                        f"reported as unknown; set peak_tflops to this device's peak in TFLOPS")
        self.over_peak = True
        return "unknown"

    def interval(self) -> dict:
        now = time.perf_counter()
        runtime = max(now - self.last, 1e-9)
        samples_s = self.global_batch * self.steps_since / runtime
        tokens_s = samples_s * self.seq_len
        per_device = tokens_s / self.world
        out = {
            "interval_runtime": round(runtime, 4),
            "interval_samples_per_second": round(samples_s, 4),
            "interval_tokens_per_second_per_device": round(per_device, 4),
            "interval_hardware_tflops_per_device": round(per_device * self.hw_flops / 1e12, 4),
            "interval_steps_per_second": round(self.steps_since / runtime, 4),
            "tokens_per_sec": round(tokens_s, 2),
            "tokens_per_sec_per_replica": round(tokens_s / self.dp, 2),
            "model_tflops_per_device": round(per_device * self.flops / 1e12, 6),
            "mfu": self._mfu(per_device),
            # what mfu is over (kept when mfu is unknown for passing it: it names the peak that is wrong)
            "peak_tflops_per_device": float(f"{self.peak:.6g}") if self.peak else "unknown",
        }
        self.last, self.steps_since = now, 0
        return out
