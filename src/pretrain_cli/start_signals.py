"""What a process does with SIGTERM and Ctrl-C from its start until Paddle is imported.

Paddle's import installs a C++ SIGTERM handler that prints `C++ Traceback ... FatalError: Termination signal` and
runs on for seconds, and its subprocesses (`which nvcc`, `which ccache`) run under a bare `except:` that swallows a
Ctrl-C. A launcher stopping a rank during its start-up (after another rank's usage error) or a user pressing Ctrl-C
then must still see a quiet end or `error: interrupted`, 130: `runtime.import_paddle` keeps a Ctrl-C
(`interrupt_kept`) and holds SIGTERM (`hold_stop_signals`) until it has decided SIGTERM's disposition; `train`
holds it from its first line, before any import that starts native threads.
"""
from __future__ import annotations

import contextlib
import signal
import threading


@contextlib.contextmanager
def interrupt_kept():
    """A Ctrl-C during the block ends it with KeyboardInterrupt, also where code inside swallows the interrupt.

    Why: Paddle's import asks `which nvcc` and `which ccache` in subprocesses under a bare `except:`
    (paddle/utils/cpp_extension/extension_utils.py: find_cuda_home, find_ccache_home), which catches the
    KeyboardInterrupt of a Ctrl-C pressed then (and the error of the `which` that the terminal's SIGINT killed):
    the import went on and the command ran as if no key had been pressed. So a Ctrl-C in the block is noted as it
    is raised, and a block that ends without raising it raises it then. Where Python's own Ctrl-C handler is not
    the one in place (SIGINT ignored, the caller's handler, a thread other than the main one) nothing changes.
    """
    main = threading.current_thread() is threading.main_thread()
    if not main or signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        yield
        return
    pressed = []

    def noted(signum, frame):
        pressed.append(signum)
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, noted)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if pressed:  # (the block swallowed it)
        raise KeyboardInterrupt


STOP_SIGNALS = (signal.SIGTERM,)  # the one Paddle's import gives a C++ handler
_HELD: list = []  # the main thread's signal mask before `hold_stop_signals`, while it holds them


def hold_stop_signals() -> None:
    """Block SIGTERM on the main thread until `release_stop_signals` (`import_paddle`, once it has set SIGTERM's
    disposition), so that every thread started meanwhile blocks it for good.

    Why: a thread inherits its creator's mask, and the kernel gives a process's signal to any thread not blocking
    it. numpy's OpenBLAS workers, started by `train`'s `prepare` before Paddle's import, took a launcher's SIGTERM
    during that import and ran the C++ handler it installs (`FatalError: Termination signal` in the rank's log). A
    SIGTERM sent meanwhile waits and then reaches the main thread, once: its quiet default end. SIGINT and SIGHUP
    are not held: Paddle's import gives them no native handler (Python's and the default stay), and a Ctrl-C during
    a long `prepare` must act at once. Main thread only; a second hold does nothing."""
    if not _HELD and threading.current_thread() is threading.main_thread():
        _HELD.append(signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS))


def release_stop_signals() -> None:
    """End `hold_stop_signals`, if held: a signal sent meanwhile is delivered now, to this (the main) thread."""
    if _HELD and threading.current_thread() is threading.main_thread():
        signal.pthread_sigmask(signal.SIG_SETMASK, _HELD.pop())
