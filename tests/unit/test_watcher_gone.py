"""A rank whose watcher is killed while it runs says so once, in its own log, and goes on (`watchdog._gone`): before,
nothing said it, and the rank's output went into a pipe nobody read. What the rank writes between the watcher's death
and the take-over waits in the pipe (the rank keeps a copy of its read end) and is copied to the log first: before,
such a write failed (EPIPE: the line lost, the print raised). A watcher its rank stops (`watchdog.stop`) is no such
loss; either way the watcher is reaped by its rank. A "rank" here is a plain Python process with a sleeping peer
(tests/unit/watched_rank_child.py)."""
import os
import signal

from watched_rank_child import start

RANK = r"""
import threading
peer = watched(shared, verdicts, SLEEPS)
own = watchdog._WATCHER[0]
watchdog._LOCK.acquire()  # the take-over (`_gone`) waits for it: the rank writes while its watcher is dead, untaken
print("watcher", own, flush=True)
while not Path(args[0]).exists():  # the test kills the watcher (or not), then says go on
    time.sleep(0.01)
if args[1] == "killed":
    while processes._stat(own)[0] != b"Z":  # dead, not reaped: its pipe has no reader but this rank's copy
        time.sleep(0.001)
for step in range(3):
    print(f"step {step}", flush=True)
watchdog._LOCK.release()
if args[1] == "killed":  # until the take-over is done (its thread ends): the output goes to the log directly now
    [t.join() for t in threading.enumerate() if t.name == "watcher-watch"]
print("after", flush=True)
watchdog.stop()
try:
    print("watcher left:", os.waitpid(own, os.WNOHANG), flush=True)
except ChildProcessError:
    print("watcher reaped", flush=True)
print("done", flush=True)
peer.kill()
"""
WARNING = "[pretrain-cli] rank 0: its watcher (pid {}) ended: killed by SIGKILL; training goes on unwatched"


def _rank(tmp_path, kill: bool):
    go = tmp_path / "go"
    p = start(tmp_path, RANK, str(go), "killed" if kill else "kept")
    first = p.stdout.readline()
    assert first.startswith("watcher "), first
    pid = int(first.split()[1])
    if kill:
        os.kill(pid, signal.SIGKILL)
    go.write_text("")
    out = p.stdout.read()
    p.wait(timeout=60)
    return p.returncode, out, pid


def test_a_killed_watcher_is_said_once_by_its_rank_which_goes_on_to_exit_0(tmp_path):
    code, out, pid = _rank(tmp_path, kill=True)
    assert code == 0, out
    assert out.count(WARNING.format(pid)) == 1, out
    # written while the watcher was dead (kept in the pipe, copied first), then to the log directly; the rank ends
    assert out.startswith("step 0\nstep 1\nstep 2\n") and out.index("step 2") < out.index(WARNING.format(pid)), out
    assert out.endswith("after\nwatcher reaped\ndone\n"), out


def test_a_watcher_its_rank_stops_is_no_loss_and_is_reaped(tmp_path):
    code, out, _ = _rank(tmp_path, kill=False)
    assert code == 0 and out == "step 0\nstep 1\nstep 2\nafter\nwatcher reaped\ndone\n", out
