"""Naming a dead peer, and making sure a rank stuck in a collective does not hang the job.

When a rank dies, gloo aborts the others from C++ (`terminate called ... Connection reset by peer`)
with no word on who died. Each rank publishes `host:pid` in the launcher's TCP store; a forked
watcher process (plain os calls only, no Paddle) names a dead peer in this rank's log as soon as it
is gone, and stops this rank at once (before gloo's abort adds its C++ traceback).
"""
from __future__ import annotations

import contextlib
import os
import time
from pretrain_cli.run_config import ParallelConfig

_KEY = "pretrain_cli"
_WATCHER = None  # pid of this rank's watcher process (start)


def start(parallel: ParallelConfig, grace: float = 15.0) -> None:
    """Name a dead peer in this rank's log, and stop this rank if the launcher does not.

    When a rank dies, gloo aborts the others from C++ (`terminate called ... Connection reset by peer`)
    with no word on who died. Each rank publishes `host:pid` in the launcher's TCP store; a forked
    watcher process (no Paddle, inherited descriptors closed so it keeps no socket alive) polls the
    peers on this host every 0.1 s and writes `rank R: rank K (pid P) died` to this rank's
    stderr (workerlog.N) as soon as one is gone, and kills this rank right then (`_watch`), so the job ends and
    gloo's abort traceback does not follow the one line.
    """
    if parallel.world_size <= 1:
        return
    import socket
    import sys

    from paddle.base import core

    store = core.create_or_get_global_tcp_store()
    host = socket.gethostname()
    store.set(f"{_KEY}/peer/{parallel.rank}", f"{host}:{os.getpid()}".encode())
    peers = {}
    for r in range(parallel.world_size):
        if r != parallel.rank:
            h, pid = bytes(store.get(f"{_KEY}/peer/{r}")).decode().rsplit(":", 1)
            if h == host:
                peers[r] = int(pid)
    if not peers:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    parent = os.getpid()
    child = os.fork()
    if child != 0:
        global _WATCHER
        _WATCHER = child
        return
    try:  # the watcher: plain os calls only
        os.setsid()  # its own session: a launcher tearing down the job's process group must not kill it first
        os.closerange(3, 4096)
        _watch(parallel.rank, parent, peers, grace)
    finally:
        os._exit(0)


def stop() -> None:
    """Stop this rank's watcher; every rank calls it after its last collective, before any rank may exit."""
    global _WATCHER
    if _WATCHER is None:
        return
    import signal

    with contextlib.suppress(OSError):
        os.kill(_WATCHER, signal.SIGKILL)
        os.waitpid(_WATCHER, 0)
    _WATCHER = None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"  # a zombie is dead, just not reaped yet
    except (OSError, IndexError):
        return True


def _watch(rank: int, parent: int, peers: dict, grace: float) -> None:
    """Poll the peers; at a death, name it and stop this rank at once. Left alone, gloo aborts this rank when
    its next collective fails, printing a C++ `IoException`/`TimeoutException` traceback and Paddle's
    `FatalError: Process abort signal` block after the one line that matters (twice on the console: the
    launcher repeats a failed rank's log tail). A job with a dead rank cannot go on; a restart resumes from
    the newest complete checkpoint-N (atomic.py), and a save this rank was still writing is given up.
    `grace`: how long the kill is retried."""
    import signal

    def report() -> bool:
        dead = [r for r, pid in sorted(peers.items()) if not _alive(pid)]
        if dead:
            names = ", ".join(f"rank {r} (pid {peers[r]})" for r in dead)
            os.write(2, f"\n[pretrain-cli] rank {rank}: {names} died (killed or crashed); this rank stops too. "
                        f"See that rank's workerlog for its cause; resume from the last checkpoint-N.\n".encode())
        return bool(dead)

    while os.getppid() == parent:
        if report():
            deadline = time.monotonic() + grace
            while os.getppid() == parent and time.monotonic() < deadline:
                with contextlib.suppress(OSError):
                    os.kill(parent, signal.SIGKILL)
                time.sleep(0.05)
            return
        time.sleep(0.05)
    # this rank went first (gloo aborted it the moment a peer's socket closed)
    deadline = time.monotonic() + 2.0  # the peer may still be exiting: report as soon as it is gone
    while not report() and time.monotonic() < deadline:
        time.sleep(0.05)
