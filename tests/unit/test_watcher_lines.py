"""What a rank wrote before a rank of its host left or died reaches its log, while what it writes after the loss
(gloo's abort) does not. The watcher reads the pipe, then looks at the ranks; output it holds when it sees a loss
was dropped with what followed, so a line written in the last poll (50 ms, longer on a loaded host) before a peer's
departure or death was lost. Made deterministic: the rank stops its watcher (SIGSTOP) while it writes its line, the
peer leaves or dies, and the rank writes the abort gloo would, so all of it is in the pipe when the watcher looks
again. A "rank" here is a plain Python process with a peer."""
import json
import signal

from watched_rank_child import peer_pid, run

RANK = r"""
loss, then = args
departure.GRACE = 60.0  # (the forked watcher's copy) more than any delay of a loaded host: the rank ends by itself
peer = watched(shared, verdicts, LEAVES if loss == "departure" else SLEEPS)  # (a leaving peer, or one killed first)
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
if then == "ends":  # its collective with the rank that left failed: it ends through its `finally`, once its watcher
    wait_followed(shared)  # has taken up the departure (ended before, it was seen gone too)
    sys.exit(1)
time.sleep(30)  # stuck in a collective: its watcher kills it
print("still running", flush=True)
"""


def _rank(tmp_path, loss: str, then: str):
    p, out = run(tmp_path, RANK, loss, then)
    return p, out, peer_pid(tmp_path), tmp_path / "verdicts"


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


def test_a_line_of_the_ranks_own_that_mentions_gloo_is_no_abort():
    """Only a line that starts as the reaction does (leading blanks aside), or holds gloo's own forms, ends what is
    kept: a user's line that mentions gloo (a corpus path) is kept, with every line after it."""
    from pretrain_cli.distributed.launcher.watcher import before_abort

    own = b"loading /data/gloo_corpus/part-0.bin\nstep 8: loss 2.4\nwarning: gloo process group 2 is slow\n"
    assert before_abort(own) == own
    assert before_abort(own + b"  C++ Traceback (most recent call last):\n") == own
    timeout = b"RuntimeError: [/paddle/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:80] TIMEOUT self_rank\n"
    assert before_abort(own + timeout) == own  # gloo's own error, as a rank's log showed it
    assert before_abort(own + b"ValueError: [enforce fail at gloo/allreduce.cc:105] opts.elements > 0.\n") == own
    assert before_abort(b"step 9\n  what():  [/paddle/third_party/gloo/gloo/transport/tcp/pair.cc:589] Read error\n"
                        ) == b"step 9\n"
    # gloo's source place, from a build whose path is not the wheel's: its error, not a line of the rank's own
    built = b"RuntimeError: [/src/gloo/transport/tcp/unbound_buffer.cc:80] TIMEOUT self_rank = 0\n"
    assert before_abort(own + built) == own
    assert before_abort(own + b"IoException: [/opt/gloo/gloo/common/linux.h:42] bad\n") == own
