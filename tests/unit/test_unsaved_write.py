"""A rank stopped, killed or hung while its background writer (`async_save`) writes checkpoint-N: the watchers' line
names the checkpoint the stop leaves unsaved, not only the training thread's phase. Before, the line said `made no
progress for 10 s while in forward/backward at step 7` and nothing of checkpoint-6, whose `stalled 0.01 s (async)`
line read as saved, and the re-run resumed from checkpoint-3 unexplained (tests/distributed/test_async_save_stop.py:
the same through scripts/launch.sh). A "rank" here is this process; its records are written by the test."""
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from pretrain_cli import processes
from pretrain_cli.distributed.launcher import progress, unsaved, verdict_line, watcher
from pretrain_cli.training import async_save


@pytest.fixture
def stopped():
    """The host's two ranks as the watchers leave them before the line (`unsaved.settle`): processes stopped (a
    watcher's hold, SIGSTOP), so none can publish a write any more. {rank: pid}"""
    children = [subprocess.Popen(["sleep", "120"]) for _ in range(2)]
    for child in children:
        os.kill(child.pid, signal.SIGSTOP)
    while not all(processes.stopped(c.pid, traced=False) for c in children):
        time.sleep(0.01)
    yield {r: c.pid for r, c in enumerate(children)}
    for child in children:
        child.kill()
        child.wait()


def _watcher(tmp_path, output_dir=None, ranks=None, **kw):
    shared = tmp_path / "shared"
    shared.mkdir(parents=True, exist_ok=True)
    return watcher.Watcher(0, ranks or {0: os.getpid(), 1: os.getpid()}, "h", shared, None, grace=1.0,
                           output_dir=str(output_dir) if output_dir else None, **kw)


def _records(w, writing: dict, stuck_phase: str = "forward/backward"):
    """Rank 1 stuck in `stuck_phase` of step 7 for 30 s, rank 0 waiting for it in a collective; `writing`: {rank:
    the checkpoint its background write writes}."""
    recs = {r: progress.Record(w.shared / f"progress.{r}") for r in (0, 1)}
    recs[1].mark(stuck_phase, 7)
    recs[0].mark("collective", 7)
    recs[1].since -= 30
    for r, rec in recs.items():
        rec.write_of(writing.get(r, 0))  # (writes the record, the older mark too)
    return recs


def test_a_hung_rank_is_named_with_the_checkpoint_its_background_write_leaves_unsaved(tmp_path, stopped):
    out = tmp_path / "out"
    (out / "checkpoint-3").mkdir(parents=True)
    w = _watcher(tmp_path, out, stopped, hang_timeout=10.0)
    _records(w, {1: 6, 0: 6})  # rank 0's write of checkpoint-6 waits for rank 1's part
    cause = w._check_progress(os.open(os.devnull, os.O_WRONLY))
    assert cause["kind"] == "hung" and cause["ranks"] == [1] and cause["writing"] == {"0": 6, "1": 6}
    line = verdict_line.line(w, cause)
    assert ("rank 0: rank 1 (pid %d on h) made no progress for 30 s while in forward/backward at step 7, with its "
            "background write of checkpoint-6 unfinished: checkpoint-6 was not saved; this rank stops too. See that "
            "rank's workerlog for its cause; re-run to resume from %s, the newest complete checkpoint."
            % (stopped[1], out / "checkpoint-3")) in line, line
    # the verdict is shared as JSON (every watcher of the host writes the one published): the same line from it
    assert verdict_line.line(w, w.evidence.decided()) == line


def test_only_another_ranks_write_in_flight_is_said_cut_short(tmp_path, stopped):
    w = _watcher(tmp_path, tmp_path / "out", stopped, hang_timeout=10.0)
    _records(w, {0: 6})  # rank 1 hung in a step with nothing in flight; rank 0 still writes checkpoint-6
    line = verdict_line.line(w, w._check_progress(os.open(os.devnull, os.O_WRONLY)))
    assert ("while in forward/backward at step 7; the background write of checkpoint-6 (rank 0) was cut short: "
            "checkpoint-6 was not saved; this rank stops too.") in line, line


