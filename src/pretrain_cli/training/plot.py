"""`output_dir/loss_curve.png`: training loss, eval/test loss and the learning rate against the step.

The logged `loss` is the loss optimized: a Mixture-of-Experts model's router terms and DeepSeek-V3's
mtp_loss_weight x mtp_loss are in it, which `eval_loss` leaves out (with MTP ~0.3 x mtp_loss above the eval curve,
~1.7 nats on micro-deepseek-v3). Where the records carry the language-model part alone (`lm_loss`,
`models.moe_loss.add_lm_loss`) it is drawn too, and the legend says which line is which, so the curve comparable
to the eval points is there to read.

Drawn with matplotlib's Agg renderer straight onto a `Figure` (no pyplot, no display, no global
state), from `metrics.jsonl` (the one record of the run), at a checkpoint (at most once a minute), at a stop and at
the end.
matplotlib is imported only when a curve is drawn, so commands and `--help` never pay for it.

A run's metrics.jsonl grows by a line per log step for as long as it runs (PaddleNLP's argument files log every
step), so the drawing keeps only the numbers it draws (`Curve`: 8 bytes each) and, at a checkpoint, reads only
the lines written since the last drawing. Reading the whole file into records at every drawing cost, at 100,000
records (67 MB), 1.1 CPU-s and 390 MB of host memory per drawing, growing with the run (measured).
"""
from __future__ import annotations

import io
import json
from array import array
from pathlib import Path

from pretrain_cli import atomic, run_dir

CURVE_FILE = "loss_curve.png"


def read_records(metrics_path: Path) -> list[dict]:
    """The JSON records of metrics.jsonl (a line cut short by a kill is skipped)."""
    records = []
    if Path(metrics_path).is_file():
        for line in Path(metrics_path).read_text(encoding="utf-8").splitlines():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return records


MAX_EVAL_DOTS = 60  # more evaluations than this are drawn as a plain line

# (record kind, key) of every series the figure draws
SERIES = (("train", "loss"), ("train", "lm_loss"), ("train", "learning_rate"), ("eval", "eval_loss"),
          ("test", "test_loss"))


class Curve:
    """The drawn series of a metrics.jsonl, (steps, values) per `SERIES` entry, read incrementally: `update` parses
    the complete lines written since the previous one (a line still being written waits for the next; a line cut
    short by a kill is skipped), and starts over when the file became shorter (a resume rewrote it)."""

    def __init__(self, path=None):
        self.path = Path(path) if path is not None else None
        self._clear()

    def _clear(self) -> None:
        self.offset = 0  # bytes of the file read so far
        self.series = {s: (array("d"), array("d")) for s in SERIES}

    @classmethod
    def of(cls, records) -> "Curve":
        curve = cls()
        for record in records:
            curve.add(record)
        return curve

    def add(self, record: dict) -> None:
        step = record.get("step")
        for kind, key in SERIES:
            val = record.get(key)
            if record.get("kind") == kind and isinstance(val, (int, float)) and isinstance(step, (int, float)):
                steps, values = self.series[(kind, key)]
                steps.append(step)
                values.append(val)

    def update(self) -> "Curve":
        try:
            size = self.path.stat().st_size
        except FileNotFoundError:
            return self
        if size < self.offset:
            self._clear()
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            for line in f:
                if not line.endswith(b"\n"):  # being written (or cut short by a kill: the last line)
                    break
                self.offset += len(line)
                try:
                    self.add(json.loads(line))
                except (json.JSONDecodeError, UnicodeDecodeError, AttributeError):
                    continue
        return self


def _series(curve: Curve, kind: str, key: str) -> tuple[array, array]:
    return curve.series[(kind, key)]


