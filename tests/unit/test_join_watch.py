"""A node lost after the nodes met at MASTER but before its ranks joined the process group (`distributed.launcher.
joining`): each launcher beats at MASTER's store until its ranks have joined, and its watch reads the other nodes'
beats. Here that reading on its own (no launched processes): a node that left is lost at once and says how it ends,
a silent node or a silent MASTER after SILENCE of this launcher's own reads, a node whose ranks are not all in the join
after the run's start-up allowance; the join marks it reads, and only ranks all alive inside the join are stopped;
no beat lands after leaving.
The two-node walks on this machine: tests/unit/test_joining.py."""
import json
import os
import subprocess
import sys

from pretrain_cli.distributed.launcher import job, joining, leaving

PEERS = [json.dumps({"candidate": "10.0.0.1:1", "replicas": 1, joining.NODE_KEY: "0", joining.HOST_KEY: "a",
                     joining.SERVES_KEY: True}),
         json.dumps({"candidate": "10.0.0.2:1", "replicas": 2, joining.NODE_KEY: "1", joining.HOST_KEY: "b"})]


def _watch(tmp_path, me: int) -> joining.Watch:
    return joining.Watch(None, "/job", me, joining.nodes_of(PEERS), tmp_path, "10.0.0.1:8090")


def test_a_node_that_left_is_lost_at_once_and_a_silent_one_after_silence_of_this_launchers_own_reads(tmp_path):
    w = _watch(tmp_path, 0)
    assert w.observe(w.last + 1, {"/job/pretrain_cli_alive/1": "left"}) == [(1, "left")]
    w = _watch(tmp_path, 0)
    t = w.last
    assert w.observe(t + 1, {"/job/pretrain_cli_alive/1": "1"}) == []
    assert w.observe(t + 600, {"/job/pretrain_cli_alive/1": "1"}) == []  # this launcher's own stall: CAP of it
    reads = int(joining.SILENCE / joining.CAP) - 1  # ... and these reads, CAP apart, make up the silence
    for i in range(1, reads):
        assert w.observe(t + 600 + i * joining.CAP, {"/job/pretrain_cli_alive/1": "1"}) == [], i
    t += 600 + reads * joining.CAP
    assert w.observe(t, {"/job/pretrain_cli_alive/1": "1"}) == [(1, "silent")]
    assert w.observe(t + 1, {"/job/pretrain_cli_alive/1": "2"}) == []  # it beats again
    assert w.observe(t + 10 * joining.SILENCE, {"/job/pretrain_cli_alive/1": "joined"}) == []  # through the join
    assert w.observe(t + 20 * joining.SILENCE, {}) == []


def test_masters_silence_loses_the_node_that_serves_it(tmp_path):
    w = _watch(tmp_path, 1)
    t = w.last
    for i in range(1, int(joining.SILENCE / joining.CAP) + 1):
        lost = w.observe(t + i * joining.CAP, None)
    assert lost == [(0, "master")]
    assert w.observe(t + joining.SILENCE + 60, {"/job/pretrain_cli_alive/0": "7"}) == []  # answering again


def test_only_ranks_all_alive_inside_the_join_are_stopped(tmp_path):
    w = _watch(tmp_path, 1)  # node 1: ranks 1-2
    assert w.waiting() is None  # still starting up: it may fail on its own
    (tmp_path / "joining.1").write_text(str(os.getpid()))
    assert w.waiting() is None
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (tmp_path / "joining.2").write_text(str(sleeper.pid))
        assert w.waiting() == [os.getpid(), sleeper.pid]
    finally:
        sleeper.kill()
        sleeper.wait()
    assert w.waiting() is None  # one of them died: its own failure, the launcher's to report
    for r in (1, 2):
        (tmp_path / f"joined.{r}").write_text("")
    assert w.waiting() is None and w.done
    assert w.line([(0, "master")]) == (
        "launch.sh: this node: lost node 0 (host a, 10.0.0.1; rank 0) before the ranks joined the process group: "
        "MASTER 10.0.0.1:8090, which it serves, has not answered for 30 s (killed, or its host down or unreachable); "
        "this node's ranks 1-2 stop too, exit 75 (nothing has run: a new meeting may succeed): launch.sh tries again "
        "with new ports at MASTER for RENDEZVOUS_TIMEOUT s; start that node again if it does not come back by itself")


