"""A checkpoint-N that PaddleNLP's Trainer wrote, met by auto-resume in a reused output_dir or named by
resume_from_checkpoint: one line saying what it is and how its weights carry over, where it read as damage ("every
checkpoint is damaged ...; remove them") before (`storage.intact.paddlenlp_checkpoint`)."""
import json

import pytest

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
