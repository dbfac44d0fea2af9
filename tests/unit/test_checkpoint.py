"""Optimizer state round trips through optimizer.safetensors, fp32 and O2 (fp32 master weights); the sharded
format's pieces, index, block reads and damage checks (docs/CHECKPOINTS.md)."""
import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from safetensors.numpy import save_file

from pretrain_cli import runtime
from pretrain_cli.distributed.strategies.strategy import Strategy
from pretrain_cli.errors import UserError
from pretrain_cli.run_layout import ParallelConfig
from pretrain_cli.training import checkpoint
from state_helpers import optimizer_tensors

ONE = ParallelConfig()

PRESET = Path(__file__).resolve().parents[2] / "src/pretrain_cli/config/presets/micro-llama"


def _build(dtype: str):
    paddle = runtime.import_paddle()
    from pretrain_cli.models import build_model
    from pretrain_cli.models.config import ModelConfig

    paddle.seed(0)
    model = build_model(ModelConfig.from_file(str(PRESET)))
    if dtype != "float32":
        model.to(dtype=dtype)
    opt = paddle.optimizer.AdamW(learning_rate=1e-3, parameters=model.parameters(), multi_precision=dtype != "float32")
    opt._create_accumulators(paddle.static.default_main_program().global_block(), list(model.parameters()))
    return model, opt


def _fill(opt, seed: int) -> None:
    rng = np.random.default_rng(seed)
    for table in opt._accumulators.values():
        for t in table.values():
            t.set_value(rng.standard_normal(t.shape).astype(np.float32))
    for t in (getattr(opt, "_master_weights", None) or {}).values():
        t.set_value(rng.standard_normal(t.shape).astype(np.float32))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_optimizer_state_round_trip(tmp_path, dtype):
    model, opt = _build(dtype)
    _fill(opt, 1)
    saved = optimizer_tensors(model, opt)
    n_params = len(list(model.parameters()))
    per_param = 5 if dtype == "bfloat16" else 4  # moments, beta pows (+ the fp32 master copy under O2)
    assert len(saved) == n_params * per_param
    assert saved["model.layers.0.self_attn.q_proj.weight/moment1"].shape == (64, 64)
    assert saved["lm_head.weight/moment2"].shape == (512, 64)  # HF [out, in] layout
    save_file(saved, str(tmp_path / "opt.safetensors"))
    model2, opt2 = _build(dtype)
    _fill(opt2, 2)
    (tmp_path / "opt.safetensors").rename(tmp_path / "optimizer.safetensors")  # a checkpoint from before the index
    checkpoint.load_optimizer(Strategy(ONE), model2, opt2, tmp_path)
    again = optimizer_tensors(model2, opt2)
    assert again.keys() == saved.keys()
    assert all(np.array_equal(again[k], saved[k]) for k in saved)


def test_optimizer_state_mismatch_is_a_user_error(tmp_path):
    model, opt = _build("float32")
    saved = optimizer_tensors(model, opt)
    saved["model.norm.weight/moment1"] = np.zeros(3, np.float32)
    save_file(saved, str(tmp_path / "optimizer.safetensors"))
    with pytest.raises(UserError, match="model.norm.weight/moment1 has shape"):
        checkpoint.load_optimizer(Strategy(ONE), model, opt, tmp_path)
    del saved["model.norm.weight/moment1"]
    save_file(saved, str(tmp_path / "optimizer.safetensors"))
    with pytest.raises(UserError, match="no moment1 for model.norm.weight"):
        checkpoint.load_optimizer(Strategy(ONE), model, opt, tmp_path)


# ---------------------------------------------------------------------------------------- the sharded format
def test_mesh_box_splits_like_paddle_and_nests():
    from pretrain_cli.distributed.layout.pieces import mesh_box, split

    assert split(5, 2) == [3, 2] and split(8, 4) == [2, 2, 2, 2] and split(1, 2) == [1, 0]
    box = mesh_box((10, 6), (2, 2), (1, 0), (0, 1))  # dp shards rows, mp shards columns
    assert (box.offsets, box.shape) == ((5, 0), (5, 3))
    box = mesh_box((8, 4), (2, 2), (1, 1), (0, 0))  # both mesh dims on rows: dp's half, then mp's half of it
    assert (box.offsets, box.shape) == ((6, 0), (2, 4))
    assert mesh_box((8, 4), (2, 2), (1, 1), (None, None)).whole
    assert box.transposed().offsets == (0, 6) and box.transposed().global_shape == (4, 8)