def test_nothing_is_said_of_a_write_published_meanwhile_nor_when_none_was_in_flight(tmp_path):
    out = tmp_path / "out"
    (out / "checkpoint-6").mkdir(parents=True)  # rank 0 published it before the line was written
    w = _watcher(tmp_path / "a", out, hang_timeout=10.0)
    _records(w, {1: 6})
    cause = w._check_progress(os.open(os.devnull, os.O_WRONLY))
    assert " at step 7; this rank stops too." in verdict_line.line(w, cause)
    idle = _watcher(tmp_path / "b", out, hang_timeout=10.0)
    _records(idle, {})
    cause = idle._check_progress(os.open(os.devnull, os.O_WRONLY))
    assert "writing" not in cause and " at step 7; this rank stops too." in verdict_line.line(idle, cause)


_RANK_0 = """
import os, signal, sys, time
peer, out, publishes = int(sys.argv[1]), sys.argv[2], sys.argv[3] == "1"
def dead(pid):
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] in "ZX"
    except OSError:
        return True
open(os.path.join(out, "ready"), "w").close()
while not dead(peer):
    time.sleep(0.01)
time.sleep(0.2)  # (its watcher has not seen the death yet)
if publishes:
    os.mkdir(os.path.join(out, "checkpoint-6"))
os.kill(os.getpid(), signal.SIGSTOP)  # held by its watcher
"""


@pytest.mark.parametrize("publishes", [True, False], ids=["published-meanwhile", "never-published"])
def test_the_line_waits_for_the_hosts_ranks_to_stop_before_it_says_a_write_is_lost(tmp_path, monkeypatch,
                                                                                    publishes):
    """Rank 1 hung, rank 0's background write of checkpoint-6 in flight (its publish: rank 1's part is in). Each
    watcher kills only its own rank, so rank 1's watcher wrote its line before rank 0 was stopped, and rank 0 could
    publish checkpoint-6 in that gap: the line said `checkpoint-6 (rank 0) was cut short: checkpoint-6 was not saved;
    ... resume from out/checkpoint-3` of a run whose re-run resumed from checkpoint-6. Now the line waits until the
    host's ranks are dead or stopped (`unsaved.settle`), then looks: rank 0 here publishes 0.2 s after rank 1's death,
    then is stopped (as its watcher holds it)."""
    monkeypatch.setattr(unsaved, "WAIT", 30.0)  # (a loaded machine: the wait ends as rank 0 stops)
    out = tmp_path / "out"
    (out / "checkpoint-3").mkdir(parents=True)
    hung = subprocess.Popen(["sleep", "120"])
    rank0 = subprocess.Popen([sys.executable, "-c", _RANK_0, str(hung.pid), str(out), "1" if publishes else "0"])
    try:
        while not (out / "ready").exists():  # (its interpreter started: it sees the death from now on)
            assert rank0.poll() is None
            time.sleep(0.01)
        shared = tmp_path / "shared"
        shared.mkdir()
        w = watcher.Watcher(1, {0: rank0.pid, 1: hung.pid}, "h", shared, None, grace=5.0, output_dir=str(out))
        log = os.open(tmp_path / "workerlog.1", os.O_WRONLY | os.O_CREAT)
        w._end({"kind": "hung", "ranks": [1], "statuses": [None], "seconds": 30.0, "phase": "forward/backward",
                "step": 7, "writing": {"0": 6}}, [], None, log)
        os.close(log)
        line = (tmp_path / "workerlog.1").read_text()
    finally:
        for child in (hung, rank0):
            child.kill()
            child.wait()
    said = f"rank 1 (pid {hung.pid} on h) made no progress for 30 s while in forward/backward at step 7"
    if publishes:
        assert (f"{said}; the other ranks stop too. Re-run the same command (or launch with MAX_RESTART) to resume "
                f"from {out / 'checkpoint-6'}, the newest complete checkpoint.") in line, line
    else:
        assert (f"{said}; the background write of checkpoint-6 (rank 0) was cut short: checkpoint-6 was not saved; "
                f"the other ranks stop too. Re-run the same command (or launch with MAX_RESTART) to resume from "
                f"{out / 'checkpoint-3'}, the newest complete checkpoint.") in line, line


