"""`eval` and `generate` of a model no run wrote (an HF snapshot: no args.json) take the memory-light attention a
run with `use_flash_attention: true` takes (on CPU the block kernel), which a forward computes exactly as the
materialised scores do; a run's own directory keeps the run's choice."""
import json

import numpy as np
import pytest

from pretrain_cli import runtime

paddle = runtime.import_paddle()

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


def _snapshot(tmp_path):
    """An export no run wrote (no args.json), with a tokenizer for `generate`."""
    from data_helpers import make_tokenizer

    cfg = ModelConfig(**{**CFG, "vocab_size": 320}, initializer_range=0.2)
    paddle.seed(0)
    convert.save_hf(build_model(cfg), cfg, str(tmp_path / "m"))
    make_tokenizer(tmp_path / "m")
    return str(tmp_path / "m")


def _run(capsys, *argv):
    from pretrain_cli.cli import main as cli_main

    code = cli_main(list(argv))
    out = capsys.readouterr()
    assert code == 0, out.err
    return json.loads(out.out.strip().splitlines()[-1])


def test_eval_of_a_snapshot_runs_the_block_kernel_with_the_scores_paths_loss(tmp_path, capsys):
    """`--use_flash_attention false` selects the scores' path on a snapshot (it was refused: "pass --config
    FILE"), and computes the block kernel's loss."""
    assert cpu_ops.load() is not None  # else both runs are sdpa_mask and the comparison says nothing
    prefix = write_tokens(tmp_path / "c", n_docs=8, doc_len=64, vocab_size=320)
    model = _snapshot(tmp_path)
    argv = ["eval", "--model", model, "--data", prefix, "--max_seq_length", "96", "--json"]
    block = _run(capsys, *argv)
    assert block["kernels"].startswith("attention=cpu ")
    scores = _run(capsys, *argv, "--use_flash_attention", "false")
    assert scores["kernels"].startswith("attention=sdpa_mask ")
    np.testing.assert_allclose(block["loss"], scores["loss"], rtol=1e-6)
    assert block["tokens"] == scores["tokens"] == 5 * 96  # (512 - 1) // 96 windows


def test_generate_of_a_snapshot_runs_the_block_kernel_with_the_scores_paths_tokens(tmp_path, capsys):
    assert cpu_ops.load() is not None
    model = _snapshot(tmp_path)
    argv = ["generate", "--model", model, "--prompt", "hello world", "--max_new_tokens", "8", "--json"]
    block = _run(capsys, *argv)
    scores = _run(capsys, *argv, "--use_flash_attention", "false")
    assert block["kernels"].startswith("attention=cpu ") and scores["kernels"].startswith("attention=sdpa_mask ")
    assert block["tokens"] == scores["tokens"] and len(block["tokens"]) == 8  # greedy: the same logits' argmax


def test_a_kernel_key_that_changes_no_kernel_here_is_refused_naming_why(tmp_path, capsys):
    """`generate --model SNAPSHOT --fp16 true` on CPU was accepted and changed nothing, silently (kernels_for's
    notes went to a throwaway list); a key restating the setting in effect is still taken."""
    from pretrain_cli.cli import main as cli_main
    from pretrain_cli.errors import UserError
    from pretrain_cli.orchestration.recorded import run_arguments

    model = _snapshot(tmp_path)
    code = cli_main(["generate", "--model", model, "--prompt", "hello", "--fp16", "true"])
    assert code == 2 and capsys.readouterr().err.splitlines()[-1] == (
        "error: --fp16 true: changes no kernel generate runs on cpu (precision: fp16 is not applicable on cpu (no "
        "half-precision matmul kernels); the run stays fp32); drop it")
    with pytest.raises(UserError) as e:  # a training memory lever alone: nothing to say but that
        run_arguments(None, model, ["--recompute", "true"], "eval")
    assert str(e.value) == "--recompute true: changes no kernel eval runs on cpu; drop it"
    pair, recorded = run_arguments(None, model, ["--recompute", "true", "--recompute_granularity", "full_attn"], "eval")
    assert targets.inference_kernels(arguments=pair)[0].fuse_o_proj is False  # together they change a kernel
    assert recorded is False  # a snapshot: the kernel overrides alone, no run's settings
    assert run_arguments(None, model, ["--use_flash_attention", "true"], "eval")[0].get("use_flash_attention") is True


def test_a_kernel_key_that_changes_no_kernel_is_refused_on_a_runs_split_too(tmp_path, capsys):
    """`eval --config run.json --fp16 true` and `eval --model RUN_DIR --fp16 true` evaluate the run's split: the
    check ran on the --data path alone, so these ran fp32 and said nothing."""
    from pretrain_cli.cli import main as cli_main
    from pretrain_cli.orchestration.recorded import run_arguments

    model = _snapshot(tmp_path)
    config = tmp_path / "run.json"
    config.write_text(json.dumps({"model_name_or_path": model, "input_dir": str(tmp_path / "none"),
                                  "output_dir": str(tmp_path / "out")}))
    want = "error: --fp16 true: changes no kernel eval runs on cpu (precision: fp16 is not applicable on cpu"
    assert cli_main(["eval", "--config", str(config), "--fp16", "true"]) == 2
    assert capsys.readouterr().err.splitlines()[-1].startswith(want)
    run_dir = tmp_path / "m"  # a run's directory: its args.json record stands for --config
    record = {"version": 1, "arguments": json.loads(config.read_text()), "run": {}}
    (run_dir / "args.json").write_text(json.dumps(record))
    assert run_arguments(None, run_dir, [], "eval")[1] is True  # its settings are a run's
    assert cli_main(["eval", "--model", str(run_dir), "--fp16", "true"]) == 2
    assert capsys.readouterr().err.splitlines()[-1].startswith(want)
