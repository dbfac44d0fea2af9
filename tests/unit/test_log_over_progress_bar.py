"""On a terminal `train`'s progress bar (stderr) and its log lines (stdout) share the screen: every log line
(each `logging_steps`, eval, save) began after the bar's text on the same line, `train:  20%|██ | 20/100
[00:20<01:24, 1.06s/step, loss=7.6459][2026-12-07 02:13:01,244] [    INFO] - loss: …`."""
import contextlib
import io
import logging

from tqdm import tqdm

from pretrain_cli.training.metrics import setup_logging


def _screen() -> io.StringIO:
    """One stream standing for the terminal both stdout and stderr write to."""
    return io.StringIO()


def test_a_log_line_starts_on_its_own_line_and_the_bar_is_redrawn_below_it():
    screen = _screen()
    with contextlib.redirect_stdout(screen), contextlib.redirect_stderr(screen):
        setup_logging(0)
        bar = tqdm(total=100, desc="train", unit="step", file=screen, ncols=80, mininterval=0)
        try:
            bar.update(20)
            logging.getLogger("pretrain_cli").info("loss: 7.03286936, global_step: 20")
            bar.update(1)
        finally:
            bar.close()
    out = screen.getvalue()
    at = out.index("[    INFO] - loss: 7.03286936")
    start = max(out.rfind("\r", 0, at), out.rfind("\n", 0, at)) + 1  # where the screen line holding the log begins
    assert out[start:at].startswith("[") and "train" not in out[start:at], repr(out[start:at])
    assert "train:" in out[at:], "the bar is drawn again after the line"


def test_without_a_bar_the_line_is_written_as_before():
    screen = _screen()
    with contextlib.redirect_stdout(screen):
        setup_logging(0)
        logging.getLogger("pretrain_cli").info("saved out/checkpoint-4")
    assert screen.getvalue().endswith("] [    INFO] - saved out/checkpoint-4\n")
    assert "\r" not in screen.getvalue()
