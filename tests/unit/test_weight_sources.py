"""One way weights get in (`training.weight_source`): the same weights come out of every source, whole (`eval`,
`generate`, a rollback without rebuild: `load_weights`) and as a rank's blocks (resume, a rollback's rebuild,
`continue_training`: `WeightSource` into `distributed.layout.materialize`); a checkpoint directory's metadata is read
once (`storage.checkpoint_dir.CheckpointDir`)."""
import json
from dataclasses import replace

import numpy as np
import pytest

from pretrain_cli import runtime

paddle = runtime.import_paddle()

from safetensors.numpy import save_file  # noqa: E402

from pretrain_cli.distributed.layout.materialize import fill  # noqa: E402
from pretrain_cli.distributed.layout.pieces import Box  # noqa: E402
from pretrain_cli.errors import UserError  # noqa: E402
from pretrain_cli.models import build_model, convert  # noqa: E402
from pretrain_cli.models.config import ModelConfig  # noqa: E402
from pretrain_cli.storage import checkpoint_index, shard_files  # noqa: E402
from pretrain_cli.storage.checkpoint_dir import CheckpointDir  # noqa: E402
from pretrain_cli.training.weight_source import WeightSource, load_weights  # noqa: E402

CFG = ModelConfig(model_type="llama", vocab_size=51, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32, tie_word_embeddings=False,
                  bos_token_id=1, eos_token_id=2)


def _fresh(seed):
    paddle.seed(seed)
    return build_model(CFG)


@pytest.fixture(scope="module")
def src():
    """The model every source holds, and its parameters (Paddle layout)."""
    model = _fresh(1)
    return model, {n: p.numpy().copy() for n, p in model.named_parameters()}


def _hf_tensors(model) -> dict:
    return {n: np.ascontiguousarray(p.numpy().T if t else p.numpy()) for n, p, t in convert.hf_params(model)}


def _hf_directory(model, d):
    convert.save_hf(model, CFG, str(d))


def _paddlenlp_directory(model, d):
    """PaddleNLP's names (`llama.`) and Paddle's `[in, out]` layout."""
    d.mkdir()
    save_file({n.replace("model.", "llama.", 1): p.numpy() for n, p in model.named_parameters()},
              str(d / "model.safetensors"), metadata={"format": "pt"})
    (d / "config.json").write_text(json.dumps(CFG.to_hf_dict()))


def _whole_checkpoint(model, d):
    """A checkpoint from before the index: one process's whole `model.safetensors` + `optimizer.safetensors`."""
    d.mkdir()
    save_file(_hf_tensors(model), str(d / "model.safetensors"), metadata={"format": "pt"})
    save_file({"model.norm.weight/moment1": np.zeros(16, np.float32)}, str(d / "optimizer.safetensors"))
    (d / "config.json").write_text(json.dumps(CFG.to_hf_dict()))


def _sharded_checkpoint(model, d):
    """Two ranks' pieces (each tensor cut in two along its first dimension) and `checkpoint.index.json`."""
    d.mkdir()
    records = []
    for rank in range(2):
        fname, pieces, entries = checkpoint_index.file_name("model", rank, 2), [], []
        for name, arr in _hf_tensors(model).items():
            half = arr.shape[0] // 2
            lo, hi = (0, half) if rank == 0 else (half, arr.shape[0])
            block = np.ascontiguousarray(arr[lo:hi])
            pieces.append({"name": name, "kind": "weights", "dtype": "F32", "global_shape": list(arr.shape),
                           "offsets": [lo] + [0] * (arr.ndim - 1), "shape": list(block.shape), "file": fname})
            entries.append((name, "F32", block.shape, lambda b=block: b))
        info = shard_files.write(d / fname, entries, checkpoint_index.file_metadata(pieces))
        records.append({"files": {fname: info}, "pieces": pieces})
    checkpoint_index.write_index(d, checkpoint_index.build(records, 2, "test"))
    (d / "config.json").write_text(json.dumps(CFG.to_hf_dict()))


SOURCES = {"sharded checkpoint": (_sharded_checkpoint, "hf"), "whole files": (_whole_checkpoint, "hf"),
           "hugging face": (_hf_directory, "hf"), "paddlenlp": (_paddlenlp_directory, "paddlenlp")}


@pytest.mark.parametrize("kind", list(SOURCES))
def test_every_source_gives_the_same_weights_whole_and_as_blocks(tmp_path, src, kind):
    model, want = src
    write, layout = SOURCES[kind]
    write(model, tmp_path / "d")
    # whole: eval, generate, a rollback without rebuild
    dst = _fresh(2)
    assert load_weights(dst, tmp_path / "d", use="continue_training") == layout
    for name, p in dst.named_parameters():
        np.testing.assert_array_equal(p.numpy(), want[name], err_msg=name)
    # as blocks: what the layout creates on a rank (a lazily built model), and one block off every piece's edge
    with paddle.LazyGuard():
        lazy = build_model(CFG)
    source = WeightSource(tmp_path / "d", lazy, use="continue_training")
    try:
        assert fill(lazy, source) == len(want)
        for name, p in lazy.named_parameters():
            np.testing.assert_array_equal(p.numpy(), want[name], err_msg=name)
        name = "model.layers.1.mlp.down_proj.weight"  # Paddle [24, 16]; HF [16, 24], cut at row 8 in the pieces
        np.testing.assert_array_equal(source(name, Box((24, 16), (5, 3), (10, 11))), want[name][5:15, 3:14])
    finally:
        source.close()


