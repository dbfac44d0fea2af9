"""`checkpoint.index.json` as `load` checks it: a version this code does not know stops with one line and is not
taken for damage; `world_size`, `layout` and `weights_whole` only describe the writing run, so they are checked
against the index's own pieces (which must tile every tensor exactly once), never against the reading run."""
import json

import numpy as np
import pytest

from pretrain_cli.errors import UserError
from pretrain_cli.storage import checkpoint_index, intact, shard_files


def _checkpoint(ckpt, rows=(2, 2), step: int = 3) -> dict:
    """A checkpoint of one [sum(rows), 2] optimizer tensor written by len(rows) ranks, one row block each, plus
    one whole weight on rank 0: complete (what `intact.newest` accepts). Returns its index."""
    ckpt.mkdir(parents=True)
    world, records, at = len(rows), [], 0
    for rank, n in enumerate(rows):
        fname = checkpoint_index.file_name("optimizer", rank, world)
        block = np.full((n, 2), rank, np.float32)
        pieces = [{"name": "w/moment1", "kind": "optimizer", "dtype": "F32", "global_shape": [sum(rows), 2],
                   "offsets": [at, 0], "shape": [n, 2], "file": fname}]
        info = shard_files.write(ckpt / fname, [("w/moment1", "F32", block.shape, lambda b=block: b)],
                                 checkpoint_index.file_metadata(pieces))
        records.append({"files": {fname: info}, "pieces": pieces})
        at += n
    weights = checkpoint_index.file_name("model", 0, world)
    whole = np.ones((sum(rows), 2), np.float32)
    pieces = [{"name": "w", "kind": "weights", "dtype": "F32", "global_shape": [sum(rows), 2], "offsets": [0, 0],
               "shape": [sum(rows), 2], "file": weights}]
    records[0]["files"][weights] = shard_files.write(ckpt / weights, [("w", "F32", whole.shape, lambda: whole)],
                                                     checkpoint_index.file_metadata(pieces))
    records[0]["pieces"] += pieces
    index = checkpoint_index.build(records, world, "data parallel")
    checkpoint_index.write_index(ckpt, index)
    (ckpt / "trainer_state.json").write_text(json.dumps({"global_step": step, "consumed_samples": 8 * step}))
    (ckpt / "config.json").write_text('{"model_type": "qwen2"}')
    return index


def _edit(ckpt, change, seal: bool = True) -> None:
    """`change` the index of `ckpt` in place; `seal`: its own checksum made again (a tool editing it on purpose),
    so what is checked is the edit itself, not only the checksum."""
    path = ckpt / checkpoint_index.INDEX
    index = json.loads(path.read_text())
    change(index)
    path.write_text(json.dumps(checkpoint_index.seal(index) if seal else index))


def test_an_index_of_another_version_stops_with_one_line_and_is_not_skipped_as_damage(tmp_path):
    _checkpoint(tmp_path / "checkpoint-3", step=3)
    _checkpoint(tmp_path / "checkpoint-6", step=6)
    _edit(tmp_path / "checkpoint-6", lambda i: i.update(version=3))
    index_file = tmp_path / "checkpoint-6" / checkpoint_index.INDEX
    with pytest.raises(checkpoint_index.UnknownVersion) as e:
        checkpoint_index.load(tmp_path / "checkpoint-6")
    assert str(e.value) == (f"{index_file}: index version 3, this pretrain-cli reads version 2; read it with the "
                            f"pretrain-cli that wrote it, or resume from another checkpoint")
    with pytest.raises(checkpoint_index.UnknownVersion):  # resume does not fall back to checkpoint-3 silently
        intact.newest(tmp_path)
    _edit(tmp_path / "checkpoint-6", lambda i: i.pop("version"))  # no version at all: not an index we wrote
    assert "no index version" in intact.problem(tmp_path / "checkpoint-6")
    assert intact.newest(tmp_path) == tmp_path / "checkpoint-3"


def test_world_size_and_layout_are_not_checked_against_the_reading_run(tmp_path):
    """Any layout resumes from any other: a 3-process index loads as it is, whatever reads it."""
    index = _checkpoint(tmp_path / "ckpt", rows=(1, 2, 1))
    assert checkpoint_index.load(tmp_path / "ckpt") == index and index["world_size"] == 3
    reader = checkpoint_index.Reader(tmp_path / "ckpt", index)
    np.testing.assert_array_equal(reader.read("w/moment1")[:, 0], [0, 1, 1, 2])
    reader.close()


