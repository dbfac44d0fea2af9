"""Every command in the README's code blocks, as written, in a directory laid out like the demo's
(`scripts/quickstart.sh`'s outputs, built small): the cheap ones run, `train` and launcher commands run
`check` with the same arguments (what training would validate first), set-up commands are checked to
exist. A command this test does not know fails it, so the README cannot grow an untested command."""
import json
import os
import shlex
import subprocess
from pathlib import Path

import pytest

from e2e_helpers import REPO, bash_commands, demo_root
from pretrain_cli.cli import main as cli_main


def readme_commands() -> list[list[str]]:
    return bash_commands(REPO / "README.md")


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """configs/, scripts/ and demo/{corpus.jsonl, tokenizer, data/pydoc.*, output} as quickstart.sh leaves them."""
    return demo_root(tmp_path_factory.mktemp("readme"), 1, [
        "configs/demo_cpu.json", "--overwrite_output_dir", "true", "--max_steps", "2", "--warmup_steps", "1",
        "--save_steps", "2", "--eval_steps", "2", "--eval_iters", "1", "--logging_steps", "1"])


def _output_dir(argv: list[str], root: Path) -> str:
    """output_dir as training would take it: the last --output_dir on the command line, else the file's."""
    given = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--output_dir"]
    return given[-1] if given else json.loads((root / argv[0]).read_text())["output_dir"]


def _check_training(args: list[str], root: Path) -> None:
    assert args and args[0].endswith(".json") and (root / args[0]).is_file(), args
    assert cli_main(["check", *args]) == 0, args


def test_every_readme_command_runs_after_the_quickstart(demo, monkeypatch, capsys):
    monkeypatch.chdir(demo)
    quickstart = (REPO / "scripts" / "quickstart.sh").read_text()
    kinds = []
    for argv in readme_commands():
        capsys.readouterr()
        if argv[0] in ("scripts/quickstart.sh", "scripts/test.sh", "scripts/install_gpu.sh"):
            assert os.access(REPO / argv[0], os.X_OK), argv
            assert all(f"{a})" in (REPO / argv[0]).read_text() or f"|{a}" in (REPO / argv[0]).read_text()
                       for a in argv[1:]), argv  # install_gpu.sh's CUDA builds (tests/unit/test_install_gpu_script.py)
            kinds.append("set-up")
        elif argv == ["pip", "install", "-e", "."]:
            assert (REPO / "pyproject.toml").is_file() and "install -e ." in quickstart
            kinds.append("set-up")
        elif argv[:2] == ["source", ".venv/bin/activate"]:
            assert "-m venv .venv" in quickstart and "-m venv .venv" in (REPO / "scripts" / "test.sh").read_text()
            kinds.append("set-up")
        elif argv[:2] == ["pretrain-cli", "train"]:
            _check_training(argv[2:], demo)
            kinds.append("train")
        elif argv[:2] == ["python", "scripts/run_pretrain.py"]:
            _check_training(argv[2:], demo)
            kinds.append("train")
        elif argv[:3] == ["python", "-m", "paddle.distributed.launch"]:
            at = argv.index("scripts/run_pretrain.py")
            launcher, args = argv[3:at], argv[at + 1:]
            assert launcher[launcher.index("--log_dir") + 1] == f"{_output_dir(args, demo).removeprefix('./')}/log"
            _check_training(args, demo)
            kinds.append("launch")
        elif "scripts/launch.sh" in argv:  # MASTER=… NNODES=2 NODE_RANK=0 scripts/launch.sh cfg.json --key value …
            at = argv.index("scripts/launch.sh")
            assert all("=" in a for a in argv[:at]) and os.access(REPO / argv[at], os.X_OK), argv
            _check_training(argv[at + 1:], demo)
            kinds.append("launch")
        elif argv[:2] == ["pretrain-cli", "eval"] and "--max_batches" not in argv:
            # as written, but 2 batches: every window of the demo's token file (~300 batches) was two thirds of this
            # test and proves nothing more here; reading a whole file is asserted by
            # tests/unit/test_evaluate.py::test_cli_subcommand_json (every window's tokens counted)
            assert cli_main([*argv[1:], "--max_batches", "2"]) == 0, argv
            kinds.append("eval")
        elif argv[0] == "printf" and len(argv) == 4 and argv[2] == ">":  # printf 'a\nb\n' > demo/prompts.txt
            with open(argv[3], "w") as f:
                subprocess.run(["printf", argv[1]], stdout=f, check=True)
            kinds.append("printf")
        elif argv[0] == "pretrain-cli":
            assert cli_main(argv[1:]) == 0, argv
            kinds.append(argv[1])
            if argv[1] == "check" and "--world_size" in argv:  # a new run's arithmetic, not the quickstart's resumed
                said = capsys.readouterr().out
                assert "; random init" in said and "batch: 2 x acc 1 x 4 data ranks = 8 sequences" in said, said
        elif argv[0] == "visualdl":
            logdir = demo / argv[argv.index("--logdir") + 1]
            assert any(p.name.startswith("vdlrecords.") for p in logdir.iterdir()) and "--language" in argv
            kinds.append("visualdl")
        else:
            raise AssertionError(f"README command this test does not know how to check: {shlex.join(argv)}")
    for kind in ("set-up", "train", "launch", "check", "plan", "train-tokenizer", "preprocess", "inspect-data",
                 "eval", "generate", "--help", "visualdl"):
        assert kind in kinds, kind  # the README still shows (and this test still runs) each kind
