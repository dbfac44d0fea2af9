"""The loss curve: what the figure shows, the PNG it becomes, and that nothing imports matplotlib early."""
import json
import logging
import subprocess
import sys

import numpy as np

from pretrain_cli.training.plot import loss_figure, read_records, render_png, write_loss_curve


def _records():
    out = [{"kind": "train", "step": s, "loss": 7.0 - 0.01 * s, "learning_rate": 1e-3 * min(1, s / 20)}
           for s in [1] + list(range(20, 401, 20))]
    out += [{"kind": "eval", "step": s, "eval_loss": 6.0 - 0.005 * s} for s in (100, 200, 300, 400)]
    out.append({"kind": "test", "step": 400, "test_loss": 4.1})
    return out


def test_figure_has_labelled_axes_legend_and_the_run_name():
    fig = loss_figure(_records(), "demo-run")
    ax, lr_ax = fig.axes
    assert ax.get_xlabel() == "step" and "loss" in ax.get_ylabel() and lr_ax.get_ylabel() == "learning rate"
    assert "demo-run" in ax.get_title()
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["training loss", "eval loss", "test loss",
                                                                  "learning rate"]
    train, evals = ax.get_lines()[0], ax.get_lines()[1]
    assert list(train.get_xdata()) == [1] + list(range(20, 401, 20))
    assert list(evals.get_xdata()) == [100, 200, 300, 400] and evals.get_marker() == "o"
    assert lr_ax.get_lines()[0].get_ydata()[-1] == 1e-3


def test_the_lm_part_of_a_loss_with_router_and_mtp_terms_is_drawn_beside_it():
    """DeepSeek-V3 with MTP logs `loss` = LM loss + 0.3 x mtp_loss (+ router terms), ~1.7 above the eval curve; the
    curve drew that line alone, labelled "training loss". Its logged LM part (`lm_loss`) is drawn too, and the legend
    says which is which; a run without it (a dense model) keeps the one line and its label."""
    recs = _records()
    for r in recs:
        if r["kind"] == "train":
            r["lm_loss"] = r["loss"] - 1.7
    fig = loss_figure(recs, "v3")
    ax = fig.axes[0]
    assert [t.get_text() for t in fig.legends[0].get_texts()] == [
        "training loss (optimized: LM + router/MTP terms)", "training LM loss (as eval)", "eval loss", "test loss",
        "learning rate"]
    train, lm = ax.get_lines()[:2]
    assert list(lm.get_xdata()) == list(train.get_xdata())
    assert np.allclose(np.asarray(train.get_ydata()) - np.asarray(lm.get_ydata()), 1.7)


def test_png_bytes_and_atomic_write(tmp_path):
    import matplotlib.image

    data = render_png(_records(), "r")
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    run = tmp_path / "my-run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _records()) + '{"kind": "tra')
    assert len(read_records(run / "metrics.jsonl")) == len(_records())  # the cut-short line is skipped
    path = write_loss_curve(run)
    image = matplotlib.image.imread(str(path))
    assert image.shape[:2] == (480, 800) and float(np.std(image)) > 0.05  # drawn, not blank
    assert sorted(p.name for p in run.iterdir()) == ["loss_curve.png", "metrics.jsonl"]  # no temporaries left
    assert render_png([], "empty")[:4] == b"\x89PNG"  # nothing logged yet: still a valid picture


def test_any_run_name_is_drawn_literally(tmp_path):
    name = "o $HOME ~x `touch pwned` $(touch pwned2)"
    assert loss_figure(_records(), name).axes[0].get_title() == f"{name}: loss and learning rate"
    run = tmp_path / name
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _records()))
    assert write_loss_curve(run).read_bytes()[:4] == b"\x89PNG"  # (mathtext would refuse the "$")


def test_a_curve_that_cannot_be_drawn_is_a_warning(tmp_path, monkeypatch, caplog):
    import pretrain_cli.training.plot as plot

    def broken(records, name):
        raise RuntimeError("no fonts")

    monkeypatch.setattr(plot, "render_png", broken)
    logger = logging.getLogger("pretrain_cli")  # (it may not propagate to the root once training set it up)
    logger.addHandler(caplog.handler)
    try:
        assert plot.write_loss_curve(tmp_path) is None and not (tmp_path / "loss_curve.png").exists()
    finally:
        logger.removeHandler(caplog.handler)
    assert "loss_curve.png: not drawn (RuntimeError: no fonts)" in caplog.text