# an index whose records contradict each other, and the reason `load` gives
DISAGREE = {
    "world_size": (lambda i: i.update(world_size=3), "w: a piece in 'model-00001-of-00002.safetensors', which "
                   "the index does not list or which is no weights file of a 3-process run"),
    "world_size not a count": (lambda i: i.update(world_size=0),
                               "world_size 0 / layout 'data parallel' is not a run's"),
    "layout not text": (lambda i: i.update(layout=None), "is not a run's"),
    "file not listed": (lambda i: i["files"].pop("optimizer-00002-of-00002.safetensors"), "does not list"),
    "piece twice, one missing": (lambda i: i["tensors"]["w/moment1"]["pieces"][1].update(offsets=[0, 0]),
                                 "do not cover it exactly once"),
    "piece outside": (lambda i: i["tensors"]["w/moment1"]["pieces"][1].update(offsets=[3, 0]),
                      "does not lie inside its shape [4, 2]"),
    "shape grown": (lambda i: i["tensors"]["w/moment1"].update(shape=[5, 2]), "do not cover it exactly once"),
    "weights_whole": (lambda i: i.update(weights_whole=False), "weights_whole is False, the weights' pieces say True"),
    "record": (lambda i: i["tensors"]["w"].pop("pieces"), "w: not a tensor record"),
}


@pytest.mark.parametrize("harm", sorted(DISAGREE))
def test_an_index_that_disagrees_with_its_pieces_is_damage(tmp_path, harm):
    ckpt = tmp_path / "checkpoint-6"
    _checkpoint(ckpt)
    change, reason = DISAGREE[harm]
    _edit(ckpt, change)
    with pytest.raises(UserError) as e:
        checkpoint_index.load(ckpt)
    line = str(e.value)
    assert line.startswith(f"{ckpt / checkpoint_index.INDEX}: ") and reason in line and "\n" not in line
    assert line.endswith("the index is damaged: resume from another checkpoint")
    assert not isinstance(e.value, checkpoint_index.UnknownVersion)
    assert reason in intact.problem(ckpt)  # resume skips it for an older checkpoint, as any damage


def test_tiling_is_exact_on_a_grid_of_blocks():
    """TP x ZeRO pieces cut both dimensions: exact once, a hole, an overlap of equal total size."""
    quarters = [([r, c], [2, 3]) for r in (0, 2) for c in (0, 3)]
    assert checkpoint_index._tiling([4, 6], quarters) is None
    assert "exactly once" in checkpoint_index._tiling([4, 6], quarters[:3])
    assert "exactly once" in checkpoint_index._tiling([4, 6], [*quarters[:3], ([0, 0], [2, 3])])
    assert checkpoint_index._tiling([], [([], [])]) is None  # a scalar (beta1_pow) written once
    assert "exactly once" in checkpoint_index._tiling([], [([], []), ([], [])])


@pytest.mark.parametrize("shard_dims", [(0, 1), (1, 0), (0, 0), (None, 0), (0, None)])
def test_the_blocks_every_layout_writes_tile_exactly(shard_dims):
    """The boxes `distributed.layout.pieces.mesh_box` gives the ranks of a 2 x 3 mesh (TP x ZeRO, nested shards, uneven and
    empty chunks of a 5 x 2 tensor), one writer per distinct block, pass the check `load` applies."""
    from pretrain_cli.distributed.layout.pieces import mesh_box

    boxes = {mesh_box((5, 2), (2, 3), (a, b), shard_dims) for a in range(2) for b in range(3)}  # replicas once
    blocks = [(list(b.offsets), list(b.shape)) for b in boxes]
    assert checkpoint_index._tiling([5, 2], blocks) is None
    largest = max(blocks, key=lambda b: np.prod(b[1]))
    assert "exactly once" in checkpoint_index._tiling([5, 2], [*blocks, largest])  # a block written twice


