"""A run's output_dir that still holds the model it held before the run (a download, recorded in args.json as
`weights_before_the_run`) beside the run's checkpoints: `eval --model K` reads its newest checkpoint (saying so), and
`pretrain-cli export K` and `continue_training` from K ask the same judge (`final_model.unfinished_run`): they refuse,
naming that checkpoint. Before, export wrote the download out bit for bit and continue_training loaded it as the
run's pretrained weights, neither saying so."""
import json

import pytest

from pretrain_cli import runtime
from pretrain_cli.config.parser import parse_config
from pretrain_cli.errors import UserError
from pretrain_cli.orchestration.opened import build_model_config
from pretrain_cli.orchestration.recorded import model_argument
from pretrain_cli.training import export, final_model

paddle = runtime.import_paddle()

from pretrain_cli.models import build_model, convert  # noqa: E402
from pretrain_cli.models.config import ModelConfig  # noqa: E402

CFG = ModelConfig(model_type="qwen2", vocab_size=51, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32, tie_word_embeddings=True,
                  bos_token_id=1, eos_token_id=2)


def _run_over_a_download(tmp_path):
    out = tmp_path / "K"
    convert.save_hf(build_model(CFG), CFG, str(out))  # a model directory, as downloaded
    record = {"arguments": {}, "run": {}, final_model.BEFORE_RUN: final_model.weights_before_the_run(out)}
    (out / "args.json").write_text(json.dumps(record))  # a run started there (overwrite_output_dir)
    (out / "checkpoint-20").mkdir()  # and saved, then stopped before its export
    return out


def test_export_and_continue_training_refuse_a_download_and_name_the_checkpoint_eval_reads(tmp_path):
    out = _run_over_a_download(tmp_path)
    newest = out / "checkpoint-20"
    assert model_argument(str(out))[0] == str(newest)
    said = (f"{out} holds no final model of its run yet (still training, or stopped before its export; "
            f"model.safetensors there is the model {out} held before the run, not trained by it); ")
    with pytest.raises(UserError) as e:
        export.export_checkpoint(out, tmp_path / "Kx", "float32")
    assert str(e.value) == f"{said}export its newest checkpoint, {newest}, which eval --model {out} reads"
    assert not (tmp_path / "Kx").exists()
    args = parse_config(None, ["--model_name_or_path", str(out), "--continue_training", "1",
                               "--output_dir", str(tmp_path / "next")])
    with pytest.raises(UserError) as e:
        build_model_config(args)
    assert str(e.value) == (f"model_name_or_path: {said}point it at its newest checkpoint, {newest}, which eval "
                            f"--model {out} reads")
    # resuming in its own output_dir reads its checkpoint: not asked
    args = parse_config(None, ["--model_name_or_path", str(out), "--continue_training", "1", "--output_dir", str(out)])
    assert build_model_config(args)[0] == out


def test_the_runs_own_export_is_exported(tmp_path):
    out = _run_over_a_download(tmp_path)
    convert.save_hf(build_model(CFG), CFG, str(out))  # the run's final export replaces the download
    files, _, _ = export.export_checkpoint(out, tmp_path / "Kx", "float32")
    assert files == ["model.safetensors"] and (tmp_path / "Kx" / "config.json").is_file()


def test_export_of_weights_under_other_names_alone_is_refused_before_it_writes(tmp_path):
    """A model directory holding only model_ema.safetensors (transformers raises OSError there) was exported as the
    model; refused now (`model_files.find_weights`), before out.tmp is made."""
    src = tmp_path / "E"
    convert.save_hf(build_model(CFG), CFG, str(src))
    (src / "model.safetensors").rename(src / "model_ema.safetensors")
    with pytest.raises(UserError, match=r"holds weights only under names not read as a model \(model_ema"):
        export.export_checkpoint(src, tmp_path / "Ex", "float32")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["E"]
