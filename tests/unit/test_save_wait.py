"""A rank that has written its part of a synchronous save and waits for the others (rank 1 for rank 0's publish,
rank 0 for the other ranks' records) is given the save's allowance, not the plain `hang_timeout`: it marked itself
`collective` there, so a rank 25 s slower in its own write (healthy) got the rank waiting for it named "made no
progress for 10 s while in save" with `hang_timeout` 10 (300 s at the default, not the 600 s a save is promised), exit
124, the checkpoint lost, and every MAX_RESTART attempt died at the same save. A rank truly stopped while writing is
still the one named, not the one waiting for it. The records' clocks are given, not waited for."""
import pytest

from pretrain_cli.distributed.comms.comm import NoComm
from pretrain_cli.distributed.launcher import progress
from pretrain_cli.training import checkpoint, shard_writer


class Seen(Exception):
    """Ends the save where the test has seen what it looks for."""


def _own_part(tmp, rank, world, pieces):
    tmp.mkdir(parents=True, exist_ok=True)


def _waiting_phase(tmp_path, monkeypatch, rank: int) -> dict:
    """The progress record of rank `rank` while its save waits for the other rank (rank 1: in `wait_for_rank0`;
    rank 0: in `shard_writer.collect`)."""
    seen = {}

    def look(*_):
        seen.update(progress.read(tmp_path / "watch", [rank])[rank])
        raise Seen

    class Comm(NoComm):
        wait_for_rank0 = look

    monkeypatch.setattr(shard_writer, "write_rank", _own_part)
    monkeypatch.setattr(shard_writer, "collect", look)
    monkeypatch.setattr(checkpoint, "export_files", lambda *a: None)
    monkeypatch.setattr("pretrain_cli.models.convert.write_model_config", lambda *a: None)
    (tmp_path / "watch").mkdir()
    progress.open_record(tmp_path / "watch" / f"progress.{rank}")
    try:
        progress.mark("save", 8)
        saver = checkpoint.Saver(tmp_path / "out", None, Comm(), {}, None, "float32", None, rank=rank, world_size=2,
                                 layout="dp")
        with pytest.raises(Seen):
            saver._write_sync(8, [], {"global_step": 8})
    finally:
        progress.close_record()
    return seen


@pytest.mark.parametrize("rank", [0, 1])
def test_a_rank_waiting_for_a_slower_ranks_part_of_a_save_is_not_called_hung(tmp_path, monkeypatch, rank):
    waiting = _waiting_phase(tmp_path, monkeypatch, rank)
    assert waiting["phase"] in progress.WAITING and waiting["phase"] in progress.LONG, waiting
    other = 1 - rank
    writing = dict(waiting, phase="save", since=waiting["since"] - 1.0)  # began its save with it, still writing
    records = {rank: waiting, other: writing}
    # the other rank 25 s into its own write, healthy: nobody is hung with hang_timeout 10 (nor at the default)
    assert progress.hung(records, waiting["since"] + 25.0, 10.0) is None
    assert progress.hung(records, waiting["since"] + 25.0, None) is None
    # past the save's allowance (at least 600 s): the rank named is the one still writing, stopped or not
    late = waiting["since"] + progress.START + 1.0
    assert progress.hung(records, late, 10.0, stopped={other: 0.0})[0] == other
    assert progress.hung(records, late, 10.0)[0] == other
    assert progress.hung(records, late, None)[0] == other


def test_a_save_is_timed_from_its_mark_to_the_end_of_its_wait(tmp_path, monkeypatch):
    """`last_save` (what a stop's warning compares with the time it has left) is the whole save, the rank's own part
    and its wait for the others' (and rank 0's publish after it), not its own part alone."""
    clock = [100.0]
    monkeypatch.setattr(progress, "time", type("Clock", (), {"time": staticmethod(lambda: clock[0])}))
    rec = progress.Record(tmp_path / "progress.0")
    for at, phase, step in ((100.0, "save", 8), (105.0, "save (waiting)", 8), (120.0, "save", 8), (130.0, "data", 9)):
        clock[0] = at
        rec.mark(phase, step)
    assert rec.saved == 30.0
    assert progress.read(tmp_path, [0])[0]["phase"] == "data"
    rec.close()


