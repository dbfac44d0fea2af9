"""The stand-in rank of the watcher tests (test_rank_departure, test_watcher_lines, test_watcher_gone): a plain Python
process (no Paddle) with one peer, its own watcher forked as a rank's is (`watchdog._spawn`, rank 0 of the host's
two), its stdout and stderr going through that watcher to the test's pipe, which stands for the workerlog.

Test side: `start` / `run` a child whose code is `body` after the set-up below (`shared`, `verdicts`, `args` defined,
the modules imported); `peer_pid` reads its peer's pid. Child side (`watched`, `wait_followed`): imported by the
child, from this directory."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

HEADER = f"""
import os, signal, subprocess, sys, time
from pathlib import Path
sys.path.insert(0, {str(HERE)!r})
from pretrain_cli import processes
from pretrain_cli.distributed.launcher import departure, watchdog, watcher
from watched_rank_child import LEAVES, SLEEPS, watched, wait_followed
shared, verdicts, args = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3:]
"""

# peers: one that ends (code 2) once its stdin closes (a rank leaving: `departure.note`, then its exit), one that sleeps
LEAVES = "import sys; sys.stdin.read(); sys.exit(2)"
SLEEPS = "import time; time.sleep(60)"


def start(tmp_path: Path, body: str, *args: str) -> subprocess.Popen:
    """The child running `body` with `args` (its stdout and stderr together, as text), under `tmp_path`."""
    shared, verdicts = tmp_path / "shared", tmp_path / "verdicts"
    shared.mkdir()
    verdicts.mkdir()
    return subprocess.Popen([sys.executable, "-c", HEADER + body, str(shared), str(verdicts), *map(str, args)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def run(tmp_path: Path, body: str, *args: str, timeout: float = 60) -> tuple[subprocess.Popen, str]:
    """`start`, to the child's end (a bound, not a measurement): (the process, all it wrote)."""
    p = start(tmp_path, body, *args)
    return p, communicate(tmp_path, p, timeout)


def communicate(tmp_path: Path, p: subprocess.Popen, timeout: float = 60) -> str:
    """All the child `p` writes to its end; past `timeout` (a bound: a hung child), the child, its peer and its
    watcher (its own session: no process group reaches it) are SIGKILLed before the error goes on, so that no test
    leaves them running."""
    try:
        return p.communicate(timeout=timeout)[0]
    except BaseException:
        end(tmp_path, p)
        raise


def end(tmp_path: Path, p: subprocess.Popen) -> None:
    """SIGKILL the child `p`, then its peer (`peer.pid`) and watcher (`watcher-0.pid`, while it runs) if still there."""
    import contextlib
    import signal

    p.kill()
    for pid_file in [tmp_path / "peer.pid", *(tmp_path / "verdicts").glob("watcher-*.pid")]:
        with contextlib.suppress(OSError, ValueError):
            os.kill(int(pid_file.read_text()), signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        p.communicate(timeout=10)


def peer_pid(tmp_path: Path) -> str:
    return (tmp_path / "peer.pid").read_text()


# ---------------------------------------------------------------------------------------------------- in the child
def watched(shared: Path, verdicts: Path, peer_code: str, grace: float = 5.0) -> subprocess.Popen:
    """Start the peer (`LEAVES`: its stdin a pipe; `SLEEPS`), fork this process's watcher over both (pids in
    `peer.pid` beside `shared`), and mark the watcher's taking up of a departure (`wait_followed`). Set
    `departure.GRACE` before: the forked watcher keeps the value it had."""
    from pretrain_cli.distributed.launcher import departure, watchdog, watcher

    peer = subprocess.Popen([sys.executable, "-c", peer_code], stdin=subprocess.PIPE if peer_code == LEAVES else None,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    follow = departure.follow

    def followed(w, left, pipe, log):  # (in the watcher) it has seen the departure: its rank may end now
        (shared.parent / "followed").write_text("")
        return follow(w, left, pipe, log)

    departure.follow = followed
    watchdog._spawn(watcher.Watcher(0, {0: os.getpid(), 1: peer.pid}, "h", shared, verdicts, grace=grace))
    (shared.parent / "peer.pid").write_text(str(peer.pid))
    return peer


def wait_followed(shared: Path) -> None:
    """Until this rank's watcher has taken up the peer's departure (`departure.follow`): a rank that ended before was
    seen gone with its peer, and its watcher passed on all it wrote, its abort too."""
    while not (shared.parent / "followed").exists():
        time.sleep(0.001)