def loss_figure(records, run_name: str):
    """The figure: loss (left axis) and learning rate (right axis) against the optimizer step; `records`: a `Curve`,
    or metrics.jsonl records."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    curve = records if isinstance(records, Curve) else Curve.of(records)
    # fixed margins, not `layout="constrained"`: that lays every text out twice and costs half of each drawing
    # (0.82 -> 0.43 CPU-s; a run draws one at a checkpoint at most once a minute, and one at the end)
    fig = Figure(figsize=(8, 4.8), dpi=100)
    fig.subplots_adjust(left=0.1, right=0.88, top=0.92, bottom=0.2)
    ax = fig.add_subplot()
    lines = []
    steps, loss = _series(curve, "train", "loss")
    lm_steps, lm_loss = _series(curve, "train", "lm_loss")
    if steps:  # with its LM part beside it, it says what it holds besides
        lines += ax.plot(steps, loss, color="C0", linewidth=1.5,
                         label="training loss (optimized: LM + router/MTP terms)" if lm_steps else "training loss")
    if lm_steps:  # what eval_loss measures
        lines += ax.plot(lm_steps, lm_loss, color="C4", linewidth=1.5, label="training LM loss (as eval)")
    steps, loss = _series(curve, "eval", "eval_loss")
    if steps:  # a dot per evaluation while they are few: a long run's hundreds of dots hid both curves
        dots = len(steps) <= MAX_EVAL_DOTS
        lines += ax.plot(steps, loss, color="C3", marker="o" if dots else "None", linestyle=":" if dots else "-",
                         label="eval loss", zorder=3)
    steps, loss = _series(curve, "test", "test_loss")
    if steps:  # a hollow, larger square: the eval point at the same step stays visible inside it
        lines += ax.plot(steps, loss, color="C1", marker="s", markersize=10, markerfacecolor="none",
                         markeredgewidth=1.5, linestyle="none", label="test loss", zorder=2)
    ax.set_xlabel("step")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole: no 2.5 on a 5-step run
    ax.set_ylabel("loss (nats/token)")
    ax.grid(True, alpha=0.3)
    steps, lr = _series(curve, "train", "learning_rate")
    if steps:
        lr_ax = ax.twinx()
        lines += lr_ax.plot(steps, lr, color="C2", linestyle="--", linewidth=1, label="learning rate")
        lr_ax.set_ylabel("learning rate")
        lr_ax.ticklabel_format(axis="y", style="sci", scilimits=(-3, 3))
    if lines:
        _legend_below(fig, ax, lines)
    else:
        ax.text(0.5, 0.5, "nothing logged yet", ha="center", va="center", transform=ax.transAxes)
    ax.set_title(f"{run_name}: loss and learning rate", parse_math=False)  # a "$" in a path is not TeX
    return fig


GAP_PX = 8  # between the x axis' label and the legend's top
EDGE_PX = 10  # the legend's least distance from the figure's left and right edges


def _legend_below(fig, ax, lines) -> None:
    """The legend below the axes, where it never hides a curve, in the most columns that fit the figure's width
    (its labels are measured, not counted: a MoE or DeepSeek run's four labels, two of them long, are wider than the
    figure in one row), and the axes raised to leave room for its rows under the x axis."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    renderer = (fig.canvas if hasattr(fig.canvas, "get_renderer") else FigureCanvasAgg(fig)).get_renderer()
    labels = [line.get_label() for line in lines]
    for ncols in range(len(lines), 0, -1):  # fewest rows first
        legend = fig.legend(lines, labels, loc="lower center", ncols=ncols, frameon=False)
        if ncols == 1 or legend.get_window_extent(renderer).width <= fig.bbox.width - 2 * EDGE_PX:
            break
        legend.remove()
    below_axes = ax.bbox.y0 - ax.xaxis.get_tightbbox(renderer).y0  # px of tick labels and the x label
    top = legend.get_window_extent(renderer).y1 + GAP_PX + below_axes
    fig.subplots_adjust(bottom=top / fig.bbox.height)


def render_png(records, run_name: str) -> bytes:
    """`records`: a `Curve`, or metrics.jsonl records."""
    buf = io.BytesIO()
    loss_figure(records, run_name).savefig(buf, format="png")
    return buf.getvalue()


def write_loss_curve(output_dir, curve: Curve | None = None) -> Path | None:
    """Draw metrics.jsonl into output_dir/loss_curve.png (atomically: rendered to bytes, then published); `curve`:
    the `Curve` of that file kept from an earlier drawing (it reads only what was written since), else it is read
    whole.

    A picture that cannot be drawn is a warning, never the end of a training run; a file that cannot be
    written is the OSError every other write raises."""
    import logging

    out = Path(output_dir)
    try:
        curve = (curve or Curve(out / run_dir.METRICS_FILE)).update()
        png = render_png(curve, out.resolve().name)
    except Exception as e:  # matplotlib raises many types (fonts, backends, layout)
        logging.getLogger("pretrain_cli").warning(f"{out / CURVE_FILE}: not drawn ({type(e).__name__}: {e}); "
                                                  f"metrics.jsonl holds the same numbers")
        return None
    path = out / CURVE_FILE
    atomic.write_bytes(path, png)
    return path
