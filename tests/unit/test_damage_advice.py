"""A damaged weights file's line ends with advice decided in one place (`storage.shard_files.advice_for`), from the
directory holding it (a run's checkpoint-N, a run's final directory, a model directory) and what the command does
with it (resume, continue_training, inference, export): eval of a run's final directory said "the checkpoint is
incomplete: resume from another checkpoint" (it is no checkpoint, and eval resumes nothing)."""
import json
from types import SimpleNamespace

import numpy as np
import pytest

from pretrain_cli import runtime

paddle = runtime.import_paddle()

from pretrain_cli.distributed.layout.pieces import Box  # noqa: E402
from pretrain_cli.errors import UserError  # noqa: E402
from pretrain_cli.models import build_model, convert  # noqa: E402
from pretrain_cli.models.config import ModelConfig  # noqa: E402
from pretrain_cli.storage.shard_files import Advice, File, advice_for  # noqa: E402
from pretrain_cli.training.run import open_weights  # noqa: E402
from pretrain_cli.training.weight_source import load_for_inference  # noqa: E402

CFG = ModelConfig(model_type="llama", vocab_size=64, hidden_size=16, intermediate_size=24, num_hidden_layers=1,
                  num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32)


def _record(d) -> None:
    """What makes `d` one of our run's directories: its args.json record (`CheckpointDir.record`)."""
    arguments = {"model_name_or_path": "micro-llama", "output_dir": str(d), "max_seq_length": 8, "do_train": True}
    (d / "args.json").write_text(json.dumps({"version": "test", "arguments": arguments, "user_arguments": arguments,
                                             "run": {"data": {"max_seq_length": 8}}}))


def _model_dir(d, state: bool = True, cut: bool = True):
    """A model directory (with a trainer state and args.json: a run's) whose model.safetensors lost its last 8
    bytes."""
    paddle.seed(0)
    convert.save_hf(build_model(CFG), CFG, str(d))
    if state:
        (d / "trainer_state.json").write_text(json.dumps({"global_step": 2, "consumed_samples": 4}))
        _record(d)
    weights = d / "model.safetensors"
    data = weights.read_bytes()
    if cut:
        weights.write_bytes(data[:-8])
    return weights, len(data)


@pytest.fixture
def final(tmp_path):
    """A run's final directory (its trainer state) holding its checkpoint-2, its model.safetensors cut short."""
    out = tmp_path / "out"
    out.mkdir()
    _model_dir(out / "checkpoint-2", cut=False)
    weights, _ = _model_dir(out)
    return out, weights


def test_the_advice_is_decided_by_the_directory_and_the_use(tmp_path):
    ckpt, bare, hf = tmp_path / "out" / "checkpoint-4", tmp_path / "bare", tmp_path / "hf"
    for d in (ckpt, bare, hf):
        d.mkdir(parents=True)
    for d in (ckpt, tmp_path / "out", bare):
        (d / "trainer_state.json").write_text("{}")
    for d in (tmp_path / "out", bare):
        _record(d)
    assert advice_for(ckpt, "resume") == Advice("the checkpoint", "resume from another checkpoint", "checkpoint")
    assert advice_for(ckpt, "continue_training").said("incomplete") == (
        "the checkpoint is incomplete: point model_name_or_path to another of the run's checkpoints")
    assert advice_for(ckpt, "inference").said("damaged") == (
        "the checkpoint is damaged: point --model to another checkpoint-N")
    assert advice_for(ckpt, "export").fix == "export another checkpoint-N"
    named = tmp_path / "ckpt"  # our checkpoint by another name (resume_from_checkpoint takes any): its optimizer state
    named.mkdir()
    (named / "trainer_state.json").write_text("{}")
    (named / "optimizer.safetensors").write_bytes(b"")
    _record(named)
    assert advice_for(named, "inference").holder == "the checkpoint"
    assert advice_for(tmp_path / "out", "inference").kind == "final"
    assert advice_for(tmp_path / "out", "inference").said("incomplete") == (
        f"the run's final model is incomplete: point --model to one of its checkpoints (the newest: {ckpt})")
    assert advice_for(bare, "continue_training").said("incomplete") == (
        f"the run's final model is incomplete: point model_name_or_path to another directory (no checkpoint-N of its "
        f"run is in {bare})")
    assert advice_for(hf, "continue_training").said("incomplete") == (
        "download it again, or point model_name_or_path to a complete directory")
    assert advice_for(hf, "inference").said("damaged") == "download it again, or point --model to a complete directory"
    with pytest.raises(ValueError):
        advice_for(hf, "train")


