"""`eval` and `generate` of a model no run wrote (an HF snapshot: no args.json) take the memory-light attention a
run with `use_flash_attention: true` takes (on CPU the block kernel), which a forward computes exactly as the
materialised scores do; a run's own directory keeps the run's choice."""
import argparse
import json

import numpy as np

from pretrain_cli import runtime

paddle = runtime.import_paddle()

from pretrain_cli.commands import eval as evaluate  # noqa: E402
from pretrain_cli.config.parser import parse_config  # noqa: E402
from pretrain_cli.models import build_model, convert  # noqa: E402
from pretrain_cli.models.config import ModelConfig  # noqa: E402
from pretrain_cli.ops import cpu_ops  # noqa: E402
from pretrain_cli.orchestration import targets  # noqa: E402
from data_helpers import write_tokens  # noqa: E402

CFG = dict(model_type="qwen2", vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
           num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)


def test_a_model_no_run_wrote_asks_for_the_memory_light_attention():
    """The old request was an argument file without kernel keys: use_flash_attention false, the scores' path."""
    assert targets.inference_kernels()[0].attention == "flash"
    ran_math = parse_config(None, ["--use_flash_attention", "false"])  # a run's record keeps its own choice
    assert targets.inference_kernels(arguments=ran_math)[0].attention == "math"


def test_eval_of_a_snapshot_runs_the_block_kernel_with_the_scores_paths_loss(tmp_path, capsys, monkeypatch):
    prefix = write_tokens(tmp_path / "c", n_docs=8, doc_len=64, vocab_size=CFG["vocab_size"])
    cfg = ModelConfig(**CFG, initializer_range=0.2)
    paddle.seed(0)
    convert.save_hf(build_model(cfg), cfg, str(tmp_path / "m"))
    parser = argparse.ArgumentParser()
    evaluate.add_arguments(parser)
    argv = ["--model", str(tmp_path / "m"), "--data", prefix, "--max_seq_length", "96", "--json"]
    ns = lambda: parser.parse_args(argv)  # noqa: E731
    assert evaluate.main(ns()) == 0
    block = json.loads(capsys.readouterr().out)
    assert block["kernels"].startswith("attention=cpu " if cpu_ops.load() is not None else "attention=sdpa_mask ")
    old = targets.inference_kernels
    monkeypatch.setattr(targets, "inference_kernels",  # the old request: no kernel keys at all
                        lambda run=None, arguments=None: old(run, arguments or parse_config(None, [])))
    assert evaluate.main(ns()) == 0
    scores = json.loads(capsys.readouterr().out)
    assert scores["kernels"].startswith("attention=sdpa_mask ")
    np.testing.assert_allclose(block["loss"], scores["loss"], rtol=1e-6)
    assert block["tokens"] == scores["tokens"] == 5 * 96  # (512 - 1) // 96 windows
