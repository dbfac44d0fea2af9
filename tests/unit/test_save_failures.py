"""A save that fails on one rank of several (`training.checkpoint.Saver`): rank 0, which decides the save, is the
first to end, with the line that names the failure. Rank 0's disk full removes checkpoint-N.tmp at once (freeing the
space); another rank still writing into it then failed with `No such file or directory` and, ending first, was
named by its host's watchers as the cause; a rank whose own part failed ended before rank 0 could remove the
partial directory. Such a rank now records its error for rank 0 and waits for rank 0's verdict (`Comm.wait_for_rank0`,
which raises once rank 0 has ended)."""
import errno

import pytest

from pretrain_cli.distributed.comms.comm import NoComm
from pretrain_cli.errors import PeerFailed
from pretrain_cli.training import checkpoint, shard_writer


class Waits(NoComm):
    """Rank 1's comm: rank 0 failed the save (`wait_for_rank0` raises as the real one does once rank 0 has ended);
    `seen`: what checkpoint-6.tmp/ held then."""

    rank, world = 1, 2

    def __init__(self, out=None):
        self.waited, self.out, self.seen = [], out, {}

    def wait_for_rank0(self, what, timeout=None):
        self.waited.append(what)
        tmp = self.out / "checkpoint-6.tmp" if self.out is not None else None
        if tmp is not None and tmp.is_dir():
            self.seen = {p.name: p.read_text() for p in tmp.iterdir()}
        raise PeerFailed(f"rank 1: rank 0 failed while {what}; see workerlog.0")


def _saver(tmp_path, comm):
    return checkpoint.Saver(tmp_path, None, comm, {}, None, "float32", None, rank=1, world_size=2, layout="dp")


def test_a_rank_whose_checkpoint_tmp_rank_0_removed_waits_for_rank_0s_verdict(tmp_path, monkeypatch):
    def rank_0_dropped_it(tmp, rank, world, pieces):
        tmp.mkdir(parents=True)
        shard_writer.drop(tmp)  # rank 0, out of space, removes the directory this rank is writing into
        raise FileNotFoundError(errno.ENOENT, "No such file or directory", str(tmp / "rank-00001.done.json"))

    monkeypatch.setattr(shard_writer, "write_rank", rank_0_dropped_it)
    comm = Waits()
    with pytest.raises(PeerFailed, match="rank 0 failed while publishing checkpoint-6"):
        _saver(tmp_path, comm)._write_sync(6, [], None)  # not its `No such file or directory`
    assert comm.waited == ["publishing checkpoint-6"]


def test_a_rank_whose_own_part_fails_tells_rank_0_and_waits_for_it(tmp_path, monkeypatch):
    def full(tmp, rank, world, pieces):
        tmp.mkdir(parents=True)
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp / "optimizer-00002-of-00002.safetensors"))

    monkeypatch.setattr(shard_writer, "write_rank", full)
    comm = Waits(tmp_path)
    with pytest.raises(PeerFailed):
        _saver(tmp_path, comm)._write_sync(6, [], None)
    record = comm.seen["rank-00001.done.json"]
    assert "No space left on device" in record  # rank 0 fails the save with this rank's error, naming it
    assert comm.waited == ["publishing checkpoint-6"]
    assert not (tmp_path / "checkpoint-6.tmp").exists()  # removed once rank 0 had failed the save


def test_a_failed_save_leaves_no_tmp_made_again_by_a_rank_still_writing(tmp_path, monkeypatch):
    """Disk full under launch.sh, 2 processes: rank 0 failed its part and removed checkpoint-6.tmp; rank 1, later to
    its part, made the directory again, wrote a file and, out of space, its error record, and the failed save left
    `checkpoint-6.tmp/` holding them (the docs say a failed save removes it at once). Rank 1 removes it once rank 0
    has ended the save."""
    def late(tmp, rank, world, pieces):  # (rank 0 has already removed the directory)
        tmp.mkdir(parents=True)
        (tmp / "model-00002-of-00002.safetensors").write_bytes(b"x" * 64)
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp / "optimizer-00002-of-00002.safetensors"))

    monkeypatch.setattr(shard_writer, "write_rank", late)
    comm = Waits(tmp_path)
    with pytest.raises(PeerFailed):
        _saver(tmp_path, comm)._write_sync(6, [], None)
    assert set(comm.seen) == {"model-00002-of-00002.safetensors", "rank-00001.done.json"}
    assert not (tmp_path / "checkpoint-6.tmp").exists() and not list(tmp_path.iterdir())


def test_a_rank_failing_after_rank_0_removed_the_tmp_does_not_make_it_again(tmp_path):
    """`report_failure` writes into checkpoint-N.tmp only as it is: gone, rank 0 removed it (it failed the save)."""
    tmp = tmp_path / "checkpoint-6.tmp"
    shard_writer.report_failure(tmp, 1, OSError(errno.ENOSPC, "No space left on device"))
    assert not tmp.exists()


