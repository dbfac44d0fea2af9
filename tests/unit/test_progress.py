"""Each rank's progress record and what the watchers decide from it: when a rank is hung (the allowance: the key,
the default of a few minutes raised to the run's own steps, start-up's longer one), which rank of several is, and
which rank is a straggler (once its median own work per step stays well above the others')."""
import threading

import pytest

from pretrain_cli.distributed.launcher import progress


def _rec(phase="collective", since=0.0, step_seconds=0.0, busy=0.0, timed=0):
    return {"step": 7, "phase": phase, "since": since, "step_seconds": step_seconds, "busy_seconds": busy,
            "timed": timed, "pid": 1}


def test_the_allowance_is_the_key_or_a_few_minutes_raised_to_the_runs_own_steps():
    assert progress.allowance("data", None, 0.0) == progress.DEFAULT == 300
    assert progress.allowance("data", None, 60.0) == 20 * 60.0  # a run of minute-long steps waits 20 steps
    assert progress.allowance("collective", 10.0, 60.0) == 10.0  # the key is the user's
    assert progress.allowance("start-up", 10.0, 0.0) == progress.START  # building and reading a checkpoint
    # a save (a checkpoint's bytes) and an evaluation (eval_iters batches) are no step: they were killed after
    # 20 steps' time while healthy; now the start-up allowance, whatever the key or the step time below it
    assert progress.allowance("save", None, 1.0) == progress.allowance("eval", 10.0, 0.0) == progress.START == 600
    assert progress.allowance("save", None, 60.0) == 20 * 60.0 and progress.allowance("eval", 900.0, 0.0) == 900.0
    assert progress.allowance("data", 0, 0.0) is None and progress.allowance("done", None, 0.0) is None


def test_the_hung_rank_is_the_stopped_one_then_the_one_not_waiting_then_the_oldest():
    now = 100.0
    records = {0: _rec("collective", since=50.0), 1: _rec("forward/backward", since=60.0), 2: _rec("collective", 89.0)}
    assert progress.hung(records, now, 10.0) == (1, 40.0)  # the others wait in a collective for it
    assert progress.hung(records, now, 10.0, stopped={2: 0.0}) == (2, 11.0)  # a stopped process is decisive
    assert progress.hung({0: _rec("collective", 50.0), 1: _rec("collective", 40.0)}, now, 10.0)[0] == 1
    assert progress.hung(records, now, 100.0) is None and progress.hung(records, now, 0) is None
    # a rank stopped after the others began to wait: not late itself yet, but the one they wait for
    waiting = {0: _rec("collective", since=85.0), 1: _rec("save", since=95.0), 2: _rec("collective", 96.0)}
    assert progress.hung(waiting, now, 10.0, stopped={1: 0.0}) == (1, 5.0)
    assert progress.hung(waiting, now, 10.0) == (1, 5.0)  # not stopped: the one not waiting in a collective


def test_a_record_reads_back_what_the_rank_marked(tmp_path):
    rec = progress.Record(tmp_path / "progress.3")
    for step in (1, 2):
        rec.mark("data", step)
        rec.mark("forward/backward", step)
        rec.mark("collective", step)
    rec.mark("data", 3)
    got = progress.read(tmp_path, [3, 4])[3]  # rank 4 has no record yet: left out
    assert list(progress.read(tmp_path, [3, 4])) == [3]
    assert got["step"] == 3 and got["phase"] == "data" and got["timed"] == 2 and got["step_seconds"] > 0
    rec.close()


def test_a_straggler_is_a_rank_whose_own_work_stays_well_above_the_others():
    full = progress.WINDOW
    records = {0: _rec(busy=1.0, timed=full), 1: _rec(busy=1.1, timed=full), 2: _rec(busy=2.0, timed=full)}
    assert [(r, round(x, 2)) for r, x in progress.stragglers(records)] == [(2, 1.90)]
    records[2]["timed"] = full - 1  # not yet a window of steps
    assert progress.stragglers(records) == []
    tiny = {0: _rec(busy=0.1, timed=full), 1: _rec(busy=0.3, timed=full)}  # 3x, but a loaded host's jitter
    assert progress.stragglers(tiny) == []