def test_the_one_name_map_checks_every_source_alike(tmp_path, src):
    """Names, shapes and dtypes are checked in one place (`convert.name_map`), whichever reader read the files."""
    model, _ = src
    _sharded_checkpoint(model, tmp_path / "sharded")
    bigger = replace(CFG, intermediate_size=32)
    with paddle.LazyGuard():
        other = build_model(bigger)
    with pytest.raises(UserError, match=r"'model.layers.0.mlp.gate_proj.weight' has shape \[24, 16\] but config.json "
                                        r"implies \[32, 16\]"):
        WeightSource(tmp_path / "sharded", other, use="resume")
    tensors = _hf_tensors(model)
    tensors["model.norm.weight"] = np.arange(16, dtype=np.int64)
    (tmp_path / "ints").mkdir()
    save_file(tensors, str(tmp_path / "ints" / "model.safetensors"))
    with pytest.raises(UserError, match="'model.norm.weight' has dtype I64, weights must be floating point"):
        load_weights(_fresh(3), tmp_path / "ints", use="continue_training")


def test_a_checkpoint_directory_is_read_once(tmp_path, src):
    model, _ = src
    ckpt = tmp_path / "checkpoint-3"
    _sharded_checkpoint(model, ckpt)
    (ckpt / "trainer_state.json").write_text('{"global_step": 3, "consumed_samples": 24}')
    (ckpt / "args.json").write_text(json.dumps({"version": "x", "arguments": {"max_seq_length": 32},
                                                "run": {"loop": {"micro_batch": 2}}}))
    meta = CheckpointDir(ckpt)
    first = (meta.state, meta.args, meta.index, meta.record)
    for name in ("trainer_state.json", "args.json", "checkpoint.index.json"):
        (ckpt / name).unlink()  # asked again, nothing is read again
    assert (meta.state, meta.args, meta.index, meta.record) == first
    assert meta.state["global_step"] == 3 and meta.run("loop", "micro_batch") == 2 and meta.run("schedule") is None
    assert meta.index["world_size"] == 2 and meta.record == ckpt / "args.json"
    assert CheckpointDir(tmp_path).args is None and CheckpointDir(tmp_path).record is None  # no run wrote it


@pytest.mark.parametrize("trainer_state, use, advice", [
    (False, "continue_training", "; download it again, or point model_name_or_path to a complete directory"),
    (True, "resume", f"; the checkpoint is damaged: {shard_files.CHECKPOINT_ADVICE}")])
def test_a_damaged_weights_file_is_advised_by_what_holds_it(tmp_path, trainer_state, use, advice):
    """A model directory (transformers', PaddleNLP's: no run of ours wrote it) whose weights file is damaged is to be
    downloaded again; a checkpoint's says what that makes of the checkpoint, then to resume from another."""
    from pretrain_cli.run_dir import STATE_FILE
    from pretrain_cli.training.weight_source import open_reader

    save_file({"model.embed_tokens.weight": np.ones((4, 2), np.float32)}, str(tmp_path / "model.safetensors"))
    data = (tmp_path / "model.safetensors").read_bytes()
    (tmp_path / "model.safetensors").write_bytes(data[:8] + b"{not json" + data[17:])  # the header spoiled
    if trainer_state:
        (tmp_path / STATE_FILE).write_text("{}")
    with pytest.raises(UserError) as e:
        open_reader(tmp_path, "weights", use)
    assert str(e.value).startswith(f"{tmp_path / 'model.safetensors'}: unreadable") and str(e.value).endswith(advice)


@pytest.mark.parametrize("trainer_state, use, advice", [
    (False, "continue_training", "; download it again, or point model_name_or_path to a complete directory"),
    (True, "resume", f"; the checkpoint is incomplete: {shard_files.CHECKPOINT_ADVICE}")])
def test_a_truncated_weights_file_is_advised_by_what_holds_it(tmp_path, trainer_state, use, advice):
    """A weights file cut short in a checkpoint-N: the line says the checkpoint is incomplete before what to do; a
    model directory's keeps its "download it again"."""
    from pretrain_cli.run_dir import STATE_FILE
    from pretrain_cli.training.weight_source import open_reader

    save_file({"model.embed_tokens.weight": np.ones((4, 2), np.float32)}, str(tmp_path / "model.safetensors"))
    data = (tmp_path / "model.safetensors").read_bytes()
    (tmp_path / "model.safetensors").write_bytes(data[:-8])  # the last 8 bytes of the tensor's data gone
    if trainer_state:
        (tmp_path / STATE_FILE).write_text("{}")
    reader, _ = open_reader(tmp_path, "weights", use)
    with pytest.raises(UserError) as e:
        reader.read("model.embed_tokens.weight")
    assert str(e.value) == (f"{tmp_path / 'model.safetensors'}: truncated ({len(data) - 8:,} bytes, tensor "
                            f"'model.embed_tokens.weight' ends at {len(data):,}){advice}")


@pytest.mark.parametrize("use, advice", [("continue_training", "point model_name_or_path to another of the run's "
                                                               "checkpoints"),
                                         ("inference", "point --model to another checkpoint-N")])
def test_a_checkpoint_without_its_index_is_advised_for_what_the_reader_does(tmp_path, use, advice):
    """Two ranks' checkpoint that lost checkpoint.index.json, its weights read by a `continue_training` run: the
    line ended with eval's advice (`open_reader` asked `model_files.find_weights` for inference's line)."""
    from pretrain_cli.training.weight_source import open_reader

    ckpt = tmp_path / "checkpoint-4"
    ckpt.mkdir()
    for name in ("trainer_state.json", "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
                 "optimizer-00001-of-00002.safetensors", "optimizer-00002-of-00002.safetensors"):
        (ckpt / name).write_bytes(b"")
    with pytest.raises(UserError) as e:
        open_reader(ckpt, "weights", use)
    assert str(e.value) == f"{ckpt / 'checkpoint.index.json'} is missing; the checkpoint is incomplete: {advice}"