def _swap_files(index) -> None:
    """The edit of the issue: the `file` of a tensor's two pieces swapped (coverage, sizes and crc32s stay valid)."""
    first, second = index["tensors"]["w/moment1"]["pieces"]
    first["file"], second["file"] = second["file"], first["file"]


def test_a_swapped_index_is_damage_whether_or_not_its_checksum_was_made_again(tmp_path, caplog):
    """Swapping the files of a tensor's two pieces by hand fails the index's own checksum; the same edit with the
    checksum made again (a tool, a mis-merge) disagrees with what the files say they hold. Either way auto-resume
    skips it with one line naming the disagreement, and `problem` (resume_from_checkpoint) refuses it."""
    for step in (3, 6):
        _checkpoint(tmp_path / f"checkpoint-{step}", step=step)
    newest, index = tmp_path / "checkpoint-6", tmp_path / "checkpoint-6" / checkpoint_index.INDEX
    for seal, reason in ((False, f"{index}: does not match its own checksum"),
                         (True, f"{index} and {newest / 'optimizer-00001-of-00002.safetensors'} disagree: the index "
                                f"puts the piece [2, 2] at [2, 0] of w/moment1 in "
                                f"optimizer-00001-of-00002.safetensors, which holds its piece [2, 2] at [0, 0]")):
        checkpoint_index.write_index(newest, _checkpoint(tmp_path / f"fresh-{seal}"))  # undo the previous edit
        _edit(newest, _swap_files, seal=seal)
        assert intact.problem(newest).startswith(reason)
        caplog.clear()
        with caplog.at_level("WARNING", logger="pretrain_cli"):
            assert intact.newest(tmp_path, checksums=False) == tmp_path / "checkpoint-3"
        lines = [r.getMessage() for r in caplog.records]
        assert len(lines) == 1 and lines[0].startswith(f"not resuming from checkpoint-6: {reason}"), lines
        assert "\n" not in lines[0]


def test_every_file_says_which_pieces_it_holds(tmp_path):
    """A file holding a piece the index does not put there, or no record at all, disagrees with the index."""
    ckpt = tmp_path / "ckpt"
    index = _checkpoint(ckpt)
    name = "optimizer-00002-of-00002.safetensors"
    f = shard_files.File(ckpt / name)
    assert json.loads(f.metadata[checkpoint_index.PIECES_KEY]) == {
        "w/moment1": {"offsets": [2, 0], "global_shape": [4, 2]}} and f.metadata["format"] == "pt"
    assert checkpoint_index.against_file(index, name, f.tensors, f.metadata) is None
    assert "holds no record of its pieces" in checkpoint_index.against_file(index, name, f.tensors, {"format": "pt"})
    extra = {**f.metadata, checkpoint_index.PIECES_KEY: json.dumps({"w/moment1": {"offsets": [2, 0], "global_shape":
                                                                                 [4, 2]}, "x": {}})}
    assert "holds a piece of x the index does not put there" in checkpoint_index.against_file(index, name, f.tensors,
                                                                                               extra)


def test_a_version_1_index_is_read_with_one_note(tmp_path, caplog):
    """Checkpoints from before the files recorded their pieces still resume (refusing them would strand every run
    started before): no checksum of its own is asked for, the files are not cross-checked, one note per index."""
    ckpt = tmp_path / "checkpoint-3"
    _checkpoint(ckpt)
    _edit(ckpt, lambda i: (i.update(version=1), i.pop("crc32")), seal=False)
    for f in ckpt.glob("optimizer-*"):  # files of then: no record of their pieces
        arr = shard_files.File(f).read("w/moment1")
        shard_files.write(f, [("w/moment1", "F32", arr.shape, lambda a=arr: a)], {"format": "pt"})
    index = json.loads((ckpt / checkpoint_index.INDEX).read_text())
    for name in index["files"]:
        index["files"][name] = shard_files.checksum(ckpt / name)
    (ckpt / checkpoint_index.INDEX).write_text(json.dumps(index))
    with caplog.at_level("WARNING", logger="pretrain_cli"):
        assert intact.problem(ckpt) is None and intact.problem(ckpt) is None
    notes = [r.getMessage() for r in caplog.records]
    assert len(notes) == 1 and "a version-1 index" in notes[0] and "checked by size and crc32 only" in notes[0]
