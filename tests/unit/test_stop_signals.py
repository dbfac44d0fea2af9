"""training/stop_signals.StopSignals: a signal while the loop runs is one stop request, and nothing after it is
handled until `restore`: Paddle's launcher sends its SIGTERM up to 3 times 0.2 s apart, and a second one handled by
Python interrupted the save's store wait (EINTR: rank 0 crashed after a Ctrl-C under launch.sh)."""
import logging
import signal
import threading

from pretrain_cli.training.stop_signals import LAUNCHED, SIGNALS, StopSignals


def test_the_first_signal_is_the_stop_and_further_ones_are_ignored_until_restore():
    before = {s: signal.getsignal(s) for s in SIGNALS}
    stops = StopSignals()
    stops.listen()
    try:
        assert not stops.requested
        signal.pthread_kill(threading.get_ident(), signal.SIGTERM)  # this thread: handled before the next line
        assert stops.requested
        assert all(signal.getsignal(s) is signal.SIG_IGN for s in SIGNALS)
        signal.pthread_kill(threading.get_ident(), signal.SIGINT)  # ignored: no KeyboardInterrupt, no handler
        stops.hold()
        assert all(signal.getsignal(s) is signal.SIG_IGN for s in SIGNALS)
    finally:
        stops.restore()
    assert {s: signal.getsignal(s) for s in SIGNALS} == before


def test_a_launched_ranks_sigterm_is_said_as_the_launchers_stop(monkeypatch, caplog):
    """A Ctrl-C under launch.sh: the launcher turns it into a SIGTERM to each rank, whose log said a bare `received
    SIGTERM` where the user had pressed Ctrl-C."""
    monkeypatch.setenv("PADDLE_TRAINER_ID", "1")
    stops = StopSignals()
    stops.listen()
    try:
        with caplog.at_level(logging.WARNING, logger="pretrain_cli"):
            signal.pthread_kill(threading.get_ident(), signal.SIGTERM)
    finally:
        stops.restore()
    said = [r.getMessage() for r in caplog.records if "received SIGTERM" in r.getMessage()]
    assert said == [f"received SIGTERM{LAUNCHED}: finishing the current step, then saving"], said
    assert "Ctrl-C" in LAUNCHED


def test_a_signal_while_the_loop_ends_with_an_error_is_said_as_that_and_ignored(caplog):
    """Disk full under launch.sh: rank 1, its save failed by rank 0, got the launcher's SIGTERM as it left and its log
    said `received SIGTERM after the last step (saved): finishing the evaluation and the final export` (the trainer
    set `finishing` on every end of its loop that was no stop)."""
    before = {s: signal.getsignal(s) for s in SIGNALS}
    stops = StopSignals()
    stops.listen()
    try:
        stops.ending()
        with caplog.at_level(logging.WARNING, logger="pretrain_cli"):
            signal.pthread_kill(threading.get_ident(), signal.SIGTERM)  # said, not raised, not the default action
    finally:
        stops.restore()
    assert [r.getMessage() for r in caplog.records] == ["received SIGTERM while this rank ends with an error: ignored"]
    assert {s: signal.getsignal(s) for s in SIGNALS} == before