def test_a_reader_never_sees_a_half_written_or_unwritten_record(tmp_path):
    """A watcher reads records while the ranks write them. `struct.pack_into` zero-fills its target before writing
    the fields, so a read in between saw a step with `since` 0 and named a healthy rank hung "for 1.8e9 s" (a
    launched pp2 run of the suite); a record created but not written yet (zeros: phase start-up, since 0) read the
    same way. A thread marks as fast as it can while this one reads: every read is whole, and zeros are skipped."""
    import threading

    (tmp_path / "progress.5").write_bytes(bytes(progress.SIZE))  # created, truncated, not written yet
    assert progress.read(tmp_path, [5]) == {}
    rec = progress.Record(tmp_path / "progress.3")
    stop = threading.Event()

    def marking():
        step = 0
        while not stop.is_set():
            step += 1
            for phase in ("data", "forward/backward", "collective"):
                rec.mark(phase, step)

    writer = threading.Thread(target=marking)
    writer.start()
    try:
        seen = [progress.read(tmp_path, [3])[3] for _ in range(3000)]
    finally:
        stop.set()
        writer.join()
        rec.close()
    assert all(r["since"] > 1e9 and r["pid"] > 0 for r in seen), min(r["since"] for r in seen)
    assert len({r["step"] for r in seen}) > 1  # the reads did overlap the marks


def test_hang_timeouts_help_says_the_allowances_the_watchers_and_the_nodes_join_take():
    """The key's help (docs/COMPATIBILITY.md is made from it) says the numbers used here, and that the watch of the
    nodes' join (`launcher.joining`: each rank marks `allowance("start-up", hang_timeout)` there) takes it too."""
    from dataclasses import fields

    from pretrain_cli.config.training_arguments import TrainingArguments

    text = next(f for f in fields(TrainingArguments) if f.name == "hang_timeout").metadata["help"]
    assert f"Default: {progress.DEFAULT:.0f}, or {progress.STEPS} steps" in text
    assert f"at least {progress.START:.0f}" in text and f"(at least {progress.START:.0f} s; 0: no limit)" in text
    assert "start-up allowance of the nodes' join" in text and "every node ends with exit 124" in text


class _Paused:
    """A record's map whose next store by the thread `who` waits (its fields packed, not yet copied in) until `go` is
    set: the exact point where, without `Record`'s lock, the other thread's whole-record write lands in between and
    is then written back over with this thread's old copy of its field."""

    def __init__(self, real, who):
        self.real, self.who, self.paused, self.go = real, who, threading.Event(), threading.Event()

    def __setitem__(self, key, value):
        if threading.current_thread().name == self.who and not self.paused.is_set():
            self.paused.set()
            self.go.wait(10)
        self.real[key] = value

    def __getattr__(self, name):
        return getattr(self.real, name)


@pytest.mark.parametrize("first", ["mark", "write_of"])
def test_the_training_threads_marks_and_the_writers_never_write_back_each_others_old_fields(tmp_path, first):
    """The training thread marks its phase while the background writer (`async_save`) says which checkpoint it
    writes: each writes the whole record from the fields. One thread is held after it packed the record, before it
    copies it in (`_Paused`), and the other one's write is let go meanwhile: with `Record`'s lock it waits, without
    it the held thread then wrote back its old copy: a write ended still said in flight (so a later stop named
    checkpoint-6 unsaved, published long before: 2 in 3000 of a timing race without the lock), or a new mark lost
    (a phase and step of before, read as no progress since)."""
    rec = progress.Record(tmp_path / "progress.0")
    rec.mark("forward/backward", 7)
    rec.write_of(6)
    rec.map = paused = _Paused(rec.map, first)
    acts = {"mark": lambda: rec.mark("data", 8), "write_of": lambda: rec.write_of(0)}
    held = threading.Thread(target=acts[first], name=first)
    other = threading.Thread(target=acts["write_of" if first == "mark" else "mark"], name="other")
    held.start()
    assert paused.paused.wait(10)
    other.start()
    other.join(0.3)  # with the lock it waits for the held write; without, it is done and about to be written over
    paused.go.set()
    held.join(10)
    other.join(10)
    got = progress.read(tmp_path, [0])[0]
    rec.map = paused.real
    rec.close()
    assert (got["writing"], got["phase"], got["step"]) == (0, "data", 8), got
