"""A checkpoint-N that PaddleNLP's Trainer wrote, met by auto-resume in a reused output_dir or named by
resume_from_checkpoint: one line saying what it is and how its weights carry over, where it read as damage ("every
checkpoint is damaged ...; remove them") before (`storage.intact.paddlenlp_checkpoint`)."""
import json

import numpy as np
import pytest
from safetensors.numpy import save_file

from data_helpers import write_tokens
from pretrain_cli.errors import UserError
from pretrain_cli.orchestration.prepare import prepare
from pretrain_cli.run_config import Target
from pretrain_cli.storage import intact


def _paddlenlp_checkpoint(path):
    """What PaddleNLP's Trainer leaves in checkpoint-N besides its weights: a trainer_state.json without
    consumed_samples, its pickled arguments, schedule and RNG state."""
    path.mkdir(parents=True)
    (path / "trainer_state.json").write_text(json.dumps({"global_step": 10, "max_steps": 60, "log_history": []}))
    (path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    for name in ("training_args.bin", "scheduler.pdparams", "rng_state_0.pth"):
        (path / name).write_bytes(b"")
    return path


def _args(tmp_path, **keys) -> str:
    write_tokens(tmp_path / "data", vocab_size=512)
    path = tmp_path / "args.json"
    path.write_text(json.dumps({"model_name_or_path": "micro-llama", "do_train": True, "max_steps": 20,
                                "input_dir": str(tmp_path / "data"), "max_seq_length": 32, **keys}))
    return str(path)


def test_a_paddlenlp_checkpoint_is_named_as_such_not_as_damage(tmp_path):
    ckpt = _paddlenlp_checkpoint(tmp_path / "pnlp" / "checkpoint-10")
    line = (rf"{ckpt} is a checkpoint of PaddleNLP's Trainer \(training_args.bin\), which pretrain-cli does not "
            rf"resume .*start from its weights instead: model_name_or_path: {ckpt}, continue_training: true, and "
            rf"another output_dir$")
    with pytest.raises(UserError, match=line) as reused:  # its run's output_dir, auto-resumed
        prepare(_args(tmp_path, output_dir=str(tmp_path / "pnlp")), [], Target())
    with pytest.raises(UserError, match="^resume_from_checkpoint: " + line) as named:
        prepare(_args(tmp_path, output_dir=str(tmp_path / "out"), resume_from_checkpoint=str(ckpt)), [], Target())
    for e in (reused, named):
        assert "\n" not in str(e.value) and "damaged" not in str(e.value)
    (ckpt / "args.json").write_text("{}")  # one of ours, whatever else lies in it, is checked as ours
    assert intact.paddlenlp_checkpoint(ckpt) is None and "consumed_samples" in intact.problem(ckpt)


def test_overwrite_output_dir_does_not_remove_a_paddlenlp_checkpoint(tmp_path):
    """PaddleNLP's overwrite_output_dir only stops its resume; here it removes an earlier run's checkpoints, which a
    PaddleNLP checkpoint is not: refused, and the checkpoint stays."""
    ckpt = _paddlenlp_checkpoint(tmp_path / "pnlp" / "checkpoint-10")
    with pytest.raises(UserError, match=rf"^output_dir: {ckpt} is a checkpoint of PaddleNLP's Trainer, which "
                                        rf"overwrite_output_dir would remove"):
        prepare(_args(tmp_path, output_dir=str(tmp_path / "pnlp"), overwrite_output_dir=True), [], Target())
    assert (ckpt / "training_args.bin").is_file()


def _unified(path, optimizer: bool = True):
    """PaddleNLP's unified checkpoint without the Trainer's other files (a copy of its weights and optimizer): its
    rank's shard even for one process, transformers' index of it, its optimizer's index, and a trainer_state.json
    with consumed_samples (the W6 walk's checkpoint-5 read as "every checkpoint is damaged ...; remove them")."""
    path.mkdir(parents=True)
    (path / "trainer_state.json").write_text(json.dumps({"global_step": 5, "consumed_samples": 80, "log_history": []}))
    (path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    shard = "model-00001-of-00001.safetensors"
    save_file({"llama.embed_tokens.weight": np.zeros((4, 2), np.float32)}, str(path / shard),
              metadata={"format": "np"})  # (Paddle's numpy writer's, Paddle's names)
    (path / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": 32}, "weight_map": {"llama.embed_tokens.weight": shard}}))
    if optimizer:
        (path / "optimizer-00001-of-00001.safetensors").write_bytes(b"")
        (path / "optimizer.safetensors.index.json").write_text(json.dumps({"weight_map": {}}))
    return path


@pytest.mark.parametrize("optimizer", [True, False])
def test_paddlenlp_unified_checkpoint_without_its_trainer_files_is_named_not_damage(tmp_path, optimizer):
    ckpt = _unified(tmp_path / "pnres" / "checkpoint-5", optimizer)
    with pytest.raises(UserError) as e:
        prepare(_args(tmp_path, output_dir=str(tmp_path / "pnres")), [], Target())
    line = str(e.value)
    assert line.startswith(f"{ckpt} is a checkpoint of PaddleNLP's Trainer (")
    assert line.endswith(f"start from its weights instead: model_name_or_path: {ckpt}, continue_training: true, and "
                         f"another output_dir")
    assert "\n" not in line and "damaged" not in line and "remove" not in line
    assert all(p.exists() for p in ckpt.iterdir())


def test_paddlenlp_pickled_checkpoint_says_to_save_its_weights_as_safetensors(tmp_path):
    ckpt = tmp_path / "pn" / "checkpoint-5"
    ckpt.mkdir(parents=True)
    (ckpt / "trainer_state.json").write_text(json.dumps({"global_step": 5, "consumed_samples": 80}))
    for name in ("model_state.pdparams", "optimizer.pdopt"):
        (ckpt / name).write_bytes(b"")
    line = intact.paddlenlp_checkpoint(ckpt)
    assert "(model_state.pdparams)" in line and "save its weights as safetensors (model_state.pdparams is a " \
        f"pickle, not read here; in PaddleNLP, load the model from it and call model.save_pretrained(\"{ckpt}\", " \
        "safe_serialization=True)), then model_name_or_path: " in line


def test_a_model_directory_or_our_checkpoint_is_not_paddlenlps(tmp_path):
    """transformers' shards without a trainer_state.json are a model, not a checkpoint; ours has checkpoint.index.json,
    and its shards say "pt" (its args.json or index lost, it is still judged as ours: damage, not PaddleNLP's)."""
    model = _unified(tmp_path / "model")
    (model / "trainer_state.json").unlink()
    assert intact.paddlenlp_checkpoint(model) is None
    ours = _unified(tmp_path / "out" / "checkpoint-5", optimizer=False)
    (ours / "checkpoint.index.json").write_text("{}")
    assert intact.paddlenlp_checkpoint(ours) is None
    (ours / "checkpoint.index.json").unlink()  # ours without its index: its shards' metadata says "pt"
    save_file({"model.embed_tokens.weight": np.zeros((4, 2), np.float32)},
              str(ours / "model-00001-of-00001.safetensors"), metadata={"format": "pt"})
    assert intact.paddlenlp_checkpoint(ours) is None