def test_the_join_marks_it_reads(tmp_path, monkeypatch):
    monkeypatch.setenv(job.JOIN_ENV, str(tmp_path))
    monkeypatch.delenv(job.VERDICTS_ENV, raising=False)
    job.joined(3, False, 600.0)  # as distributed.setup, before the join: its pid and the run's start-up allowance
    assert (tmp_path / "joining.3").read_text() == f"{os.getpid()} 600.0"
    job.joined(4, False, None)  # hang_timeout: 0
    assert (tmp_path / "joining.4").read_text() == f"{os.getpid()} none"
    job.clear(3)  # ... and once through it
    assert (tmp_path / "joined.3").is_file()


def _beats(w, t, value, seconds, reads=None, waiting=True):
    """`reads` reads of node 1's beat `value` (a function of the read's number) over `seconds` from `t`, this node's
    ranks all in the join (`waiting`) or not; the nodes lost at the last."""
    reads = reads or int(seconds)
    for i in range(1, reads + 1):
        lost = w.observe(t + seconds * i / reads, {"/job/pretrain_cli_alive/1": value(i)}, waiting)
    return lost


def test_a_node_whose_ranks_are_not_all_in_the_join_by_the_runs_start_up_allowance_is_late(tmp_path):
    w = _watch(tmp_path, 0)  # node 0: rank 0; node 1 (ranks 1-2) beats on, its ranks still starting up
    t = w.last
    assert w.waiting() is None and w.overdue() == []  # this node's own ranks still start up: nothing to act on
    _beats(w, t, str, 3600, reads=3600, waiting=False)  # ... and the others' lateness is not counted meanwhile
    t += 3600
    (tmp_path / "joining.0").write_text(f"{os.getpid()} 20.0")  # this node's rank in the join: 20 s allowed
    assert w.waiting() == [os.getpid()] and w.allowance == 20.0 and w.overdue() == []
    _beats(w, t, str, 19)  # a counter: beating, its ranks not all in the join
    assert w.overdue() == []
    _beats(w, t + 19, lambda i: str(19 + i), 1)
    assert w.overdue() == [(1, "late")]
    assert w.line(w.overdue(), w.ending(w.overdue())) == (
        "launch.sh: this node: node 1 (host b, 10.0.0.2; ranks 1-2) has not brought its ranks to the join of the "
        "process group 20 s after this node's (a start-up stalled there, or slower than the 20 s the run allows it: "
        "hang_timeout's start-up allowance; its workerlog says where its ranks are); this node's rank 0 stops too, "
        "exit 124. Find what holds that node's ranks and re-run on every node (MAX_RESTART restarts this one)")
    w = _watch(tmp_path, 0)
    t = w.last
    w.waiting()
    _beats(w, t, lambda i: f"{i} in", 60)  # its ranks all wait in the join: not late, however long
    assert w.overdue() == []
    assert w.observe(t + 600, {"/job/pretrain_cli_alive/1": "61 in"}) == [] and w.overdue() == []
    w = _watch(tmp_path, 0)
    t = w.last
    w.waiting()
    _beats(w, t + 3600, str, 5, reads=1)  # this launcher's own stall: CAP of it
    assert w.late[1] == joining.CAP and w.overdue() == []
    (tmp_path / "joining.0").write_text(f"{os.getpid()} none")  # hang_timeout 0: no deadline
    w.waiting()
    _beats(w, t + 3605, str, 3600)
    assert w.allowance is None and w.overdue() == []


