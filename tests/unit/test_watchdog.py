"""The rank watcher: the rank that died is the one named, by itself and by its survivors, in one line with its
pid, host and signal; what a survivor writes after the death (gloo's abort) never reaches its log; the dead
rank's own end is recorded for launch.sh. A "rank" here is a plain Python process with a sleeping peer."""
import json
import os
import signal
import subprocess
import sys

from pretrain_cli.distributed.launcher import verdict_line, watchdog, watcher

RANK = r"""
import os, subprocess, sys, time
from pathlib import Path
from pretrain_cli import processes
from pretrain_cli.distributed.launcher import watchdog, watcher
peer = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL)
shared, verdicts = Path(sys.argv[1]), Path(sys.argv[2])
watchdog._spawn(watcher.Watcher(0, {0: os.getpid(), 1: peer.pid}, "h", shared, verdicts, grace=5.0))
print("before", peer.pid, flush=True)
if sys.argv[3] == "peer":
    time.sleep(0.3)
    peer.kill()  # not reaped at once, as the launcher reaps only once a second
    while processes.alive(peer.pid):  # gloo reacts once the peer's sockets close, as it exits
        time.sleep(0.001)
    print("C++ Traceback: FatalError: Process abort signal", file=sys.stderr, flush=True)  # what gloo would add
time.sleep(20)  # a rank stuck in a collective (or waiting to be killed by the test)
print("still running", flush=True)
"""