def test_intersect():
    from pretrain_cli.storage.checkpoint_index import intersect

    assert intersect((0, 0), (4, 6), (2, 3), (4, 4)) == ((2, 3), (2, 3))
    assert intersect((0, 0), (4, 6), (4, 0), (2, 6)) is None  # touching is not overlapping
    assert intersect((0,), (0,), (0,), (5,)) is None  # an empty piece
    assert intersect((), (), (), ()) == ((), ())  # 0-d tensors


def _piece(name, shape, holders, kind="optimizer"):
    from pretrain_cli.distributed.layout.pieces import Box, Piece

    return Piece(name, kind, Box(shape, (0,) * len(shape), shape), "F32", holders, None)


def test_writer_of_spreads_replicas_and_keeps_owned_pieces():
    from pretrain_cli.distributed.layout.pieces import writer_of

    pieces = [_piece("a", (100,), (0, 1)), _piece("b", (60,), (0, 1)), _piece("c", (50,), (0, 1)),
              _piece("d", (10,), (1,)), _piece("e", (10,), (0, 2))]
    got = writer_of(pieces)
    assert got == {"a": 0, "b": 1, "c": 1, "d": 1, "e": 0}
    # every holder computes the same answer from its own (identically ordered) pieces of a holder set
    assert writer_of([p for p in pieces if 1 in p.holders])["c"] == 1


def _write_pieces(tmp_path, arr, splits):
    """`arr` split by rows at `splits`, one file per piece, and the index over them."""
    from pretrain_cli.storage import checkpoint_index, shard_files

    records, bounds = [], [0, *splits, arr.shape[0]]
    for r, (a, b) in enumerate(zip(bounds, bounds[1:])):
        fname = checkpoint_index.file_name("optimizer", r, len(bounds) - 1)
        block = np.ascontiguousarray(arr[a:b])
        pieces = [{"name": "t/moment1", "kind": "optimizer", "dtype": "F32", "global_shape": list(arr.shape),
                   "offsets": [a, 0], "shape": list(block.shape), "file": fname}]
        info = shard_files.write(tmp_path / fname, [("t/moment1", "F32", block.shape, lambda x=block: x)],
                                 checkpoint_index.file_metadata(pieces))
        records.append({"files": {fname: info}, "pieces": pieces})
    index = checkpoint_index.build(records, len(records), "test")
    checkpoint_index.write_index(tmp_path, index)
    return index


def test_reader_reads_only_the_intersecting_bytes_of_each_piece(tmp_path):
    from pretrain_cli.storage import checkpoint_index

    arr = np.arange(8 * 6, dtype=np.float32).reshape(8, 6)
    index = _write_pieces(tmp_path, arr, [3, 5])
    reader = checkpoint_index.Reader(tmp_path, index)
    np.testing.assert_array_equal(reader.read("t/moment1", (2, 1), (4, 3)), arr[2:6, 1:4])
    assert reader.bytes_read == 4 * 3 * 4  # the block's bytes, from three files
    np.testing.assert_array_equal(reader.read("t/moment1"), arr)
    with pytest.raises(UserError, match="needs a block"):
        reader.read("t/moment1", (6, 0), (4, 6))
    with pytest.raises(UserError, match="no tensor 'x'"):
        reader.read("x")


def test_index_refuses_pieces_that_do_not_tile_the_tensor(tmp_path):
    from pretrain_cli.storage import checkpoint_index

    index = _write_pieces(tmp_path, np.zeros((4, 2), np.float32), [2])
    records = [{"files": {}, "pieces": [{"name": "t", "kind": "weights", "dtype": "F32", "global_shape": [4, 2],
                                         "offsets": [0, 0], "shape": [2, 2], "file": "f"}]}]
    with pytest.raises(RuntimeError, match="cover 4 of 8"):
        checkpoint_index.build(records, 1, "test")
    assert index["weights_whole"] and checkpoint_index.hf_weight_map(index)["weight_map"] == {}