def test_a_write_that_may_still_be_published_is_said_unpublished_not_lost(tmp_path, stopped):
    """Said "not saved" only once nothing can publish it: a rank of the host still running when the line is written
    (`unsaved.WAIT` s after the stop), or rank 0 on another host with every part of this host's ranks written, may
    still publish it, and the line then says what it saw, not that it was lost (the old line: `checkpoint-6 was not
    saved`, of a checkpoint the re-run may resume from)."""
    out = tmp_path / "out"
    w = _watcher(tmp_path, out, hang_timeout=10.0)  # its ranks: this process, running
    _records(w, {1: 6, 0: 6})
    assert ("while in forward/backward at step 7, with its background write of checkpoint-6 under way: checkpoint-6 "
            "was not published when this line was written (rank 0 may still publish it); this rank stops too."
            ) in verdict_line.line(w, w._check_progress(os.open(os.devnull, os.O_WRONLY)))
    peer = _watcher(tmp_path / "b", out, hang_timeout=10.0)
    _records(peer, {0: 6})
    assert ("at step 7; the background write of checkpoint-6 (rank 0) was under way: checkpoint-6 was not published "
            "when this line was written (rank 0 may still publish it); this rank stops too."
            ) in verdict_line.line(peer, peer._check_progress(os.open(os.devnull, os.O_WRONLY)))
    # rank 0 elsewhere: lost for good only while a rank here lacks its part (a death notice is none)
    host = {1: stopped[1]}
    assert unsaved.clause({"1": 6}, [1], out, host) == ", with its background write of checkpoint-6 unfinished: " \
        "checkpoint-6 was not saved"
    part = out / "checkpoint-6.tmp" / unsaved.PART.format(1)
    part.parent.mkdir(parents=True)
    part.write_text('{"rank": 1, "files": {}, "pieces": []}')
    assert unsaved.clause({"1": 6}, [1], out, host) == ", with its background write of checkpoint-6 under way: " \
        "checkpoint-6 was not published when this line was written (rank 0 may still publish it)"
    part.write_text('{"rank": 1, "lost": "rank 1 (pid 5 on h) died: killed by SIGKILL"}')
    assert unsaved.clause({"1": 6}, [1], out, host).endswith("unfinished: checkpoint-6 was not saved")


def test_the_rerun_advice_beside_a_write_that_may_still_be_published_names_both_checkpoints(tmp_path):
    """Where rank 0 may still publish checkpoint-6, the re-run resumes from it if it does, from checkpoint-3 if not:
    the advice says so (`unsaved.resume_advice`). It said "re-run to resume from out/checkpoint-3, the newest
    complete checkpoint" on the same line as "rank 0 may still publish it", wrong if rank 0 does. Where the re-run's
    start does not hang on it (resume_from_checkpoint, overwrite_output_dir) the advice is as before."""
    out = tmp_path / "out"
    (out / "checkpoint-3").mkdir(parents=True)
    w = _watcher(tmp_path, out, hang_timeout=10.0)  # its ranks: this process, running
    _records(w, {0: 6})
    cause = w._check_progress(os.open(os.devnull, os.O_WRONLY))
    both = (f"it resumes from the newest complete checkpoint ({out / 'checkpoint-6'} if rank 0 publishes it, else "
            f"{out / 'checkpoint-3'})")
    line = verdict_line.line(w, cause)
    assert "(rank 0 may still publish it); this rank stops too. See that rank's workerlog for its cause; re-run the " \
        f"same command: {both}." in line and "the newest complete checkpoint." not in line, line
    line = verdict_line.line(w, {**cause, "ranks": [1]}, own=True)
    assert f"the other ranks stop too. Re-run the same command (or launch with MAX_RESTART): {both}." in line, line
    lost = verdict_line.line(w, {**cause, "kind": "lost", "statuses": [9]})
    assert f"this rank stops too. Re-run the same command (or launch with MAX_RESTART): {both}." in lost, lost
    empty = _watcher(tmp_path / "e", tmp_path / "none", hang_timeout=10.0)  # no complete checkpoint yet
    _records(empty, {0: 6})
    assert ("re-run the same command: it resumes from the newest complete checkpoint ("
            f"{tmp_path / 'none' / 'checkpoint-6'} if rank 0 publishes it, else starts from step 0: "
            f"{tmp_path / 'none'} holds no complete checkpoint).") in verdict_line.line(
        empty, empty._check_progress(os.open(os.devnull, os.O_WRONLY)))
    named = _watcher(tmp_path / "n", out, hang_timeout=10.0, resume_from=str(out / "checkpoint-3"))
    _records(named, {0: 6})
    line = verdict_line.line(named, named._check_progress(os.open(os.devnull, os.O_WRONLY)))
    assert "(rank 0 may still publish it)" in line and "if rank 0 publishes it" not in line, line
    assert unsaved.resume_advice({"0": 6}, {0: os.getpid()}, out) == both
    assert unsaved.resume_advice({"0": 6}, {0: os.getpid()}, out, True) is None  # overwrite: step 0 either way
    assert unsaved.resume_advice(None, {0: os.getpid()}, out) is None


