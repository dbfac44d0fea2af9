"""What a rank wrote before a rank of its host left or died reaches its log, while what it writes after the loss
(gloo's abort) does not. The watcher reads the pipe, then looks at the ranks; output it holds when it sees a loss
was dropped with what followed, so a line written in the last poll (50 ms, longer on a loaded host) before a peer's
departure or death was lost. Made deterministic: the rank stops its watcher (SIGSTOP) while it writes its line, the
peer leaves or dies, and the rank writes the abort gloo would, so all of it is in the pipe when the watcher looks
again. A "rank" here is a plain Python process with a peer."""
import json
import signal
import subprocess
import sys

RANK = r"""
import os, signal, subprocess, sys, time
from pathlib import Path
from pretrain_cli import processes
from pretrain_cli.distributed.launcher import departure, watchdog, watcher
shared, verdicts, loss, then = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], sys.argv[4]
departure.GRACE = 60.0  # (the forked watcher's copy) more than any delay of a loaded host: the rank ends by itself
peer = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read(); sys.exit(2)"],  # (or killed first)
                        stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
watchdog._spawn(watcher.Watcher(0, {0: os.getpid(), 1: peer.pid}, "h", shared, verdicts, grace=5.0))
Path(sys.argv[1]).with_name("peer.pid").write_text(str(peer.pid))
own = watchdog._WATCHER[0]
while not (shared / "watcher.0").exists():  # its loop has begun (its pipe's ends set up: a copy of peer's stdin closed)
    time.sleep(0.001)
os.kill(own, signal.SIGSTOP)
while processes._stat(own)[0] != b"T":  # stopped: it reads nothing until it is continued
    time.sleep(0.001)
print("step 7: loss 2.5", flush=True)  # the rank's own line, just before the loss
if loss == "departure":
    departure.note(shared, 1, "rank 1: its file is missing; put it back")  # rank 1 leaves alone, with its error
    peer.stdin.close()
    while peer.poll() is None:
        time.sleep(0.001)
else:
    peer.kill()  # (not reaped: the launcher reaps once a second)
    while processes.alive(peer.pid):
        time.sleep(0.001)
if then != "leaves":  # (one that leaves stops its watcher, which then passes on all it holds: its own last words)
    print("terminate called after throwing an instance of 'gloo::IoException'", file=sys.stderr, flush=True)
    print("C++ Traceback (most recent call last):", file=sys.stderr, flush=True)
os.kill(own, signal.SIGCONT)
if then == "leaves":  # it leaves with an error of its own at once: its watcher stopped, its own line after
    watchdog.leave_alone("rank 0: lost rank 1")
    print("error: rank 0: lost rank 1", flush=True)
    sys.exit(1)
if then == "ends":  # its collective with the rank that left failed: it ends through its `finally`
    time.sleep(0.2)
    sys.exit(1)
time.sleep(30)  # stuck in a collective: its watcher kills it
print("still running", flush=True)
"""


def _rank(tmp_path, loss: str, then: str):
    shared, verdicts = tmp_path / "shared", tmp_path / "verdicts"
    shared.mkdir()
    verdicts.mkdir()
    p = subprocess.Popen([sys.executable, "-c", RANK, str(shared), str(verdicts), loss, then],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out, _ = p.communicate(timeout=60)
    return p, out, (tmp_path / "peer.pid").read_text(), verdicts


def _no_abort(out: str) -> bool:
    return "terminate called" not in out and "C++ Traceback" not in out


def test_a_line_written_just_before_a_peers_departure_reaches_the_log(tmp_path):
    p, out, peer, verdicts = _rank(tmp_path, "departure", "ends")
    assert p.returncode == 1, out  # its own end, not its watcher's SIGKILL
    assert out.count("step 7: loss 2.5\n") == 1, out
    left = f"[pretrain-cli] rank 0: rank 1 (pid {peer} on h) left with an error: rank 1: its file is missing"
    assert out.count(left) == 1 and out.index("step 7") < out.index(left), out
    assert _no_abort(out) and "died" not in out, out  # written after the departure: dropped
    assert json.loads((verdicts / "rank-0.json").read_text())["kind"] == "peer"


def test_a_rank_that_writes_a_line_and_leaves_at_once_after_a_peers_departure_keeps_it(tmp_path):
    p, out, _, verdicts = _rank(tmp_path, "departure", "leaves")
    assert p.returncode == 1, out
    assert out.count("step 7: loss 2.5\n") == 1 and "error: rank 0: lost rank 1" in out, out
    assert out.index("step 7") < out.index("error: rank 0"), out
    assert "[pretrain-cli]" not in out and "died" not in out, out  # it leaves on purpose: its own lines, no watcher's
    assert not (verdicts / "rank-0.json").exists()


def test_a_line_written_just_before_a_peers_death_reaches_the_survivors_log(tmp_path):
    p, out, peer, _ = _rank(tmp_path, "death", "stays")
    assert p.returncode == -signal.SIGKILL and "still running" not in out, out
    died = f"[pretrain-cli] rank 0: rank 1 (pid {peer} on h) died: killed by SIGKILL; this rank stops too"
    assert out.count("step 7: loss 2.5\n") == 1 and out.count(died) == 1, out
    assert out.index("step 7") < out.index(died), out
    assert _no_abort(out), out  # written after the death: dropped


def test_a_survivors_output_is_kept_up_to_its_first_line_of_the_abort():
    from pretrain_cli.distributed.launcher.watcher import before_abort

    out = b"step 7: loss 2.5\nwarning: slow disk\nterminate called after throwing an instance of 'gloo::IoEx"
    assert before_abort(out) == b"step 7: loss 2.5\nwarning: slow disk\n"
    assert before_abort(b"Traceback (most recent call last):\n  File x\n") == b""
    assert before_abort(b"step 8: loss 2.4\nstep 9: lo") == b"step 8: loss 2.4\nstep 9: lo"  # no abort: all of it
