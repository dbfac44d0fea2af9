"""The command line as users meet it: help, check, the script entry, SIGTERM, out of memory, a YAML argument file
(PaddleNLP's own files: tests/e2e/test_paddlenlp_pretrain_files.py; `check --world_size`:
tests/e2e/test_check_world_size.py)."""
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pretrain_cli.cli import main as cli_main

from e2e_helpers import write_config

REPO = Path(__file__).resolve().parents[2]


def run(*argv, cwd=None, timeout=300):
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"))
    return subprocess.run([sys.executable, "-m", "pretrain_cli", *map(str, argv)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_help_lists_commands_without_importing_paddle():
    code = ("import sys; from pretrain_cli.cli import COMMANDS, build_parser, main; rc = main(['--help']); "
            "rc2 = main(['check', '/nonexistent.json']); [build_parser(name) for name in COMMANDS]; "
            "print(rc, rc2, 'paddle' in sys.modules, 'matplotlib' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         env=dict(os.environ, PYTHONPATH=str(REPO / "src")))
    assert out.stdout.strip().splitlines()[-1] == "0 2 False False"
    for name in ("train", "check", "plan", "train-tokenizer", "preprocess", "inspect-data", "eval", "generate"):
        assert name in out.stdout
    for sub in ("train", "preprocess", "eval", "generate", "plan"):
        r = run(sub, "--help")
        assert r.returncode == 0 and "usage: pretrain-cli " + sub in r.stdout


def test_every_option_has_help_with_its_default():
    import argparse

    from pretrain_cli.cli import COMMANDS, build_parser

    for name in COMMANDS:
        parser, _, _ = build_parser(name)
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            where = f"pretrain-cli {name} {'/'.join(action.option_strings) or action.dest}"
            assert action.help, where
            text = parser._get_formatter()._expand_help(action)
            if action.option_strings and not action.required and action.nargs != 0:  # a value with a default
                assert "default" in text or "required" in text, where
            if action.default not in (None, False):
                shown = action.default if isinstance(action.default, list) else [action.default]
                assert all(str(v) in text for v in shown), where


@pytest.mark.parametrize("content,fragment", [
    ('{"max_seq_lenght": 5}', "did you mean `max_seq_length`?"),
    ('{"max_steps": "many"}', "`max_steps` expects int, got 'many'"),
    ('{"max_steps": 5,,}', "cfg.json:1:17: invalid JSON"),
    ('{"do_train": true, "max_steps": 5, "output_dir": "o", "input_dir": "/no/such/dir"}', "/no/such/dir"),
])
def test_check_failures_are_one_line_exit_2(tmp_path, content, fragment):
    (tmp_path / "cfg.json").write_text(content)
    r = run("check", tmp_path / "cfg.json")
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and fragment in lines[0] and lines[0].startswith("error: ")
    assert "Traceback" not in r.stderr + r.stdout


def test_check_lists_every_problem_in_one_run(tmp_path):
    """The issue's example: no tokenizer directory, no input_dir, and a split that gives the needed valid
    split a 0 share: one `check` names all three, one line each, exit 2."""
    cfg = {"model_name_or_path": "micro-qwen2", "tokenizer_name_or_path": "./tok", "input_dir": "./data",
           "output_dir": "./out", "split": "100,0,0", "do_train": True, "do_eval": True, "max_steps": 10,
           "max_seq_length": 32}
    (tmp_path / "cfg.json").write_text(json.dumps(cfg))
    r = run("check", "cfg.json", cwd=tmp_path)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and "Traceback" not in r.stderr + r.stdout
    assert len(lines) == 3 and all(line.startswith("error: ") for line in lines), lines
    assert lines[0].startswith("error: split: '100,0,0' gives the valid split a share of 0")
    assert lines[1].startswith("error: tokenizer_name_or_path: './tok'") and "train-tokenizer" in lines[1]
    assert lines[2].startswith("error: input_dir: ./data: no token files") and "pretrain-cli preprocess" in lines[2]


def test_a_larger_tokenizer_than_the_preset_is_one_line_naming_vocab_size_and_then_trains(corpus, tmp_path,
                                                                                        capsys):
    """train-tokenizer --vocab_size 600 and a 512-token preset: `check` names --vocab_size 600; with it the model
    is built to the tokenizer's size and a short run trains and exports that size (on data that tokenizer made:
    the corpus' own token files are refused, made by another)."""
    assert cli_main(["train-tokenizer", "--input_path", str(corpus / "corpus.jsonl"), "--output_dir",
                     str(tmp_path / "tok"), "--vocab_size", "600"]) == 0
    cfg = write_config(tmp_path, corpus, tokenizer_name_or_path=str(tmp_path / "tok"), max_steps=1, save_steps=1)
    capsys.readouterr()
    assert cli_main(["check", cfg]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "has 600 tokens but the model's vocab_size is 512" in err[0] and "--vocab_size 600" in err[0]
    assert cli_main(["check", cfg, "--vocab_size", "600"]) == 2
    assert "docs.json: made by another tokenizer than" in capsys.readouterr().err
    assert cli_main(["preprocess", "--input_path", str(corpus / "corpus.jsonl"), "--output_prefix",
                     str(tmp_path / "data" / "docs"), "--tokenizer", str(tmp_path / "tok")]) == 0
    cfg = write_config(tmp_path, corpus, tokenizer_name_or_path=str(tmp_path / "tok"), max_steps=1, save_steps=1,
                       input_dir=str(tmp_path / "data"))
    assert cli_main(["train", cfg, "--vocab_size", "600"]) == 0
    assert json.loads((tmp_path / "out" / "config.json").read_text())["vocab_size"] == 600
    assert cli_main(["check", cfg, "--vocab_size", "600", "--continue_training", "true"]) == 2
    assert "vocab_size: 600 resizes the model, but continue_training" in capsys.readouterr().err
    # a layer count other than the pretrained weights' is refused by check as by train, naming the key
    layers = json.loads((tmp_path / "out" / "config.json").read_text())["num_hidden_layers"]
    warm = ["check", cfg, "--model_name_or_path", str(tmp_path / "out"), "--continue_training", "true",
            "--output_dir", str(tmp_path / "warm")]
    assert cli_main(warm + ["--num_hidden_layers", str(layers + 1)]) == 2
    assert (f"num_hidden_layers: {layers + 1} changes the model, but continue_training loads pretrained weights of "
            f"{layers} layers; drop one of them") in capsys.readouterr().err
    assert cli_main(warm + ["--num_hidden_layers", str(layers)]) == 0


@pytest.mark.parametrize("async_save", [False, True])
def test_run_pretrain_script_and_sigterm_save(corpus, tmp_path, async_save):
    """SIGTERM: the step finishes, a checkpoint is saved (with async_save the exit waits for the background
    writer, so the checkpoint is there, complete, when the process has gone)."""
    cfg = write_config(tmp_path, corpus, max_steps=400, save_steps=1000, logging_steps=1, async_save=async_save)
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"))
    proc = subprocess.Popen([sys.executable, str(REPO / "scripts" / "run_pretrain.py"), cfg],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    seen = []
    deadline = time.time() + 120
    for line in proc.stdout:
        seen.append(line)
        if "global_step: 3," in line:
            proc.send_signal(signal.SIGTERM)
            break
        assert time.time() < deadline
    rest, _ = proc.communicate(timeout=120)
    text = "".join(seen) + rest
    assert proc.returncode == 0, text
    assert "re-run the same command to resume" in text
    assert "No ccache found" not in text and "Modified FLAGS" not in text  # Paddle's import noise stays out
    ckpts = sorted((tmp_path / "out").glob("checkpoint-*"))
    assert len(ckpts) == 1
    step = json.loads((ckpts[0] / "trainer_state.json").read_text())["global_step"]
    assert 3 <= step < 400
    assert (ckpts[0] / "optimizer.safetensors").is_file() and not list((tmp_path / "out").glob("*.tmp"))
    assert f"checkpoint-{step}: stalled" in text and ("(async)" if async_save else "(sync)") in text
    assert not (tmp_path / "out" / "model.safetensors").exists()  # not a finished run
    assert (tmp_path / "out" / "loss_curve.png").read_bytes()[:4] == b"\x89PNG"  # drawn at the checkpoint


def test_fresh_clone_check_and_shipped_configs_parse():
    r = run("check", "configs/tiny_cpu.json", cwd=REPO)
    assert r.returncode == 0 and "check: OK" in r.stdout, r.stderr
    from pretrain_cli.config.parser import parse_config
    from pretrain_cli.orchestration.opened import build_model_config
    from pretrain_cli.config.resolve import resolve
    from pretrain_cli.run_config import Target

    names = sorted(p.name for p in (REPO / "configs").glob("*.json"))
    assert {"qwen3-0.6b_pretrain.json", "llama-3.2-1b_pretrain.json", "qwen2.5-0.5b_pretrain.json"} <= set(names)
    for name in names:
        args = parse_config(str(REPO / "configs" / name))
        resolved = resolve(args, build_model_config(args)[1], Target("gpu"))
        assert resolved.schedule.decay_steps > resolved.schedule.warmup_steps >= 1
    for name, family in (("qwen3-0.6b_pretrain.json", "qwen3"), ("llama-3.2-1b_pretrain.json", "llama")):
        args = parse_config(str(REPO / "configs" / name))
        assert build_model_config(args)[1].model_type == family and args.training.bf16
        assert resolve(args, build_model_config(args)[1], Target("gpu")).data.attention_mask_type == "document"
    qwen = parse_config(str(REPO / "configs" / "qwen2.5-0.5b_pretrain.json"))
    assert qwen.training.bf16 and not qwen.training.fp16  # Qwen2 overflows in fp16


def test_debug_shows_the_traceback_that_is_hidden_otherwise(tmp_path):
    (tmp_path / "cfg.json").write_text('{"max_stepz": 1}')
    plain = run("check", tmp_path / "cfg.json")
    debug = run("--debug", "check", tmp_path / "cfg.json")
    assert plain.returncode == debug.returncode == 2
    assert "Traceback" not in plain.stderr and "Traceback" in debug.stderr
    assert debug.stderr.strip().splitlines()[-1] == plain.stderr.strip()


OOM_CHILD = """
import resource, sys
from pretrain_cli import runtime
runtime.import_paddle()
vm = int(open("/proc/self/statm").read().split()[0]) * resource.getpagesize()
resource.setrlimit(resource.RLIMIT_AS, (vm + 2**30, resource.RLIM_INFINITY))  # 1 GiB more than after the import
from pretrain_cli.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_out_of_memory_is_one_line_with_the_step_and_the_fitted_layout(corpus, tmp_path):
    """A real MemoryError: a resumed run with a micro-batch that needs ~8 GiB under a 1 GiB address-space limit.
    One line naming the step and plan's fitted layout, exit 1, no traceback, the checkpoint untouched."""
    cfg = write_config(tmp_path, corpus, max_steps=2, save_steps=2)
    assert cli_main(["train", cfg]) == 0
    ckpt = tmp_path / "out" / "checkpoint-2"
    before = {p.name: p.read_bytes() for p in ckpt.iterdir()}
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"))
    r = subprocess.run([sys.executable, "-c", OOM_CHILD, "train", cfg, "--per_device_train_batch_size", "16384",
                        "--max_steps", "4"], capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 1, r.stderr[-3000:]
    assert "Traceback" not in r.stderr + r.stdout
    errors = [line for line in r.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, r.stderr[-3000:]
    line = errors[0]
    # cpu's peak is the cores' assumed one (`train`'s MFU peak): the fastest layout that fits, the micro-batch halved
    # (recompute, the fewest changes, would add a forward)
    assert re.match(r"error: out of memory at step 3 \(process peak \d+\.\d\d GiB\) on 1 x cpu: top plan suggestion "
                    r"for this run: per_device_train_batch_size 16384 -> 8192, gradient_accumulation_steps 1 -> 2 "
                    r"\(predicted ", line), line
    assert f"pretrain-cli plan {cfg} --device cpu --gpus 1 --fit -o fitted.json" in line
    assert sorted(p.name for p in (tmp_path / "out").iterdir() if p.name.startswith("checkpoint")) == ["checkpoint-2"]
    assert {p.name: p.read_bytes() for p in ckpt.iterdir()} == before
    assert not [p for p in (tmp_path / "out").iterdir() if "tmp" in p.name]


def test_a_yaml_argument_file_runs_every_command_a_json_one_does(corpus, tmp_path, capsys):
    """PaddleFormers' format (`paddleformers-cli train config.yaml`): `check`, `train` and its resume (the same-run
    checks), `inspect-data --config` and `eval --config` read a .yaml file as they read the .json one; the run's
    record (args.json) and its step-2 batch are the JSON file's. Before, each said "must be a .json file"."""
    import yaml

    cfg = json.loads(Path(write_config(tmp_path, corpus, max_steps=2, save_steps=2, do_eval=True)).read_text())
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    yml = str(tmp_path / "cfg.yaml")
    assert cli_main(["check", yml]) == 0 and "check: OK — training would start" in capsys.readouterr().out
    assert cli_main(["train", yml]) == 0
    assert cli_main(["train", yml, "--max_steps", "3"]) == 0  # continues checkpoint-2
    assert "resum" in capsys.readouterr().out
    out = tmp_path / "out"
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-3"]
    recorded = json.loads((out / "args.json").read_text())["arguments"]
    assert {k: recorded[k] for k in cfg if k in recorded} == {**cfg, "max_steps": 3}
    steps = []
    for source in (yml, str(tmp_path / "cfg.json")):
        assert cli_main(["inspect-data", "--config", source, "--step", "2", "--json"]) == 0
        steps.append({k: v for k, v in json.loads(capsys.readouterr().out).items() if k != "data"})
    assert steps[0] == steps[1]
    assert cli_main(["eval", "--config", yml, "--json"]) == 0
    evaluated = json.loads(capsys.readouterr().out)
    assert evaluated["split"] == "valid" and evaluated["loss"] == pytest.approx(
        json.loads((out / "all_results.json").read_text())["eval_loss"], abs=1e-5)