@pytest.mark.parametrize("harm", ["missing", "truncated", "flipped", "none"])
def test_damage_is_found_by_size_and_checksum(tmp_path, harm):
    from pretrain_cli.storage import intact

    _write_pieces(tmp_path, np.ones((8, 6), np.float32), [4])
    f = tmp_path / "optimizer-00002-of-00002.safetensors"
    data = f.read_bytes()
    if harm == "missing":
        f.unlink()
    elif harm == "truncated":
        f.write_bytes(data[:-8])
    elif harm == "flipped":
        f.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    want = {"missing": "is missing", "truncated": f"has {len(data) - 8} bytes, the index says {len(data)}",
            "flipped": "does not match its checksum", "none": None}[harm]
    got = intact.damage(tmp_path)
    assert got == want if want is None else want in got
    assert intact.damage(tmp_path, files=["optimizer-00001-of-00002.safetensors"]) is None  # one rank's files


def _save(tmp_path, model, opt, rank, step=4, run_args=None) -> dict:
    """What the trainer hands `Saver` at a save, for one rank of a simulated two-rank data-parallel run: the
    step, this rank's pieces, rank 0's trainer state. Returns the save's event."""
    from pretrain_cli.distributed.comms.comm import NoComm
    from pretrain_cli.models.config import ModelConfig

    strategy = Strategy(ParallelConfig(world_size=2, rank=rank, dp_degree=2))
    saver = checkpoint.Saver(tmp_path, ModelConfig.from_file(str(PRESET)), NoComm(), run_args or {}, None,
                             "float32", None, rank=rank, world_size=2, layout=strategy.name)
    state = {"global_step": step, "consumed_samples": 0} if rank == 0 else None
    return saver(step, strategy.pieces(model, opt), state)


def test_every_rank_writes_only_its_pieces_without_any_collective(tmp_path, monkeypatch):
    """Two ranks' saves run in one process (rank 1's first: rank 0 publishes once both records exist) with every
    Paddle collective made to fail: each rank's files hold the pieces `writer_of` gave it, every tensor once,
    and the assembled checkpoint loads back exactly."""
    import paddle.distributed as dist

    from pretrain_cli.distributed.layout.pieces import writer_of
    from pretrain_cli.storage import checkpoint_index
    from pretrain_cli.storage.shard_files import File

    def forbidden(*a, **k):
        raise AssertionError("a collective in a save")

    for name in ("all_gather", "all_gather_object", "broadcast", "all_reduce", "reduce", "gather", "scatter",
                 "reshard", "barrier", "send", "recv"):
        monkeypatch.setattr(dist, name, forbidden)
    model, opt = _build("float32")
    _fill(opt, 3)
    for rank in (1, 0):
        event = _save(tmp_path, model, opt, rank, run_args={"a": 1})
        assert event["async"] is False and event["stall_seconds"] >= 0
    ckpt = tmp_path / "checkpoint-4"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-4"]  # published once, nothing left over
    owner = writer_of(Strategy(ParallelConfig(world_size=2, dp_degree=2)).pieces(model, opt))
    for rank in (0, 1):
        held = set()
        for kind in ("model", "optimizer"):
            held |= set(File(ckpt / checkpoint_index.file_name(kind, rank, 2)).tensors)
        assert held == {n for n, r in owner.items() if r == rank}
    index = json.loads((ckpt / checkpoint_index.INDEX).read_text())
    by_rank = [sum(f["bytes"] for n, f in index["files"].items() if f"-0000{r + 1}-of" in n) for r in (0, 1)]
    assert 0.45 < by_rank[0] / sum(by_rank) < 0.55  # the replicas' bytes are spread over both ranks
    assert not list(ckpt.glob("rank-*"))
    from pretrain_cli.storage import intact

    assert intact.damage(ckpt) is None
    # the weights are whole: transformers' own index names each tensor's file
    weight_map = json.loads((ckpt / "model.safetensors.index.json").read_text())["weight_map"]
    assert weight_map["model.norm.weight"] == checkpoint_index.file_name("model", owner["model.norm.weight"], 2)
    model2, opt2 = _build("float32")
    _fill(opt2, 4)
    checkpoint.load_optimizer(Strategy(ONE), model2, opt2, ckpt)
    saved, again = optimizer_tensors(model, opt), optimizer_tensors(model2, opt2)
    assert again.keys() == saved.keys() and all(np.array_equal(again[k], saved[k]) for k in saved)