def test_a_node_that_left_says_how_it_ends_and_this_node_ends_so(tmp_path, monkeypatch):
    class Store:
        def put(self, key, value):
            self.value = value
            return True

    verdicts = tmp_path / "verdicts"
    verdicts.mkdir()
    monkeypatch.setenv(job.VERDICTS_ENV, str(verdicts))
    monkeypatch.setattr(leaving, "_ENDED", [])
    cases = [([("usage", 2)], 2, False, "left 2 stop"),
             ([("joining", 75)], 250, False, "left 75 rendezvous"),  # 250: the rank's SIGABRT
             ([], -9, False, "left 247 retry"),  # Paddle's launcher's own code: -9, a rank killed
             ([("interrupted", 130)], 130, False, "left 130 stop"),
             ([("joining", 75)], 143, True, "left 143 stop")]  # the launcher's SIGTERM: its ranks stopped in the join
    for records, code, signalled, said in cases:
        for f in verdicts.glob("*"):
            f.unlink()
        for kind, exit_code in records:  # its ranks' own ends, as launch.sh reads them
            job.record(1, exit_code, kind, "")
        leaving.note_end(code, signalled)
        w = joining.Watch(Store(), "/job", 1, joining.nodes_of(PEERS), tmp_path, "m:1")
        w.leave()
        assert w.store.value == said
    w = _watch(tmp_path, 0)
    ends = {}
    for said in ("left 2 stop", "left 75 rendezvous", "left 247 retry", "left 130 stop", "left 124 retry", "left"):
        lost = w.observe(w.last + 1, {"/job/pretrain_cli_alive/1": said})
        ends[said] = (w.ending(lost), w.line(lost).split("the process group: ", 1)[1])
    assert ends == {
        "left 2 stop": ((2, "stop"), "it left with a usage error (exit 2: its console says which); this node's rank 0 "
                                     "stops too, exit 2, not restarted: fix what that node's console names and re-run "
                                     "on every node"),
        "left 75 rendezvous": ((75, "rendezvous"), "its ranks could not join the process group (its launcher ended, "
                                                   "exit 75: its console says why); this node's rank 0 stops too, exit "
                                                   "75: launch.sh tries again with new ports, as that node's does"),
        "left 247 retry": ((1, "retry"), "it left (its launcher ended, exit 247: its console says why); this node's "
                                         "rank 0 stops too. Start that node again and re-run on every node "
                                         "(MAX_RESTART restarts this one)"),
        "left 130 stop": ((130, "stop"), "it was stopped (exit 130: Ctrl-C or SIGTERM there); this node's rank 0 stops "
                                         "too, exit 130, not restarted (that node was stopped)"),
        "left 124 retry": ((1, "retry"), "it left (its launcher ended, exit 124: its console says why); this node's "
                                         "rank 0 stops too. Start that node again and re-run on every node "
                                         "(MAX_RESTART restarts this one)"),
        "left": ((1, "retry"), "it left (its launcher ended, exit 1: its console says why); this node's rank 0 stops "
                               "too. Start that node again and re-run on every node (MAX_RESTART restarts this one)"),
    }


def test_no_beat_lands_after_leaving(tmp_path, monkeypatch):
    """The thread's beat after the launcher's `left` turned it back into a counter, which then fell silent: the other
    nodes waited SILENCE s, and named a node that had left as one killed."""
    class Store:
        values = {}

        def put(self, key, value):
            self.values[key] = value
            return True

    monkeypatch.delenv(job.VERDICTS_ENV, raising=False)
    monkeypatch.setattr(leaving, "_ENDED", [])
    w = joining.Watch(Store(), "/job", 1, joining.nodes_of(PEERS), tmp_path, "m:1")
    w.beat()
    w.leave()
    w.beat()
    assert Store.values == {"/job/pretrain_cli_alive/1": "left 1 retry"}