def test_a_file_shorter_than_its_header_length_is_truncated_not_damaged(tmp_path):
    """A 6-byte file said "damaged or truncated; the checkpoint is damaged": it is cut short, so incomplete."""
    (tmp_path / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00")
    with pytest.raises(UserError) as e:
        File(tmp_path / "model.safetensors")
    assert str(e.value) == (f"{tmp_path / 'model.safetensors'}: truncated (6 bytes, shorter than the 8 that give the "
                            f"header's length); the checkpoint is incomplete: resume from another checkpoint")


def test_inference_of_a_runs_final_directory_names_its_checkpoints(final, tmp_path, capsys):
    """`eval` of a run's final directory, its model.safetensors cut short: what that makes of the final model and
    which of its run's checkpoints to point --model to; no resume, no "checkpoint is incomplete"."""
    from pretrain_cli.cli import main
    from pretrain_cli.data.indexed_writer import IndexedDatasetWriter

    out, weights = final
    with IndexedDatasetWriter(str(tmp_path / "c"), dtype=np.uint16) as w:
        w.add_item(np.arange(3, 40))
        w.end_document()
        w.finalize()
    assert main(["eval", "--model", str(out), "--data", str(tmp_path / "c"), "--max_seq_length", "8"]) == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith(f"error: {weights}: truncated (") and "resume" not in line
    assert line.endswith(f"; the run's final model is incomplete: point --model to one of its checkpoints (the "
                         f"newest: {out / 'checkpoint-2'})")


def test_inference_of_a_checkpoint_names_another(tmp_path):
    weights, size = _model_dir(tmp_path / "out" / "checkpoint-2")
    with pytest.raises(UserError) as e:
        load_for_inference(str(weights.parent), CFG, 0)
    assert str(e.value).startswith(f"{weights}: truncated ({size - 8:,} bytes, tensor ")
    assert str(e.value).endswith("; the checkpoint is incomplete: point --model to another checkpoint-N")


def _read_all(source, model) -> None:
    for name, p in model.named_parameters():
        source(name, Box(tuple(p.shape), (0,) * len(p.shape), tuple(p.shape)))


@pytest.mark.parametrize("use", ["continue_training", "resume"])
def test_training_reads_advise_as_the_check_does(tmp_path, use):
    """continue_training from a checkpoint-N read at train time (`open_weights`, the layout's source) said the
    default "resume from another checkpoint" where check said to point model_name_or_path to another; a resume's
    read says to resume from another."""
    weights, _ = _model_dir(tmp_path / "out" / "checkpoint-2")
    paddle.seed(0)
    model = build_model(CFG)
    run = SimpleNamespace(loop=SimpleNamespace(seed=0))
    where = {"resume": weights.parent} if use == "resume" else {"pretrained": weights.parent}
    source = open_weights(run, model, **where)
    with pytest.raises(UserError) as e:
        _read_all(source, model)
    source.close()
    assert str(e.value).endswith({
        "continue_training": "; the checkpoint is incomplete: point model_name_or_path to another of the run's "
                             "checkpoints",
        "resume": "; the checkpoint is incomplete: resume from another checkpoint"}[use])


@pytest.mark.parametrize("checkpoints", [True, False])
def test_export_of_a_damaged_final_directory_says_so(tmp_path, checkpoints):
    """export said "(the run has not written its final model: still training, or stopped before it)" of a final
    directory it had written whole, since cut short."""
    from pretrain_cli.training.export import export_checkpoint

    out = tmp_path / "out"
    out.mkdir()
    if checkpoints:
        _model_dir(out / "checkpoint-2", cut=False)
    weights, _ = _model_dir(out)
    with pytest.raises(UserError) as e:
        export_checkpoint(out, tmp_path / "hf", "float32")
    fix = (f"export one of its checkpoints (the newest: {out / 'checkpoint-2'})" if checkpoints
           else f"export another directory (no checkpoint-N of its run is in {out})")
    line = str(e.value)
    assert line.startswith(f"{out}: cannot export: {weights} is truncated") and "still training" not in line
    assert line.endswith(f"; the run's final model is incomplete: {fix}")


def test_a_model_directory_shipping_a_trainer_state_is_downloaded_again(tmp_path):
    """A Hub snapshot may ship the trainer_state.json transformers' and PaddleNLP's save_state() write (a PaddleNLP
    output_dir with its checkpoint-N too): no run of ours wrote it (no args.json record), so it is fetched again, not
    "the run's final model is incomplete". Our run's output_dir before its final model (args.json, no trainer
    state) is unfinished; a transformers checkpoint-N (trainer state, optimizer.pt) is a checkpoint."""
    snap, pn, ours, hf_ckpt = (tmp_path / n for n in ("snap", "pn", "ours", "hf/checkpoint-500"))
    for d in (snap, pn / "checkpoint-100", ours, hf_ckpt):
        d.mkdir(parents=True)
    for d in (snap, pn, pn / "checkpoint-100", hf_ckpt):
        (d / "trainer_state.json").write_text("{}")
    (hf_ckpt / "optimizer.pt").write_bytes(b"")
    _record(ours)
    for d in (snap, pn):
        advice = advice_for(d, "inference")
        assert advice.kind == "model" and advice.said("incomplete") == (
            "download it again, or point --model to a complete directory"), d
    assert advice_for(ours, "export").kind == "unfinished"
    assert advice_for(hf_ckpt, "inference") == Advice("the checkpoint", "point --model to another checkpoint-N")


def test_export_of_a_damaged_snapshot_is_not_called_a_final_model(tmp_path):
    """export decided "final model" itself (a trainer state, no checkpoint-N name) and picked incomplete or damaged
    by matching the reason's words: now `advice_for`'s kind and the reason's state (`storage.intact`) decide."""
    from pretrain_cli.storage import intact
    from pretrain_cli.training.export import export_checkpoint

    snap = tmp_path / "snap"
    weights, size = _model_dir(snap)
    (snap / "args.json").unlink()
    with pytest.raises(UserError) as e:
        export_checkpoint(snap, tmp_path / "hf", "float32")
    assert str(e.value) == (f"{snap}: cannot export: {weights} is truncated ({size - 8} bytes, its tensors end at "
                            f"{size}); download it again, or export a complete directory")
    assert intact.export_problem(snap).state == "incomplete"
    weights.write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{broken}")  # a header that is no JSON: damaged
    assert intact.export_problem(snap).state == "damaged"
    out = tmp_path / "out"
    weights, _ = _model_dir(out, cut=False)
    weights.write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{broken}")
    with pytest.raises(UserError) as e:
        export_checkpoint(out, tmp_path / "hf", "float32")
    assert str(e.value).endswith(f"; the run's final model is damaged: export another directory (no checkpoint-N of "
                                 f"its run is in {out})"), str(e.value)


def test_export_advice_follows_the_kind_of_directory(tmp_path):
    """A PaddleNLP output_dir (its trainer state and checkpoint-100, no args.json of ours) was told "(the run has not
    written its final model: still training ...)": it is a model to fetch again; that line is for our run's
    output_dir before its final model (args.json, no trainer state) alone."""
    from pretrain_cli.training.export import export_checkpoint

    pn, ours = tmp_path / "pn", tmp_path / "ours"
    for d in (pn, ours):
        weights, size = _model_dir(d)
        _model_dir(d / "checkpoint-100", cut=False)
    (pn / "args.json").unlink()
    (ours / "trainer_state.json").unlink()
    with pytest.raises(UserError) as e:
        export_checkpoint(pn, tmp_path / "hf", "float32")
    assert str(e.value).endswith(f"its tensors end at {size}); download it again, or export a complete directory")
    with pytest.raises(UserError) as e:
        export_checkpoint(ours, tmp_path / "hf", "float32")
    assert str(e.value).endswith(f"its tensors end at {size}) (the run has not written its final model: still "
                                 f"training, or stopped before it); export its newest checkpoint, "
                                 f"{ours / 'checkpoint-100'}")


def test_inference_of_a_checkpoint_missing_a_shard_says_incomplete(tmp_path):
    """load_for_inference said every finding of its checkpoint check "damaged": a shard missing is "incomplete"."""
    from test_weight_sources import CFG as SHARDED_CFG
    from test_weight_sources import _fresh, _sharded_checkpoint

    ckpt = tmp_path / "out" / "checkpoint-2"
    ckpt.parent.mkdir()
    _sharded_checkpoint(_fresh(0), ckpt)
    (ckpt / "trainer_state.json").write_text("{}")
    shard = sorted(ckpt.glob("model*.safetensors"))[-1]
    shard.unlink()
    with pytest.raises(UserError) as e:
        load_for_inference(str(ckpt), SHARDED_CFG, 0)
    assert str(e.value) == f"{shard} is missing; the checkpoint is incomplete: point --model to another checkpoint-N"
