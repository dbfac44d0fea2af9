"""The dead-peer watcher: one line naming the dead rank, then this rank stops at once (before gloo's abort
traceback can follow the line)."""
import subprocess
import sys

RANK = r"""
import os, subprocess, sys, time
from pretrain_cli.distributed import watchdog
peer = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
parent = os.getpid()
if os.fork() == 0:
    try:
        watchdog._watch(0, parent, {1: peer.pid}, grace=600.0)
    finally:
        os._exit(0)
time.sleep(0.3)
print(peer.pid, flush=True)
peer.kill()
peer.wait()
time.sleep(20)  # a rank stuck in a collective, or about to be aborted by gloo
print("still running", flush=True)
"""


def test_a_dead_peer_is_named_once_and_this_rank_stops_at_once():
    """Killed, and before its 20 s sleep ends: so at the death, not after the grace period (600 s here, which
    only bounds how long the kill is retried). No clock is read."""
    p = subprocess.run([sys.executable, "-c", RANK], capture_output=True, text=True, timeout=300)
    pid = p.stdout.split()[0]
    assert p.returncode == -9 and "still running" not in p.stdout
    assert p.stderr.count(f"rank 0: rank 1 (pid {pid}) died (killed or crashed)") == 1, p.stderr
