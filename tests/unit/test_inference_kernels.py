"""`eval` and `generate` of a model no run wrote (an HF snapshot: no args.json) take the memory-light attention a
run with `use_flash_attention: true` takes (on CPU the block kernel), which a forward computes exactly as the
materialised scores do; a run's own directory keeps the run's choice."""
import json
import shutil

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


FP16_WHY = ("(precision: fp16 is not applicable on cpu (no half-precision matmul kernels); the run stays fp32): it "
            "runs as it would without it")


def test_a_kernel_key_that_changes_no_kernel_here_is_taken_with_a_note(tmp_path, capsys):
    """`generate --model SNAPSHOT --fp16 true` on CPU was refused ("drop it") though it changes nothing here: one
    note says so and the command runs as without it; a key restating the setting in effect says nothing, and a key
    that is no kernel key is still refused for a model no run wrote."""
    from pretrain_cli.cli import main as cli_main
    from pretrain_cli.errors import UserError
    from pretrain_cli.orchestration.recorded import run_arguments

    model = _snapshot(tmp_path)
    argv = ["generate", "--model", model, "--prompt", "hello", "--max_new_tokens", "4", "--json"]
    assert cli_main([*argv, "--fp16", "true"]) == 0
    out = capsys.readouterr()
    assert [n for n in out.err.splitlines() if "--fp16" in n] == [
        f"note: --fp16 true: changes no kernel generate runs on cpu {FP16_WHY}"]
    assert json.loads(out.out)["tokens"] == _run(capsys, *argv)["tokens"]
    assert run_arguments(None, model, ["--recompute", "true"], "eval")[2] == [
        "note: --recompute true: changes no kernel eval runs on cpu: it runs as it would without it"]
    pair, recorded, notes = run_arguments(None, model, ["--recompute", "true", "--recompute_granularity", "full_attn"],
                                          "eval")
    assert targets.inference_kernels(arguments=pair)[0].fuse_o_proj is False  # together they change a kernel
    assert notes == [] and recorded is False  # a snapshot: the kernel overrides alone, no run's settings
    restated, _, notes = run_arguments(None, model, ["--use_flash_attention", "true"], "eval")
    assert restated.get("use_flash_attention") is True and notes == []
    with pytest.raises(UserError, match="of a model no run wrote only the kernels"):
        run_arguments(None, model, ["--learning_rate", "3"], "eval")


def _counted_parses(monkeypatch) -> list:
    """The paths `parse_config` is called with, wherever a module of ours imported it."""
    import sys

    from pretrain_cli.config import parser

    calls, original = [], parser.parse_config

    def counting(path, *args, **kwargs):
        calls.append(path)
        return original(path, *args, **kwargs)

    for module in [m for name, m in sys.modules.items() if name.startswith("pretrain_cli")]:
        if getattr(module, "parse_config", None) is original:
            monkeypatch.setattr(module, "parse_config", counting)
    return calls


def _fp16_run(tmp_path, precision: str = "fp16") -> tuple[str, str, dict]:
    """(model, run.json, its arguments): a snapshot a run recorded with fp16 (its GPU setting; or `precision`, None
    for fp32) wrote, args.json."""
    model = _snapshot(tmp_path)
    arguments = {"model_name_or_path": model, "input_dir": write_tokens(tmp_path / "t", n_docs=8, doc_len=64,
                                                                        vocab_size=320),
                 "output_dir": model, **({precision: True} if precision else {}), "split": "50,50,0", "max_seq_length": 32,
                 "per_device_eval_batch_size": 1, "eval_iters": 1, "max_steps": 1}
    config = tmp_path / "run.json"
    config.write_text(json.dumps(arguments))
    (tmp_path / "m" / "args.json").write_text(json.dumps({"version": 1, "arguments": arguments, "run": {}}))
    return model, str(config), arguments