def _complete(ckpt, step: int) -> None:
    """A two-rank checkpoint of pieces with its trainer state and model config: what `intact.problem` accepts."""
    ckpt.mkdir()
    _write_pieces(ckpt, np.ones((4, 2), np.float32), [2])
    (ckpt / "trainer_state.json").write_text(json.dumps({"global_step": step, "consumed_samples": 8 * step}))
    (ckpt / "config.json").write_text('{"model_type": "qwen2"}')


# every kind of damage a resume would trip over, each skipped the same way
DAMAGE = {
    "shard deleted": (lambda c: (c / "optimizer-00001-of-00002.safetensors").unlink(), "is missing"),
    "shard truncated": (lambda c: _cut(c / "optimizer-00002-of-00002.safetensors", 4), "the index says"),
    "byte flipped": (lambda c: _flip(c / "optimizer-00001-of-00002.safetensors"), "does not match its checksum"),
    "index deleted": (lambda c: (c / "checkpoint.index.json").unlink(), "checkpoint.index.json is missing"),
    "index truncated": (lambda c: _cut(c / "checkpoint.index.json", 10), "checkpoint.index.json: unreadable"),
    "state deleted": (lambda c: (c / "trainer_state.json").unlink(), "no trainer_state.json"),
    "state truncated": (lambda c: _cut(c / "trainer_state.json", 5), "unreadable trainer state"),
    "config deleted": (lambda c: (c / "config.json").unlink(), "config.json is missing"),
    "config truncated": (lambda c: _cut(c / "config.json", 3), "config.json is unreadable"),
}


def _cut(path, n: int) -> None:
    path.write_bytes(path.read_bytes()[:-n])


def _flip(path) -> None:
    data = bytearray(path.read_bytes())
    data[-1] ^= 1
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("harm", sorted(DAMAGE))
def test_resume_skips_any_damaged_checkpoint_with_one_warning(tmp_path, caplog, harm):
    from pretrain_cli.storage import intact

    for step in (3, 6):
        _complete(tmp_path / f"checkpoint-{step}", step)
    assert intact.newest(tmp_path) == tmp_path / "checkpoint-6"
    damage, reason = DAMAGE[harm]
    damage(tmp_path / "checkpoint-6")
    assert reason in intact.problem(tmp_path / "checkpoint-6")
    with caplog.at_level("WARNING", logger="pretrain_cli"):
        assert intact.newest(tmp_path) == tmp_path / "checkpoint-3"
    assert len(caplog.records) == 1 and caplog.records[0].getMessage().startswith("not resuming from checkpoint-6: ")
    assert reason in caplog.records[0].getMessage() and "\n" not in caplog.records[0].getMessage()


def test_resume_stops_with_one_line_when_every_checkpoint_is_damaged(tmp_path):
    from pretrain_cli.storage import intact

    _complete(tmp_path / "checkpoint-3", 3)
    _cut(tmp_path / "checkpoint-3" / "optimizer-00002-of-00002.safetensors", 4)
    with pytest.raises(UserError, match="every checkpoint is damaged"):
        intact.newest(tmp_path)
    assert intact.newest(tmp_path / "nothing") is None


def test_a_checkpoint_from_before_the_index_is_complete_unless_truncated(tmp_path):
    from pretrain_cli.storage import intact
    from pretrain_cli.storage.shard_files import write

    ckpt = tmp_path / "checkpoint-2"
    ckpt.mkdir()
    (ckpt / "trainer_state.json").write_text('{"global_step": 2, "consumed_samples": 16}')
    (ckpt / "config.json").write_text("{}")
    for name in ("model.safetensors", "optimizer.safetensors"):
        arr = np.ones((4, 4), np.float32)
        write(ckpt / name, [("w", "F32", arr.shape, lambda: arr)])
    assert intact.problem(ckpt) is None
    _cut(ckpt / "optimizer.safetensors", 4)
    assert "optimizer.safetensors is truncated" in intact.problem(ckpt)