def test_a_rank_killed_during_its_background_write_is_named_with_it_and_its_notice_says_it_once(tmp_path, stopped):
    w = _watcher(tmp_path, tmp_path / "out", stopped)
    w.evidence.statuses = {1: signal.SIGKILL}
    w.evidence.gone = lambda: {1}  # noqa: E731
    _records(w, {1: 6})
    cause = w.evidence.death_cause()
    assert cause == {"kind": "died", "ranks": [1], "statuses": [signal.SIGKILL], "writing": {"1": 6}}
    assert (f"rank 1 (pid {stopped[1]} on h) died: killed by SIGKILL, with its background write of checkpoint-6 "
            f"unfinished: checkpoint-6 was not saved; this rank stops too.") in verdict_line.line(w, cause)
    # the death notice for rank 0 (read as "..., while writing its part of checkpoint-6"): no second word of it
    owed = tmp_path / "ckpt.tmp" / "rank-00001.done.json"
    dead = watcher.Watcher(1, {0: os.getpid(), 1: os.getpid()}, "h", w.shared, None, grace=1.0)
    (w.shared / "owed.1").write_text(str(owed))
    dead._pay(verdict_line.named(dead, {**cause, "writing": None}))
    assert "background" not in owed.read_text()


def test_the_background_writer_says_in_the_record_which_checkpoint_it_writes_until_it_ends(tmp_path):
    progress.open_record(tmp_path / "progress.0")
    try:
        for fails in (False, True):
            go = threading.Event()

            def write():
                go.wait(10)
                if fails:
                    raise OSError(28, "No space left on device")

            writer = async_save.AsyncWriter()
            writer.submit("checkpoint-6", write, 6)
            seen = [progress.read(tmp_path, [0])[0]["writing"] for _ in range(50) if not go.is_set()]
            assert seen[-1] == 6, seen
            go.set()
            if fails:
                with pytest.raises(OSError):
                    writer.wait()
            else:
                writer.wait()
            assert progress.read(tmp_path, [0])[0]["writing"] == 0  # ended, published or failed: nothing in flight
    finally:
        progress.close_record()
    progress.writing(6)  # no record (one process, or its watcher stopped): nothing, no error


def test_a_long_wait_for_a_background_write_is_said_once(monkeypatch, caplog):
    monkeypatch.setattr(async_save, "NOTE_AFTER", 0.05)
    go = threading.Event()
    writer = async_save.AsyncWriter()
    writer.submit("checkpoint-6", lambda: go.wait(10), 6)
    threading.Timer(0.3, go.set).start()
    with caplog.at_level("INFO", logger="pretrain_cli"):
        writer.wait()
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and said[0].startswith("checkpoint-6: waiting for its background write (under way for "), said
    assert said[0].endswith(" s) to finish before going on"), said


def test_the_part_record_read_is_the_one_the_shard_writer_writes():
    """`unsaved.PART` copies `training.shard_writer.RECORD` (the launcher may not import training, a layer above):
    a rename of one alone would make every part read as unwritten, and a write rank 0 may still publish "not saved"."""
    from pretrain_cli.training import shard_writer

    assert unsaved.PART == shard_writer.RECORD