def test_a_rank_stopped_by_rank_0s_failure_exits_1_not_as_a_usage_error(tmp_path):
    """`training.run_end.finish` turned every UserError of the loop into a plain one: a PeerFailed (rank 0 failed while
    this rank waited for its save) became exit 2, "usage", which launch.sh never restarts, on the node whose rank
    only lost rank 0."""
    from types import SimpleNamespace

    from run_helpers import resolve_run

    from pretrain_cli.errors import PeerFailed
    from pretrain_cli.training import run_end

    class Trainer:
        state = SimpleNamespace(global_step=39)

        def train(self):
            raise PeerFailed("rank 1: lost rank 0 while it was publishing checkpoint-40 (Broken pipe); see workerlog.0")

    closed = []
    collaborators = SimpleNamespace(saver=SimpleNamespace(wait=lambda: None, abandon=lambda e: None),
                                    close=lambda: closed.append(1))
    with pytest.raises(PeerFailed) as e:
        run_end.finish(resolve_run("--max_steps", "60"), Trainer(), NoComm(), collaborators)
    assert e.value.exit_code == 1 and e.value.kind == "peer" and closed


def test_rank_0_fails_the_save_with_another_ranks_error_as_a_system_error(tmp_path):
    """Exit 1, as that rank's own disk-full error would be: it was 2 (a usage error), which launch.sh never restarts."""
    tmp = tmp_path / "checkpoint-4.tmp"
    tmp.mkdir()
    shard_writer.report_failure(tmp, 1, OSError(errno.ENOSPC, "No space left on device"))
    with pytest.raises(shard_writer.PartFailed, match="rank 1 could not write its part of checkpoint-4: OSError") as e:
        shard_writer.collect(tmp, 2, 4)
    assert e.value.exit_code == 1 and e.value.kind == "system"


def _async_end(tmp_path, monkeypatch, write, error):
    """Rank 1 of 2 with async_save: `write` as its writer's `write_rank`, in the background; then its loop ends with
    `error` (`train` raises it) through `run_end.finish`, as in a launch. Returns checkpoint-6.tmp/'s names after."""
    from types import SimpleNamespace

    from run_helpers import resolve_run

    from pretrain_cli.training import run_end

    monkeypatch.setattr(shard_writer, "write_rank", write)
    saver = checkpoint.Saver(tmp_path, None, NoComm(), {}, None, "float32", None, async_save=True, rank=1,
                             world_size=2, layout="dp")

    class Trainer:
        state = SimpleNamespace(global_step=6)

        def train(self):
            saver(6, [], None)
            raise error

    with pytest.raises(type(error)):
        run_end.finish(resolve_run("--max_steps", "12"), Trainer(), NoComm(),
                       SimpleNamespace(saver=saver, close=lambda: None))
    tmp = tmp_path / "checkpoint-6.tmp"
    return sorted(p.name for p in tmp.iterdir()) if tmp.exists() else None


def test_an_async_save_rank_0_failed_leaves_no_tmp_made_again_by_another_rank(tmp_path, monkeypatch):
    """R8: 2 MB tmpfs, launch.sh NPROC=2 --async_save true: exit 1 and checkpoint-6.tmp/ left holding rank 1's
    model-00002-of-00002.safetensors and rank-00001.done.json: rank 0 failed the save and removed the directory, and
    rank 1's background writer, which never waits for rank 0, made it again. Rank 1 removes it as it ends (rank 0's
    failure reaches it as PeerFailed); its own write failing too."""
    def late(tmp, rank, world, pieces):  # (rank 0 has removed the directory already)
        tmp.mkdir(parents=True)
        (tmp / "model-00002-of-00002.safetensors").write_bytes(b"x" * 64)
        (tmp / shard_writer.RECORD.format(rank)).write_text('{"rank": 1, "files": {}, "pieces": []}')

    lost = PeerFailed("rank 1: lost rank 0 while it was publishing checkpoint-6 (Broken pipe); see workerlog.0")
    assert _async_end(tmp_path, monkeypatch, late, lost) is None

    def full(tmp, rank, world, pieces):
        tmp.mkdir(parents=True)
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp / "model-00002-of-00002.safetensors"))

    assert _async_end(tmp_path, monkeypatch, full, OSError(errno.ENOSPC, "No space left on device")) is None


def test_an_async_save_every_rank_wrote_is_left_to_rank_0(tmp_path, monkeypatch):
    """Every rank's record in it: rank 0 may be renaming it into checkpoint-6 now, so rank 1 leaves it."""
    def whole(tmp, rank, world, pieces):
        tmp.mkdir(parents=True)
        for r in range(world):
            (tmp / shard_writer.RECORD.format(r)).write_text(f'{{"rank": {r}, "files": {{}}, "pieces": []}}')

    lost = PeerFailed("rank 1: lost rank 2 while in collective at step 7; see workerlog.2")
    assert _async_end(tmp_path, monkeypatch, whole, lost) == ["rank-00000.done.json", "rank-00001.done.json"]


def test_an_async_save_rank_0_is_publishing_is_left_to_it(tmp_path):
    """R12: mid-publish (`shard_writer.publish`: trainer_state.json written, the records deleted, then fsync and the
    rename) rank 1 ending with PeerFailed removed checkpoint-6.tmp, a finished checkpoint, as rank 0 renamed it."""
    saver = checkpoint.Saver(tmp_path, None, NoComm(), {}, None, "float32", None, async_save=True, rank=1,
                             world_size=2, layout="dp")
    saver.writer.last = "checkpoint-6"  # its write of checkpoint-6 done, not failed
    tmp = tmp_path / "checkpoint-6.tmp"
    tmp.mkdir()
    names = ["checkpoint.index.json", "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
             "trainer_state.json"]
    for name in names:
        (tmp / name).write_text("{}")
    saver.abandon(PeerFailed("rank 1: lost rank 2 while in collective at step 7; see workerlog.2"))
    assert sorted(p.name for p in tmp.iterdir()) == names
    saver.wait()
