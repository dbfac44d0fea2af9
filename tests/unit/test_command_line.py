"""The command line's own errors: a usage error is the usage line and one `error:` line (argparse's own, a missing
argument file, no command), an unknown option suggests the command's closest, and a count below its minimum is
refused before any file is read. (The argument file's keys: test_arg_parser.py.)"""
import pytest


@pytest.mark.parametrize("command", ["train", "plan", "check"])
def test_no_argument_file_says_so_with_the_usage_line(command, capsys):
    from pretrain_cli.cli import main

    assert main([command]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0] == f"usage: pretrain-cli {command} [config.json|config.yaml] [--key value ...]"
    assert err[1].startswith(f"error: no argument file given: `pretrain-cli {command}` needs a JSON or YAML argument file")


def test_help_keys_needs_no_argument_file(capsys):
    """`pretrain-cli train --help-keys`, which train's --help names for the keys' meanings, answered "no argument
    file given": a list of the keys needs none."""
    from pretrain_cli.cli import main

    assert main(["train", "--help-keys"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert any(line.startswith("--max_steps (") for line in out) and len(out) > 100


def test_run_pretrain_py_names_itself_in_its_usage_and_errors(capsys, monkeypatch):
    """`python scripts/run_pretrain.py` with no argument file (or a bad option) answered `usage: pretrain-cli train`:
    a command the user did not run. The script's usage line and errors name the script as it was run."""
    import runpy
    import sys
    from pathlib import Path

    script = str(Path(__file__).resolve().parents[2] / "scripts" / "run_pretrain.py")
    usage = f"usage: python {script} [config.json|config.yaml] [--key value ...]"
    for argv in ([], ["--help"]):
        monkeypatch.setattr(sys, "argv", [script, *argv])
        with pytest.raises(SystemExit) as e:
            runpy.run_path(script, run_name="__main__")
        captured = capsys.readouterr()
        if argv:  # --help: the usage line first, on stdout
            assert e.value.code == 0 and captured.out.splitlines()[0] == usage, captured.out
            continue
        err = captured.err.splitlines()
        assert e.value.code == 2 and err[0] == usage, err
        assert err[1].startswith(f"error: no argument file given: `python {script}` needs a JSON or YAML"), err
    assert len(err) == 2  # not "do_train, do_eval, do_predict: all false" and "output_dir: required"


def _cli(argv, capsys):
    """(exit code, stderr lines) of `pretrain-cli argv`, in process."""
    from pretrain_cli.cli import main

    code = main(argv)
    return code, capsys.readouterr().err.splitlines()


@pytest.mark.parametrize("argv,usage,error", [
    (["preprocess", "--input_path", "x", "--tokenizer", "tok"], "preprocess --input_path INPUT_PATH... --output_prefix",
     "the following arguments are required: --output_prefix"),
    (["eval", "--model", "out", "--batch_size", "abc"], "eval {--model DIR", "argument --batch_size: invalid int value"),
    (["train-tokenizer"], "train-tokenizer --input_path", "required: --input_path, --output_dir, --vocab_size"),
    (["export", "a", "b", "--dtype", "int8"], "export CHECKPOINT OUT_DIR [options]", "argument --dtype: invalid choice"),
    (["export", "a"], "export CHECKPOINT OUT_DIR [options]", "required: out_dir"),
    (["merge-data"], "merge-data OUTPUT INPUTS...", "required: output, inputs"),
    (["inspect-data", "--step", "x"], "inspect-data [PREFIX] [options]", "argument --step: invalid int value"),
    (["plan", "--gpus", "x"], "plan [config.json|config.yaml] [--key value ...]", "argument --gpus: invalid int value"),
    (["generate", "--model", "m"], "generate --model DIR (--prompt TEXT | --prompt_file FILE)",
     "one of the arguments --prompt --prompt_file is required"),
    (["check", "--world_size", "x"], "check [config.json|config.yaml] [--key value ...]", "argument --world_size: invalid int"),
])
def test_a_usage_error_is_the_usage_line_and_one_error_line(argv, usage, error, capsys):
    code, err = _cli(argv, capsys)
    assert code == 2 and len(err) == 2, err  # not argparse's usage block of up to 9 lines
    assert err[0].startswith(f"usage: pretrain-cli {usage}")
    assert err[1].startswith("error: ") and error in err[1] and err[1].endswith(f"`pretrain-cli {argv[0]} --help` lists the options")


def test_no_command_is_a_usage_error(capsys):
    code, err = _cli([], capsys)
    assert code == 2 and err[0] == "usage: pretrain-cli [--debug] <command> [options]" and len(err) == 2
    assert err[1].startswith("error: no command given; one of train, check, plan,")
    assert _cli(["--help"], capsys)[0] == 0


@pytest.mark.parametrize("argv,suggestion", [
    (["generate", "--model", "micro-qwen2", "--prompt", "hi", "--max_new_token", "5"],
     "unknown option `--max_new_token`; did you mean `--max_new_tokens`?"),
    (["eval", "--model", "micro-qwen2", "--data", "d", "--batchsize", "4"],
     "unknown option `--batchsize`; did you mean `--batch_size`?"),
    (["plan", "cfg.json", "--fitt"], "unknown option `--fitt`; did you mean `--fit`?"),
    (["check", "--list_model"], "unknown option `--list_model`; did you mean `--list_models`?"),
    (["eval", "--model", "micro-qwen2", "--data", "d", "--max_seq_lenght", "8"],
     "unknown option `--max_seq_lenght`; did you mean `--max_seq_length`?"),
    (["generate", "--model", "m", "--prompt", "hi", "--use_flash_atention", "0"],
     "unknown key `use_flash_atention`; did you mean `use_flash_attention`?"),  # a training key stays one
    # before argparse's "the following arguments are required: --input_path" / "unrecognized arguments: --append-eos"
    (["preprocess", "--input", "c.jsonl", "--output_prefix", "o", "--tokenizer", "t"],
     "unknown option `--input`; did you mean `--input_path`?"),
    (["preprocess", "--input_path", "c.jsonl", "--output_prefix", "o", "--tokenizer", "t", "--append-eos"],
     "unknown option `--append-eos`; did you mean `--append_eos`?"),
    (["train-tokenizer", "--input_path", "c.jsonl", "--output", "t", "--vocab_size", "300"],
     "unknown option `--output`; did you mean `--output_dir`?"),
    (["generate", "--model", "m", "--promt", "hi"], "unknown option `--promt`; did you mean `--prompt`?"),
])
def test_did_you_mean_knows_the_commands_own_options(argv, suggestion, capsys):
    code, err = _cli(argv, capsys)
    assert code == 2 and err == [f"error: command line: {suggestion}"]


@pytest.mark.parametrize("argv,error", [
    (["eval", "--model", "m", "--data", "d", "--max_seq_length", "0"], "--max_seq_length: must be >= 1, got 0"),
    (["eval", "--config", "c.json", "--max_batches", "0"], "--max_batches: must be >= 1, got 0"),
    (["eval", "--model", "m", "--data", "d", "--batch_size", "-2"], "--batch_size: must be >= 1, got -2"),
    (["inspect-data", "d", "--step", "1", "--batch_size", "0"], "--batch_size: must be >= 1, got 0"),
    (["inspect-data", "d", "--step", "1", "--data_ranks", "0"], "--data_ranks: must be >= 1, got 0"),
    (["inspect-data", "d", "--step", "1", "--dp_size", "0"], "--data_ranks: must be >= 1, got 0"),  # its older name
    (["inspect-data", "d", "--step", "1", "--gradient_accumulation_steps", "0"],
     "--gradient_accumulation_steps: must be >= 1, got 0"),
    (["preprocess", "--input_path", "x", "--output_prefix", "o", "--tokenizer", "t", "--workers", "0"],
     "--workers: must be >= 1, got 0"),
    (["preprocess", "--input_path", "x", "--output_prefix", "o", "--tokenizer", "t", "--max_doc_num", "0"],
     "--max_doc_num: must be >= 1, got 0"),
    (["preprocess", "--input_path", "x", "--output_prefix", "o", "--tokenizer", "t", "--log_interval", "-1"],
     "--log_interval: must be >= 0, got -1"),
    (["train-tokenizer", "--input_path", "x", "--output_dir", "o", "--vocab_size", "300", "--min_frequency", "-3"],
     "--min_frequency: must be >= 0, got -3"),
])
def test_a_count_below_its_minimum_is_one_line_before_any_file_is_read(argv, error, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # none of the named files exists: the count is checked first
    code, err = _cli(argv, capsys)
    assert code == 2 and err == [f"error: {error}"]
    assert list(tmp_path.iterdir()) == []