def _rank(tmp_path, who: str):
    shared, verdicts = tmp_path / "shared", tmp_path / "verdicts"
    shared.mkdir()
    verdicts.mkdir()
    p = subprocess.Popen([sys.executable, "-c", RANK, str(shared), str(verdicts), who], stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
    return p, verdicts


def test_a_survivor_names_the_dead_peer_once_and_nothing_after_it(tmp_path):
    p, verdicts = _rank(tmp_path, "peer")
    out, _ = p.communicate(timeout=60)
    peer = out.split()[1]
    assert p.returncode == -signal.SIGKILL and "still running" not in out
    assert out.count(f"[pretrain-cli] rank 0: rank 1 (pid {peer} on h) died: killed by SIGKILL; this rank stops") == 1, out
    assert "C++ Traceback" not in out and "FatalError" not in out, out  # written after the death: dropped
    # a survivor's end is not its own verdict: a "peer" record, which launch.sh reports only when no rank of its
    # node failed on its own (its node's rank was stopped by another node's failure)
    record = json.loads((verdicts / "rank-0.json").read_text())
    assert record["kind"] == "peer" and record["exit"] == 1 and f"rank 1 (pid {peer} on h) died" in record["line"]


def test_the_dead_rank_names_itself_and_records_its_end(tmp_path):
    p, verdicts = _rank(tmp_path, "self")
    line = p.stdout.readline()
    assert line.startswith("before"), line
    os.kill(p.pid, signal.SIGKILL)
    out = p.stdout.read()  # until the watcher, which holds the log, is done
    p.wait(timeout=30)
    assert out.count(f"[pretrain-cli] rank 0 (pid {p.pid} on h) died: killed by SIGKILL; the other ranks stop") == 1, out
    assert "rank 1 (pid" not in out
    record = json.loads((verdicts / "rank-0.json").read_text())
    assert record["exit"] == 137 and record["kind"] == "died"


def _watcher(tmp_path, gone, statuses=None, outlived=()):
    shared = tmp_path / "shared"
    shared.mkdir(parents=True, exist_ok=True)
    for r in outlived:
        (shared / f"outlived.{r}").write_text("x")
    w = watcher.Watcher(0, {0: 10, 1: 11}, "h", shared, None, grace=1.0)
    w.evidence.statuses = dict(statuses or {})
    w.evidence.gone = lambda: set(gone)  # noqa: E731
    return w


def test_the_cause_is_the_rank_nobody_saw_alive_after_another_death(tmp_path):
    # rank 0 killed; rank 1 was seen alive after that, then stopped: rank 0 alone is the cause
    assert _watcher(tmp_path, {0, 1}, {0: 9, 1: 9}, outlived=[1]).evidence.causes() == [0]


def test_without_sightings_gloos_abort_is_the_consequence(tmp_path):
    # both gone before any watcher looked: the rank aborted by SIGABRT followed the one killed by SIGKILL
    assert _watcher(tmp_path, {0, 1}, {0: signal.SIGABRT, 1: signal.SIGKILL}).evidence.causes() == [1]
    # nothing tells them apart: both are named
    assert _watcher(tmp_path, {0, 1}).evidence.causes() == [0, 1]


def test_a_job_of_one_process_needs_no_watcher(monkeypatch):
    class P:
        world_size, rank = 1, 0

    watchdog.start(P())  # returns before touching Paddle's store
    assert watchdog._WATCHER is None


def test_a_usage_error_is_not_answered_with_resume(tmp_path):
    w = _watcher(tmp_path, {1}, {1: 2 << 8})
    assert w.evidence.causes() == [1]
    line = verdict_line.line(w, w.evidence.death_cause())
    assert "rank 0: rank 1 (pid 11 on h) died: exited with code 2" in line and "for its error." in line
    assert "resume" not in line
    killed = _watcher(tmp_path, {1}, {1: signal.SIGKILL})
    killed = verdict_line.line(killed, killed.evidence.death_cause())
    assert "killed by SIGKILL" in killed and "resume from the newest complete checkpoint of output_dir" in killed


HANG = r"""
import os, signal, subprocess, sys, time
from pathlib import Path
from pretrain_cli.distributed.launcher import progress, watchdog, watcher
peer = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL)
shared, verdicts, who = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
other = progress.Record(shared / "progress.1")  # the peer's record, as its own marks would leave it
progress.open_record(shared / "progress.0")
stuck, waiting = (other, progress._CURRENT) if who == "peer" else (progress._CURRENT, other)
stuck.mark("data", 3)
stuck.mark("forward/backward", 3)  # ... and never another mark
time.sleep(0.2)
waiting.mark("data", 3)
waiting.mark("forward/backward", 3)
waiting.mark("collective", 3)  # waits there for the stuck one
if who == "peer":
    os.kill(peer.pid, signal.SIGSTOP)
watchdog._spawn(watcher.Watcher(0, {0: os.getpid(), 1: peer.pid}, "h", shared, verdicts, grace=5.0,
                                hang_timeout=1.0))
print("before", peer.pid, flush=True)
if who == "self":
    os.kill(os.getpid(), signal.SIGSTOP)  # as `kill -STOP` of this rank
time.sleep(20)
print("still running", flush=True)
"""


def test_a_rank_without_progress_is_named_and_killed_even_when_stopped(tmp_path):
    """`kill -STOP` of a rank: after hang_timeout its watcher and its peers' name it, its phase and step, kill their
    own ranks (SIGKILL reaches a stopped process), and the stuck rank's watcher records exit 124 for launch.sh."""
    for who in ("peer", "self"):
        shared, verdicts = tmp_path / who / "shared", tmp_path / who / "verdicts"
        shared.mkdir(parents=True)
        verdicts.mkdir()
        p = subprocess.Popen([sys.executable, "-c", HANG, str(shared), str(verdicts), who], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
        out = p.stdout.read()  # until the watcher, which holds the log, is done
        p.wait(timeout=30)
        peer = int(out.split()[1])
        os.kill(peer, signal.SIGKILL)
        assert p.returncode == -signal.SIGKILL and "still running" not in out, out
        if who == "peer":
            assert out.count(f"[pretrain-cli] rank 0: rank 1 (pid {peer} on h) made no progress for ") == 1, out
            assert " s while in forward/backward at step 3; this rank stops too." in out, out
            assert json.loads((verdicts / "rank-0.json").read_text())["kind"] == "peer"
        else:
            assert out.count(f"[pretrain-cli] rank 0 (pid {p.pid} on h) made no progress for ") == 1, out
            assert " s while in forward/backward at step 3; the other ranks stop too." in out, out
            record = json.loads((verdicts / "rank-0.json").read_text())
            assert record["exit"] == watcher.HUNG == 124 and record["kind"] == "hung"
        assert not list(verdicts.glob("watcher-*"))  # launch.sh waited for this watcher: it has left


def test_gloos_abort_after_a_hang_names_the_rank_that_hung(tmp_path):
    """With the default hang_timeout gloo's own 30 s timeout comes first and aborts the waiting rank (SIGABRT): the
    cause is the live rank whose last mark is older than the aborted one's, not the aborted rank."""
    from pretrain_cli.distributed.launcher import progress

    w = _watcher(tmp_path, {0}, {0: signal.SIGABRT})
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    w.ranks[1] = sleeper.pid
    try:
        stuck, aborted = progress.Record(w.shared / "progress.1"), progress.Record(w.shared / "progress.0")
        stuck.mark("forward/backward", 5)
        aborted.mark("collective", 5)
        assert w.evidence.death_cause()["kind"] == "died"  # idle for a moment only: a rank still computing, not hung
        stuck.since -= progress.WAITED + 1  # ... idle since before gloo's timeout began
        stuck._write()
        cause = w.evidence.death_cause()
    finally:
        sleeper.kill()
        sleeper.wait()
    assert cause["kind"] == "hung" and cause["ranks"] == [1] and cause["phase"] == "forward/backward"
    assert (f"rank 0: rank 1 (pid {sleeper.pid} on h) made no progress for 21 s while in forward/backward at step 5"
            in verdict_line.line(w, cause))
    # a rank killed (SIGKILL) while the others wait for it in a collective: their marks are newer, it is the cause
    killed = _watcher(tmp_path / "k", {0}, {0: signal.SIGKILL})
    progress.Record(killed.shared / "progress.0").mark("forward/backward", 5)
    progress.Record(killed.shared / "progress.1").mark("collective", 5)
    assert killed.evidence.death_cause() == {"kind": "died", "ranks": [0], "statuses": [signal.SIGKILL]}


def test_the_first_verdict_published_is_the_one_every_watcher_writes(tmp_path):
    first, second = _watcher(tmp_path, {0}, {0: signal.SIGKILL}), _watcher(tmp_path, {0, 1})
    assert first.evidence.publish(first.evidence.death_cause())["ranks"] == [0]
    assert second.evidence.publish(second.evidence.death_cause())["ranks"] == [0]  # its own reading ([0, 1]) does not stand
    assert second.evidence.decided() == first.evidence.decided()


def test_a_rank_that_exits_wakes_its_watchers_while_its_exit_status_can_still_be_read():
    """The pidfd of `exit_fds` turns readable at the exit itself, not at the next poll: the watcher reads the status
    from /proc before Paddle's launcher reaps the process (it polls once a second, so a 50 ms poll alone could
    miss the zombie and name the death 'exit status unknown')."""
    import select

    from pretrain_cli import processes

    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        fds = watcher.exit_fds({0: proc.pid})
        assert list(fds.values()) == [0]
        (fd,) = fds
        assert not select.select([fd], [], [], 0.05)[0]  # running: not readable
        os.kill(proc.pid, signal.SIGKILL)
        assert select.select([fd], [], [], 10)[0]  # the exit wakes it
        assert processes.describe_status(processes.exit_status(proc.pid)) == "killed by SIGKILL"  # not reaped yet
        os.close(fd)
    finally:
        proc.kill()
        proc.wait()


def test_the_dead_ranks_status_is_read_before_the_slow_shares(tmp_path, monkeypatch):
    """At a death the watcher reads the dead rank's exit status from /proc before it writes anything: each share is an
    fsync'd write, and under load a few of them (plus stopping its own rank) outlast Paddle's launcher's one-second
    reaping, after which the status is gone ('exit status unknown')."""
    from pretrain_cli.distributed.launcher.verdict import Evidence

    dead = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        dead.kill()
        while watcher.processes.exit_status(dead.pid) is None:  # a zombie: not reaped (this test is its parent)
            pass
        evidence = Evidence(0, {0: dead.pid, 1: alive.pid}, tmp_path)
        seen = []
        monkeypatch.setattr(Evidence, "share", lambda self, name, text: seen.append((name, dict(self.statuses))))
        evidence.observe({0}, wait=False)
        assert seen[0] == ("outlived.1", {0: signal.SIGKILL})  # the status first, then who outlived the death
        assert ("status.0", {0: signal.SIGKILL}) in seen
    finally:
        for p in (dead, alive):
            p.kill()
            p.wait()


def test_a_survivors_line_is_in_its_log_before_the_survivor_exits(tmp_path):
    """A survivor of a death is held (SIGSTOP) until its watcher's line is written and only then killed: Paddle's
    launcher ends once its ranks have exited, and whatever ends the job with it kills the watchers too. So what the
    log holds at the moment the survivor is reaped names the dead peer already."""
    import select

    p, _ = _rank(tmp_path, "peer")
    p.wait(timeout=60)  # reaped: the launcher could end now
    log = p.stdout.fileno()
    before = b""
    while select.select([log], [], [], 0)[0]:  # what the log held then, without waiting for the watcher's end
        chunk = os.read(log, 1 << 16)
        if not chunk:
            break
        before += chunk
    peer = before.split()[1].decode()
    assert p.returncode == -signal.SIGKILL
    assert f"[pretrain-cli] rank 0: rank 1 (pid {peer} on h) died: killed by SIGKILL" in before.decode(), before


def test_a_rank_held_by_its_watcher_is_not_taken_for_a_stopped_one(tmp_path):
    """`kill -STOP` of a rank is a hang's evidence (`stopped.R`); its watcher's hold of a survivor (`held.R`, shared
    before its SIGSTOP) is not, or a survivor whose last mark is older than the dead rank's would be named hung."""
    from pretrain_cli.distributed.launcher.verdict import Evidence

    dead = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    stopped = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        dead.kill()
        dead.wait()
        os.kill(stopped.pid, signal.SIGSTOP)
        while not watcher.processes.stopped(stopped.pid):
            pass
        for held in (False, True):
            shared = tmp_path / str(held)
            shared.mkdir()
            if held:
                (shared / "held.1").write_text("")
            evidence = Evidence(0, {0: dead.pid, 1: stopped.pid}, shared)
            evidence.mark({0})
            assert (shared / "outlived.1").exists()
            assert (shared / "stopped.1").exists() is not held
            assert evidence.stopped_now(1) is not held
    finally:
        for p in (dead, stopped):
            p.kill()
            p.wait()
