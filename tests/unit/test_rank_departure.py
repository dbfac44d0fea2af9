"""A rank that leaves alone, on purpose, with its own error (`distributed.launcher.departure`): its host's other
watchers name no death; each lets its rank end by itself (what it writes meanwhile dropped), or SIGKILLs it after
`departure.GRACE`; one line names the rank that left and its error; a "peer" record for launch.sh; the run lock its
rank held is removed when its rank ended without removing it. A "rank" here is a plain Python process with a peer
that leaves as a rank leaving alone does (`departure.note`, then its exit)."""
import json
import os
import signal

from watched_rank_child import peer_pid, run

RANK = r"""
import json
then, lock, holder = args[0], Path(args[1]), int(args[2]) or os.getpid()
# (the forked watcher's copy) 1 s where the rank stays; where it ends by itself, more than any delay of a loaded host
departure.GRACE = 1.0 if then == "stays" else 60.0
lock.write_text(json.dumps({"pid": holder, "host": "h"}))  # as run_lock's: its holder's pid
peer = watched(shared, verdicts, LEAVES)  # (its pid in a file: a line printed here reaches the log too)
watchdog.holding(lock)
departure.note(shared, 1, "rank 1: its file is missing; put it back")  # rank 1 leaves alone, with its error
peer.stdin.close()
while peer.poll() is None:
    time.sleep(0.001)
print("C++ Traceback: FatalError: Process abort signal", file=sys.stderr, flush=True)  # what gloo would add
if then == "ends":  # its collective with the rank that left failed: it ends through its `finally`, once its watcher
    wait_followed(shared)  # has taken up the departure (ended before, it was seen gone too)
    lock.unlink()
    sys.exit(1)
if then == "leaves":  # it leaves with an error of its own too, after its watcher took up rank 1's departure: its
    wait_followed(shared)  # watcher stopped first, its own line after
    watchdog.leave_alone("rank 0: lost rank 1")
    print("error: rank 0: lost rank 1", flush=True)
    sys.exit(1)
time.sleep(20)  # busy with work of its own, which nothing interrupts (or aborted by gloo: it never runs `finally`)
print("still running", flush=True)
"""


def _rank(tmp_path, then: str, lock_pid: int = 0):
    lock = tmp_path / "run.lock"
    p, out = run(tmp_path, RANK, then, str(lock), str(lock_pid))
    return p, out, tmp_path / "verdicts", lock


LEFT = "[pretrain-cli] rank 0: rank 1 (pid {} on h) left with an error: rank 1: its file is missing; put it back; " \
       "this rank stops too."


def test_a_rank_that_ends_by_itself_after_a_departure_names_no_death(tmp_path):
    p, out, verdicts, lock = _rank(tmp_path, "ends")
    peer = peer_pid(tmp_path)
    assert p.returncode == 1, out  # its own end, not its watcher's SIGKILL
    assert out.count(LEFT.format(peer)) == 1, out
    assert "died" not in out and "C++ Traceback" not in out, out  # written after the departure: dropped
    record = json.loads((verdicts / "rank-0.json").read_text())
    assert record["kind"] == "peer" and record["exit"] == 1 and LEFT.format(peer) in record["line"]
    assert not lock.exists()


def test_a_rank_that_does_not_end_is_killed_after_the_grace_and_its_lock_removed(tmp_path):
    p, out, _, lock = _rank(tmp_path, "stays")
    assert p.returncode == -signal.SIGKILL and "still running" not in out, out
    assert out.count(LEFT.format(peer_pid(tmp_path))) == 1 and "died" not in out, out
    assert not lock.exists()  # it never ran its `finally`: its watcher removed the lock it held


def test_a_lock_another_process_holds_is_left_alone(tmp_path):
    p, out, _, lock = _rank(tmp_path, "stays", lock_pid=os.getpid())
    assert p.returncode == -signal.SIGKILL, out
    assert lock.exists()  # (taken over by another run meanwhile: not this rank's to remove)


def test_a_rank_that_leaves_too_says_its_own_line_and_its_watcher_none(tmp_path):
    p, out, verdicts, _ = _rank(tmp_path, "leaves")
    assert p.returncode == 1, out
    assert "error: rank 0: lost rank 1" in out and "[pretrain-cli]" not in out and "died" not in out, out
    assert not (verdicts / "rank-0.json").exists()  # (the rank's own, through the CLI, would be its record)