def test_rank_0_publishing_is_its_own_work_again(tmp_path, monkeypatch):
    """Once every part is in, the index, the rename and the rotation are rank 0's own: a hang there names it, not the
    rank waiting for its publish."""
    seen = {}

    def publish(*_):
        seen.update(progress.read(tmp_path / "watch", [0])[0])
        raise Seen

    monkeypatch.setattr(shard_writer, "write_rank", _own_part)
    monkeypatch.setattr(shard_writer, "collect", lambda *a: [])
    monkeypatch.setattr(shard_writer, "publish", publish)
    monkeypatch.setattr(checkpoint, "export_files", lambda *a: None)
    monkeypatch.setattr("pretrain_cli.models.convert.write_model_config", lambda *a: None)
    (tmp_path / "watch").mkdir()
    progress.open_record(tmp_path / "watch" / "progress.0")
    try:
        saver = checkpoint.Saver(tmp_path / "out", None, NoComm(), {}, None, "float32", None, rank=0, world_size=2,
                                 layout="dp")
        with pytest.raises(Seen):
            saver._write_sync(8, [], {"global_step": 8})
    finally:
        progress.close_record()
    assert seen["phase"] == "save"
    waiting = dict(seen, phase="save (waiting)", since=seen["since"] - 1.0)  # rank 1, waiting for the publish
    assert progress.hung({0: seen, 1: waiting}, seen["since"] + progress.START + 1.0, 10.0)[0] == 0


@pytest.mark.parametrize("phase", ["save", "save (waiting)", "eval", "start-up"])
def test_a_stopped_rank_is_late_after_the_plain_hang_timeout_whatever_its_phase(phase):
    """A rank in `/proc` state T (SIGSTOP while writing its part of a save) cannot progress: it was named only after
    the save's 600 s (~11 s at hang_timeout 10 before the save's allowance; 300 s at the default). A healthy writer as
    slow keeps the save's allowance."""
    since = 1000.0
    records = {0: {"phase": "save (waiting)", "since": since, "step_seconds": 1.0},
               1: {"phase": phase, "since": since - 1.0, "step_seconds": 1.0}}
    assert progress.hung(records, since + 11.0, 10.0, stopped={1: 0.0}) == (1, 12.0)
    assert progress.hung(records, since + progress.DEFAULT, None, stopped={1: 0.0}) == (1, progress.DEFAULT + 1.0)
    assert progress.hung(records, since + 11.0, 10.0) is None  # not stopped: a slow save, not a hang
    assert progress.hung(records, since + progress.DEFAULT, None) is None


def test_a_slow_save_stopped_for_a_moment_is_timed_from_the_stop():
    """A healthy save already past hang_timeout (its save's allowance holds it) is no hang the moment a 1 s SIGSTOP
    touches it: a stopped rank is timed from the later of its mark and when it was first seen stopped."""
    since = 1000.0
    records = {0: {"phase": "save (waiting)", "since": since, "step_seconds": 1.0},
               1: {"phase": "save", "since": since - 1.0, "step_seconds": 1.0}}
    stop = since + 40.0  # 41 s into its own write, hang_timeout 10
    assert progress.hung(records, stop + 1.0, 10.0, stopped={1: stop}) is None
    assert progress.hung(records, stop + 10.0, 10.0, stopped={1: stop}) == (1, 51.0)  # still stopped: late


def test_the_watcher_keeps_when_a_rank_was_first_seen_stopped_and_leaves_a_debuggers_stop_out(tmp_path, monkeypatch):
    """State T: timed from when the watcher first saw it, forgotten once it runs; state t (`gdb -p`, `py-spy dump`,
    `strace -p` on a healthy rank) is no stop here."""
    from pretrain_cli import processes
    from pretrain_cli.distributed.launcher import watcher

    for r, phase in ((0, "save (waiting)"), (1, "save")):
        rec = progress.Record(tmp_path / f"progress.{r}")
        rec.mark(phase, 8)
    w = watcher.Watcher(0, {0: 10, 1: 11}, "h", tmp_path, None, grace=1.0, hang_timeout=10.0)
    since = progress.read(tmp_path, [1])[1]["since"]
    state, clock = {}, [since + 40.0]
    monkeypatch.setattr(processes, "_stat", lambda pid: [state.get(pid, b"S")])
    monkeypatch.setattr(watcher.time, "time", lambda: clock[0])
    state[11] = b"t"  # a debugger's look at the slow save
    assert w._check_progress(0) is None and w.stopped_at == {}
    state[11] = b"T"
    assert w._check_progress(0) is None and w.stopped_at == {1: since + 40.0}
    clock[0] += 5.0
    state[11] = b"S"  # running again: forgotten
    assert w._check_progress(0) is None and w.stopped_at == {}
    state[11] = b"T"
    assert w._check_progress(0) is None and w.stopped_at == {1: since + 45.0}
    clock[0] += 10.0
    found = w._check_progress(0)
    assert found is not None and found["ranks"] == [1] and found["phase"] == "save", found