def test_a_one_process_checkpoint_whose_index_was_deleted_is_damaged_not_taken_for_one_from_before_it(tmp_path):
    """One process writes whole `model.safetensors` + `optimizer.safetensors`, the names a checkpoint from before the
    index has; its files' headers record their pieces (`pretrain_cli.pieces`), which the older ones do not. Without
    its index such a checkpoint had no checksum left to check: a flipped byte passed `check --verify` and a named
    `resume_from_checkpoint` and loaded."""
    from pretrain_cli.storage import checkpoint_index, intact
    from pretrain_cli.storage.shard_files import write

    ckpt = tmp_path / "checkpoint-2"
    ckpt.mkdir()
    (ckpt / "trainer_state.json").write_text('{"global_step": 2, "consumed_samples": 16}')
    (ckpt / "config.json").write_text("{}")
    arr = np.ones((4, 4), np.float32)
    for name, tensor in (("model.safetensors", "w"), ("optimizer.safetensors", "w/moment1")):
        piece = {"name": tensor, "offsets": [0, 0], "global_shape": [4, 4]}
        write(ckpt / name, [(tensor, "F32", arr.shape, lambda: arr)], checkpoint_index.file_metadata([piece]))
    assert intact.problem(ckpt) == f"{ckpt / checkpoint_index.INDEX} is missing"


def test_bf16_pieces_are_assembled_for_eval_and_generate(tmp_path):
    """bf16 weights travel as their uint16 bits; a directory of pieces reads back as whole bf16 tensors (the
    reader `eval` and `generate` read a checkpoint of pieces with)."""
    paddle = runtime.import_paddle()
    from pretrain_cli.storage import checkpoint_index, shard_files
    from pretrain_cli.training.weight_source import open_reader

    whole = paddle.randn([6, 4]).astype("bfloat16")
    bits = whole.numpy()  # uint16
    records = []
    for r, cols in enumerate([(0, 3), (3, 4)]):  # a column split, as tensor parallelism leaves a row-parallel weight
        fname = checkpoint_index.file_name("model", r, 2)
        block = np.ascontiguousarray(bits[:, cols[0]:cols[1]])
        pieces = [{"name": "w", "kind": "weights", "dtype": "BF16", "global_shape": [6, 4], "offsets": [0, cols[0]],
                   "shape": list(block.shape), "file": fname}]
        info = shard_files.write(tmp_path / fname, [("w", "BF16", block.shape, lambda b=block: b)],
                                 checkpoint_index.file_metadata(pieces))
        records.append({"files": {fname: info}, "pieces": pieces})
    checkpoint_index.write_index(tmp_path, checkpoint_index.build(records, 2, "test"))
    reader, _ = open_reader(tmp_path, "weights", "resume")
    assert reader.index["tensors"]["w"]["dtype"] == "BF16" and np.array_equal(reader.read("w"), bits)
    from safetensors.paddle import load_file

    assert load_file(str(tmp_path / "model-00002-of-00002.safetensors"))["w"].shape == [6, 1]  # plain safetensors


def test_a_rank_that_fails_its_part_fails_the_save_and_nothing_is_published(tmp_path):
    from pretrain_cli.training import shard_writer

    model, opt = _build("float32")
    # rank 1 made the directory before its first file, as every rank does (`report_failure` writes only into it)
    (tmp_path / "checkpoint-4.tmp").mkdir()
    shard_writer.report_failure(tmp_path / "checkpoint-4.tmp", 1, OSError(28, "No space left on device"))
    with pytest.raises(UserError, match="rank 1 could not write its part of checkpoint-4: OSError.*No space left"):
        _save(tmp_path, model, opt, 0)
    assert list(tmp_path.iterdir()) == []  # the partial directory is gone, no checkpoint-4