def test_a_change_of_a_runs_setting_that_changes_no_kernel_here_runs_with_a_note(tmp_path, capsys, monkeypatch):
    """`--fp16 false` on a run recorded with fp16 (its GPU setting) was refused on CPU: it evaluates, with one note,
    its split through a run's --model, --config alone and --config with --model, and --data's windows; and
    --config's file is parsed once (it was parsed twice, four times with a kernel key; on the --data path six), again
    only without the kernel key."""
    from pretrain_cli.cli import main as cli_main

    model, config, arguments = _fp16_run(tmp_path)
    calls = _counted_parses(monkeypatch)
    note = f"note: --fp16 false: changes no kernel eval runs on cpu {FP16_WHY}"
    for argv, parses in ((["--model", model], None), (["--config", str(config)], 2),
                         (["--config", str(config), "--model", model], 2),
                         (["--config", str(config), "--data", arguments["input_dir"]], 2)):
        calls.clear()
        code, out = cli_main(["eval", *argv, "--fp16", "false", "--json"]), capsys.readouterr()
        assert code == 0, out.err
        assert [n for n in out.err.splitlines() if "--fp16" in n] == [note], out.err
        if parses is not None:
            assert calls.count(str(config)) == parses, calls
        calls.clear()
        as_run = _run(capsys, "eval", *argv, "--json")  # (the same loss with the same kernels: it ran as without it)
        assert {k: v for k, v in json.loads(out.out).items() if k != "seconds"} == \
            {k: v for k, v in as_run.items() if k != "seconds"}
        if parses is not None:
            assert calls.count(str(config)) == 1, calls


def test_what_train_refuses_of_the_kernel_keys_is_refused_on_every_path_with_where_each_came_from(tmp_path, capsys):
    """`--bf16 true` on a run recorded with fp16 was refused through `prepare` (a run's split) but ran with a note
    quoting the refusal on --data's windows and in `generate`; fp16 and bf16 both typed ran on a snapshot. Every path
    refuses them, in `train`'s line naming where each came from and the fix."""
    from pretrain_cli.cli import main as cli_main

    model, config, arguments = _fp16_run(tmp_path)
    record = str(tmp_path / "m" / "args.json")
    switch = "on the command line); choose one precision: pass --fp16 false --bf16 true"
    for argv, source in ((["eval", "--config", config], config), (["eval", "--model", model], record),
                         (["eval", "--config", config, "--data", arguments["input_dir"]], config),
                         (["generate", "--model", model, "--prompt", "hello"], record)):
        code, err = cli_main([*argv, "--bf16", "true"]), capsys.readouterr().err
        assert code == 2 and err.strip().splitlines()[-1] == \
            f"error: fp16, bf16: both are true (fp16 in {source}, --bf16 {switch}", (argv, err)
    snapshot = str(tmp_path / "plain")
    shutil.copytree(model, snapshot, ignore=lambda d, names: ["args.json"])
    for argv in (["generate", "--model", snapshot, "--prompt", "hello"],
                 ["eval", "--model", snapshot, "--data", arguments["input_dir"], "--max_seq_length", "32"]):
        code, err = cli_main([*argv, "--fp16", "true", "--bf16", "true"]), capsys.readouterr().err
        assert code == 2 and err.strip().splitlines()[-1] == ("error: fp16, bf16: both are true (both on the command "
                                                              "line); choose one precision: pass --fp16 false or --bf16 false"), err


def test_a_notes_reasons_are_the_rules_notes_never_a_refusal_and_a_key_given_twice_is_left_out_whole(tmp_path):
    """The switch `--fp16 false --bf16 true` on a run recorded with fp16 noted `--fp16 false` quoting "fp16, bf16:
    both are true" (the conflict of the arguments without it, not of what was typed): `--fp16 false` is what makes
    the switch valid, taken silently, and `--bf16 true` is noted with its own reason. `--fp16 false --fp16 false`
    had no note (leaving out one copy left the other)."""
    from pretrain_cli.orchestration.recorded import run_arguments

    model, _, _ = _fp16_run(tmp_path)
    switched, _, notes = run_arguments(None, model, ["--fp16", "false", "--bf16", "true"], "generate")
    assert (switched.get("fp16"), switched.get("bf16")) == (False, True)
    assert notes == [f"note: --bf16 true: changes no kernel generate runs on cpu {FP16_WHY.replace('fp16', 'bf16')}"]
    assert run_arguments(None, model, ["--fp16", "false", "--fp16", "false"], "eval")[2] == [
        f"note: --fp16 false --fp16 false: changes no kernel eval runs on cpu {FP16_WHY}"]


