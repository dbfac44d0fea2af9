"""`output_dir/loss_curve.png`: training loss, eval/test loss and the learning rate against the step.

Drawn with matplotlib's Agg renderer straight onto a `Figure` (no pyplot, no display, no global
state), from `metrics.jsonl` (the one record of the run), at a checkpoint (at most once a minute), at a stop and at
the end.
matplotlib is imported only when a curve is drawn, so commands and `--help` never pay for it.
"""
from __future__ import annotations

import io
import json
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


def _series(records: list[dict], kind: str, key: str) -> tuple[list, list]:
    pts = [(r["step"], r[key]) for r in records if r.get("kind") == kind and isinstance(r.get(key), (int, float))]
    return [p[0] for p in pts], [p[1] for p in pts]


def loss_figure(records: list[dict], run_name: str):
    """The figure: loss (left axis) and learning rate (right axis) against the optimizer step."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    # fixed margins, not `layout="constrained"`: that lays every text out twice and costs half of each drawing
    # (0.82 -> 0.43 CPU-s; a run draws one at a checkpoint at most once a minute, and one at the end)
    fig = Figure(figsize=(8, 4.8), dpi=100)
    fig.subplots_adjust(left=0.1, right=0.88, top=0.92, bottom=0.2)
    ax = fig.add_subplot()
    lines = []
    steps, loss = _series(records, "train", "loss")
    if steps:
        lines += ax.plot(steps, loss, color="C0", linewidth=1.5, label="training loss")
    steps, loss = _series(records, "eval", "eval_loss")
    if steps:
        lines += ax.plot(steps, loss, color="C3", marker="o", linestyle=":", label="eval loss", zorder=3)
    steps, loss = _series(records, "test", "test_loss")
    if steps:  # a hollow, larger square: the eval point at the same step stays visible inside it
        lines += ax.plot(steps, loss, color="C1", marker="s", markersize=10, markerfacecolor="none",
                         markeredgewidth=1.5, linestyle="none", label="test loss", zorder=2)
    ax.set_xlabel("step")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole: no 2.5 on a 5-step run
    ax.set_ylabel("loss (nats/token)")
    ax.grid(True, alpha=0.3)
    steps, lr = _series(records, "train", "learning_rate")
    if steps:
        lr_ax = ax.twinx()
        lines += lr_ax.plot(steps, lr, color="C2", linestyle="--", linewidth=1, label="learning rate")
        lr_ax.set_ylabel("learning rate")
        lr_ax.ticklabel_format(axis="y", style="sci", scilimits=(-3, 3))
    if lines:  # below the axes: it never hides a curve
        fig.legend(lines, [line.get_label() for line in lines], loc="lower center", ncols=len(lines), frameon=False)
    else:
        ax.text(0.5, 0.5, "nothing logged yet", ha="center", va="center", transform=ax.transAxes)
    ax.set_title(f"{run_name}: loss and learning rate", parse_math=False)  # a "$" in a path is not TeX
    return fig


def render_png(records: list[dict], run_name: str) -> bytes:
    buf = io.BytesIO()
    loss_figure(records, run_name).savefig(buf, format="png")
    return buf.getvalue()


def write_loss_curve(output_dir) -> Path | None:
    """Draw metrics.jsonl into output_dir/loss_curve.png (atomically: rendered to bytes, then published).

    A picture that cannot be drawn is a warning, never the end of a training run; a file that cannot be
    written is the OSError every other write raises."""
    import logging

    out = Path(output_dir)
    try:
        png = render_png(read_records(out / run_dir.METRICS_FILE), out.resolve().name)
    except Exception as e:  # matplotlib raises many types (fonts, backends, layout)
        logging.getLogger("pretrain_cli").warning(f"{out / CURVE_FILE}: not drawn ({type(e).__name__}: {e}); "
                                                  f"metrics.jsonl holds the same numbers")
        return None
    path = out / CURVE_FILE
    atomic.write_bytes(path, png)
    return path