def test_matplotlib_is_imported_only_to_draw():
    code = ("import sys; import pretrain_cli.training.plot, pretrain_cli.training.metrics, pretrain_cli.cli; "
            "print('matplotlib' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False", out.stderr


def test_checkpoint_curves_are_drawn_off_the_training_thread(tmp_path, monkeypatch):
    """`MetricsWriter.plot` returns before the drawing ends, drops a request while one runs, `close` waits
    for it, and a write the system refuses is raised on the training thread at the next request."""
    import threading

    import pretrain_cli.training.metrics as metrics
    import pretrain_cli.training.plot as plot
    from pretrain_cli.training.metrics import MetricsWriter

    monkeypatch.setattr(metrics, "REDRAW_SECONDS", 0.0)  # (the throttle is the next test's)

    release, drawn = threading.Event(), []

    def slow(output_dir, curve=None):
        release.wait(30)
        drawn.append(threading.current_thread().name)
        if len(drawn) == 2:
            raise OSError(28, "No space left on device")

    monkeypatch.setattr(plot, "write_loss_curve", slow)
    writer = MetricsWriter(str(tmp_path), None, ["none"], None)
    writer.plot()
    writer.plot()  # dropped: one drawing at a time
    assert drawn == []  # returned while the drawing waits
    release.set()
    writer._plotter.join()
    writer.plot()  # the second drawing fails ...
    writer._plotter.join()
    try:
        writer.plot()  # ... and its error surfaces here
        raise AssertionError("the write error was swallowed")
    except OSError as e:
        assert e.errno == 28
    writer.close()
    assert drawn == ["loss-curve", "loss-curve"]


def test_a_short_run_has_whole_step_ticks_and_its_eval_point_shows_beside_the_test_one():
    records = [{"kind": "train", "step": s, "loss": 7.0 - 0.1 * s, "learning_rate": 1e-3} for s in range(1, 6)]
    records += [{"kind": "eval", "step": 5, "eval_loss": 6.5}, {"kind": "test", "step": 5, "test_loss": 6.5}]
    fig = loss_figure(records, "five")
    fig.canvas.draw()
    ax = fig.axes[0]
    ticks = [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
    assert ticks and all(float(t).is_integer() for t in ticks), ticks
    evals, test = ax.get_lines()[1], ax.get_lines()[2]
    assert evals.get_zorder() > test.get_zorder() and test.get_markerfacecolor() == "none"
    assert test.get_markersize() > evals.get_markersize()  # the eval dot sits inside the hollow test square


def test_checkpoints_within_a_minute_of_the_last_drawing_or_the_start_do_not_draw(tmp_path, monkeypatch):
    """A checkpoint's request within `REDRAW_SECONDS` of the previous drawing's start, or of the run's (the writer's),
    is dropped (seconds-apart checkpoints of a short run cost a drawing each, ~40 % of a 10-step CPU run), unless the
    run stops at that checkpoint (a signal: no final export draws after it); one after the minute draws."""
    import pretrain_cli.training.metrics as metrics
    import pretrain_cli.training.plot as plot
    from pretrain_cli.training.metrics import MetricsWriter

    drawn = []
    monkeypatch.setattr(plot, "write_loss_curve", lambda output_dir, curve=None: drawn.append(output_dir))
    writer = MetricsWriter(str(tmp_path), None, ["none"], None)
    writer.plot()  # dropped: the run started less than a minute ago
    assert writer._plotter is None and drawn == []
    writer.plot(stopping=True)  # the run stops here: drawn whatever the minute says
    writer._plotter.join()
    writer.plot()  # dropped: the last drawing started less than a minute ago
    writer._plotter.join()
    assert len(drawn) == 1 and metrics.REDRAW_SECONDS == 60.0
    monkeypatch.setattr(metrics, "REDRAW_SECONDS", 0.0)  # as if the minute had passed
    writer.plot()
    writer._plotter.join()
    writer.close()
    assert len(drawn) == 2



def test_log_lines_go_to_the_stdout_of_the_moment_not_the_one_logging_was_set_up_with():
    """A run started in-process may outlive the stream it set its logging up with (a caller's redirection, pytest's
    capture of an earlier test): its lines go to the current `sys.stdout`, never to a closed one."""
    import contextlib
    import io
    import logging

    from pretrain_cli.training.metrics import setup_logging

    first = io.StringIO()
    with contextlib.redirect_stdout(first):
        setup_logging(0)
    first.close()
    now = io.StringIO()
    with contextlib.redirect_stdout(now):
        logging.getLogger("pretrain_cli").info("checkpoint-4: stalled 0.025 s (sync)")
    assert now.getvalue().endswith("] [    INFO] - checkpoint-4: stalled 0.025 s (sync)\n")


def test_a_checkpoints_drawing_reads_only_the_lines_written_since_the_last_one(tmp_path, monkeypatch):
    """metrics.jsonl grows by a line per log step for the whole run: reading it whole at every drawing cost 1.1 CPU-s
    and 390 MB per drawing at 100,000 records, growing with the run. The writer's `Curve` parses each line once; a
    line still being written waits for the next drawing; a shorter file (a resume rewrote it) is read again."""
    import pretrain_cli.training.metrics as metrics
    import pretrain_cli.training.plot as plot
    from pretrain_cli.training.metrics import MetricsWriter

    monkeypatch.setattr(metrics, "REDRAW_SECONDS", 0.0)
    parsed, drawn = [], []
    real_add = plot.Curve.add
    monkeypatch.setattr(plot.Curve, "add", lambda self, record: (parsed.append(record["step"]), real_add(self, record)))
    monkeypatch.setattr(plot, "render_png", lambda curve, name: (drawn.append(list(curve.series[("train", "loss")][0])),
                                                                 b"\x89PNG")[1])
    writer = MetricsWriter(str(tmp_path), None, ["none"], None)

    def log(first, last):
        for s in range(first, last + 1):
            writer.write("train", s, {"loss": 5.0 - s / 100, "learning_rate": 1e-3})

    def draw():
        writer.plot()
        writer._plotter.join()

    log(1, 100)
    draw()
    assert parsed == list(range(1, 101))
    log(101, 110)
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"kind": "train", "step": 111, "lo')  # a line still being written
    draw()
    assert parsed[100:] == list(range(101, 111)) and drawn[-1] == list(range(1, 111))
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('ss": 3.0, "learning_rate": 0.001}\n')
    draw()
    assert parsed[110:] == [111] and drawn[-1] == list(range(1, 112))
    writer.close()
    (tmp_path / "metrics.jsonl").write_text('{"kind": "train", "step": 1, "loss": 9.0}\n')  # rewritten (a resume)
    curve = writer._curve.update()
    assert list(curve.series[("train", "loss")][1]) == [9.0]
    whole = plot.Curve(tmp_path / "metrics.jsonl").update()
    assert {k: [list(a) for a in v] for k, v in whole.series.items()} == \
        {k: [list(a) for a in v] for k, v in plot.Curve.of([{"kind": "train", "step": 1, "loss": 9.0}]).series.items()}


def test_a_long_runs_many_evaluations_are_a_line_not_a_band_of_dots():
    from pretrain_cli.training.plot import MAX_EVAL_DOTS

    many = [{"kind": "eval", "step": 50 * k, "eval_loss": 2.0} for k in range(1, 241)]  # 12,000 steps, eval every 50
    evals = loss_figure(_records()[:5] + many, "long").axes[0].get_lines()[1]
    assert evals.get_marker() == "None" and evals.get_linestyle() == "-" and len(many) > MAX_EVAL_DOTS
    assert loss_figure(_records(), "short").axes[0].get_lines()[1].get_marker() == "o"


def test_every_runs_legend_lies_inside_the_figure_and_below_the_x_axis():
    """Dense, MoE (`lm_loss`: the loss without its router terms) and DeepSeek with MTP (`lm_loss`, and its `mtp_loss`
    and router terms in the records, drawn by no line), each without eval, with eval, and with eval and test: the
    legend was four long labels in one row for a MoE run with eval, cut at both edges of the figure."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    for model in ("dense", "moe", "deepseek_mtp"):
        lm = model != "dense"
        for kinds in ((), ("eval",), ("eval", "test")):
            recs = [r for r in _records() if r["kind"] == "train" or r["kind"] in kinds]
            for r in recs:
                if lm and r["kind"] == "train":
                    r["lm_loss"] = r["loss"] - 0.3
                    r["aux_loss"] = 0.01
                if model == "deepseek_mtp" and r["kind"] == "train":
                    r["mtp_loss"] = r["loss"] + 0.5
            fig = loss_figure(recs, "demo/moe")
            renderer = FigureCanvasAgg(fig).get_renderer()  # the canvas savefig draws with
            legend = fig.legends[0].get_window_extent(renderer)
            assert len(fig.legends[0].get_texts()) == 2 + lm + len(kinds)
            inside = fig.bbox.x0 <= legend.x0 and legend.x1 <= fig.bbox.x1 and fig.bbox.y0 <= legend.y0
            assert inside, (model, kinds, legend.extents, fig.bbox.extents)
            assert legend.y1 < fig.axes[0].get_tightbbox(renderer).y0, (model, kinds)  # under the x axis' label
