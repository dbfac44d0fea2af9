"""A rank whose watcher is killed while it runs says so once, in its own log, and goes on (`watchdog._gone`), its
output going to the log directly from then on, not into a pipe nobody reads. What the rank writes between the
watcher's death and the take-over waits in the pipe (the rank keeps a copy of its read end, so the write cannot fail
with EPIPE) and is copied to the log first. A watcher its rank stops (`watchdog.stop`) is no such loss; either way
the watcher is reaped by its rank. A "rank" here is a plain Python process with a sleeping peer
(tests/unit/watched_rank_child.py)."""
import os
import signal

from watched_rank_child import communicate, end, start

RANK = r"""
import threading
peer = watched(shared, verdicts, SLEEPS)
own = watchdog._WATCHER[0]
if args[1] == "stopped dead":  # no take-over: `stop` finds the watcher dead
    watchdog._gone = lambda child: None
watchdog._LOCK.acquire()  # the take-over (`_gone`) waits for it: the rank writes while its watcher is dead, untaken
import fcntl
print("watcher", own, fcntl.fcntl(1, fcntl.F_GETPIPE_SZ), flush=True)
while not Path(args[0]).exists():  # the test kills the watcher (or not), then says go on
    time.sleep(0.01)
if args[1] != "kept":
    while processes._stat(own)[0] != b"Z":  # dead, not reaped: its pipe has no reader but this rank's copy
        time.sleep(0.001)
for step in range(3):
    print(f"step {step}", flush=True)
if args[1] == "flooded":  # a writer (GIL released) that fills the pipe and waits on it, 3 MiB in all
    import array, termios
    writer = threading.Thread(target=os.write, args=(1, b"x" * (3 << 20) + b"\n"))
    writer.start()
    held = array.array("i", [0])
    # until the pipe is full (within a page: the steps' lines take a page of their own): the writer waits
    while held[0] < fcntl.fcntl(1, fcntl.F_GETPIPE_SZ) - 4096:
        fcntl.ioctl(watchdog._WATCHER[5], termios.FIONREAD, held)
        time.sleep(0.001)
watchdog._LOCK.release()
if args[1] in ("killed", "flooded"):  # until the take-over is done (its thread ends): the output goes to the log
    [t.join() for t in threading.enumerate() if t.name == "watcher-watch"]
if args[1] == "flooded":
    writer.join()
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


def _rank(tmp_path, mode: str):
    """The rank's exit code, all it wrote, its watcher's pid and its pipe's size: the watcher `mode` "kept", or
    SIGKILLed and then "killed" (taken over), "flooded" (taken over while a write waits on the full pipe), "stopped
    dead" (no take-over: the rank's `stop` finds it dead)."""
    go = tmp_path / "go"
    p = start(tmp_path, RANK, str(go), mode)
    first = p.stdout.readline()
    if not first.startswith("watcher "):
        end(tmp_path, p)  # (its peer and watcher too)
        raise AssertionError(first)
    pid, size = map(int, first.split()[1:])
    if mode != "kept":
        os.kill(pid, signal.SIGKILL)
    go.write_text("")
    out = communicate(tmp_path, p)
    return p.returncode, out, pid, size


def test_a_killed_watcher_is_said_once_by_its_rank_which_goes_on_to_exit_0(tmp_path):
    code, out, pid, _ = _rank(tmp_path, "killed")
    assert code == 0, out
    assert out.count(WARNING.format(pid)) == 1, out
    # written while the watcher was dead (kept in the pipe, copied first), then to the log directly; the rank ends
    assert out.startswith("step 0\nstep 1\nstep 2\n") and out.index("step 2") < out.index(WARNING.format(pid)), out
    assert out.endswith("after\nwatcher reaped\ndone\n"), out


def test_a_watcher_its_rank_stops_is_no_loss_and_is_reaped(tmp_path):
    code, out, _, _ = _rank(tmp_path, "kept")
    assert code == 0 and out == "step 0\nstep 1\nstep 2\nafter\nwatcher reaped\ndone\n", out


def test_a_write_waiting_on_the_full_pipe_at_the_take_over_reaches_the_log_whole(tmp_path):
    """The pipe is as large as the system allows (`watchdog._widen`), and the take-over reads it until it is empty
    (`watchdog._drain`): the write waiting on it goes on and ends there, nothing lost (EPIPE) at the pipe's close."""
    code, out, pid, size = _rank(tmp_path, "flooded")
    assert size == min(1 << 20, int(open("/proc/sys/fs/pipe-max-size").read()))
    assert code == 0, out[-500:]
    assert out.startswith("step 0\nstep 1\nstep 2\n" + "x" * (3 << 20) + "\n"), out[:100]
    assert out.count(WARNING.format(pid)) == 1 and out.endswith("after\nwatcher reaped\ndone\n"), out[-500:]


def test_a_watcher_found_dead_by_stop_leaves_what_its_pipe_holds_to_the_log(tmp_path):
    code, out, _, _ = _rank(tmp_path, "stopped dead")
    assert code == 0 and out == "step 0\nstep 1\nstep 2\nafter\nwatcher reaped\ndone\n", out