def test_a_runs_own_precision_this_gpu_lacks_runs_with_a_note_and_only_what_the_overrides_add_is_refused(
        tmp_path, monkeypatch):
    """A run trained in bf16 (on an A100) was refused by `generate --model RUN` and `eval --model RUN --data` on a T4,
    no key typed, with train's line telling the user to edit a file (they ran before: they compute in fp32, as
    Paddle's AMP would there). The record's own bf16 is a note; what the overrides add is refused, in words for the
    command line; a key that changes no kernel is still noted beside the run's bf16."""
    from pretrain_cli.errors import UserError
    from pretrain_cli.orchestration.recorded import run_arguments
    from pretrain_cli.run_config import Target

    monkeypatch.setattr(targets, "inference_target",
                        lambda: Target(device="gpu", gpu_name="Tesla T4", gpu_capability=(7, 5)))
    (tmp_path / "bf16").mkdir(), (tmp_path / "fp32").mkdir()
    model, _, _ = _fp16_run(tmp_path / "bf16", "bf16")
    record = str(tmp_path / "bf16" / "m" / "args.json")
    kept = (f"note: bf16 (in {record}): Tesla T4 has no bf16 tensor cores (compute capability 7.5; bf16 came with "
            f"Ampere, 8.0: A10, A100, L4, H100); generate computes in fp32, as Paddle's AMP would here (train would "
            f"refuse bf16 on this GPU)")
    args, recorded, notes = run_arguments(None, model, [], "generate")
    assert args.get("bf16") is True and recorded and notes == [kept]
    assert run_arguments(None, model, ["--bf16", "true"], "generate")[2] == [kept]  # (a restatement: no change)
    assert run_arguments(None, model, ["--use_flash_attention", "true"], "generate")[2] == [
        kept, "note: --use_flash_attention true: changes no kernel generate runs on gpu (use_flash_attention: Tesla "
              "T4 predates Ampere (no flash-attn-2); the math path runs): it runs as it would without it"]
    assert run_arguments(None, model, ["--bf16", "false"], "generate")[2] == []  # (fp32: no rule refuses it)
    with pytest.raises(UserError) as e:  # a conflict the override adds: refused, the run's bf16 not said again
        run_arguments(None, model, ["--fp16", "true"], "eval")
    assert e.value.lines == [f"fp16, bf16: both are true (bf16 in {record}, --fp16 on the command line); choose one "
                             f"precision: pass --bf16 false --fp16 true"]
    fp32, _, _ = _fp16_run(tmp_path / "fp32", None)
    with pytest.raises(UserError) as e:  # bf16 typed for a run that had none: train's refusal, for the command line
        run_arguments(None, fp32, ["--bf16", "true"], "generate")
    assert e.value.lines == ["bf16: Tesla T4 has no bf16 tensor cores (compute capability 7.5; bf16 came with Ampere, "
                             "8.0: A10, A100, L4, H100), and Paddle's AMP would silently run fp32; pass --bf16 false "
                             "--fp16 true (loss-scaled fp16), or --bf16 false alone for fp32"]


@pytest.mark.parametrize("command", ["eval", "generate"])
def test_eval_and_generate_hand_their_model_to_the_kernel_choice(tmp_path, capsys, monkeypatch, command):
    """The head-width rule of flash attention (`config.compute.flash_width`) is judged on the model evaluated or
    sampled: without it a GPU's `kernels:` line named flash-attn where the width makes the run materialise."""
    seen = []
    real = targets.inference_kernels

    def recording(*a, **kw):
        seen.append(kw.get("model_cfg"))
        return real(*a, **kw)

    monkeypatch.setattr(targets, "inference_kernels", recording)
    model = _snapshot(tmp_path)
    if command == "eval":
        prefix = write_tokens(tmp_path / "c", n_docs=8, doc_len=64, vocab_size=320)
        _run(capsys, "eval", "--model", model, "--data", prefix, "--max_seq_length", "96", "--json")
    else:
        _run(capsys, "generate", "--model", model, "--prompt", "hello world", "--max_new_tokens", "2", "--json")
    assert len(seen) == 1 and isinstance(seen[0], ModelConfig) and seen[0].hidden_size == CFG["hidden_size"]
