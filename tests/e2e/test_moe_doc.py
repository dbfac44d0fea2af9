"""Every command of docs/MOE.md's code blocks, as written, in a directory laid out like the demo's (as
tests/e2e/test_readme.py does for the README): the cheap ones run, training and launcher commands run `check` with
the same arguments on as many processes, the transformers snippet runs on the shipped tiny model trained 2 steps.
A command this test does not know fails it, so the guide cannot grow an untested command."""
import json
import os
import re
import shlex
from pathlib import Path

import pytest

from e2e_helpers import REPO, bash_commands, demo_root
from pretrain_cli.cli import main as cli_main

GUIDE = REPO / "docs" / "MOE.md"
TINY = "configs/qwen3-moe-tiny_cpu.json"


def blocks(kind: str) -> list[str]:
    return re.findall(rf"```{kind}\n(.*?)```", GUIDE.read_text(encoding="utf-8"), re.S)


def guide_commands() -> list[list[str]]:
    return bash_commands(GUIDE)


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """configs/, scripts/ and demo/ as quickstart.sh leaves them, and the tiny MoE trained 2 steps into demo/moe."""
    return demo_root(tmp_path_factory.mktemp("moe_doc"), 4, [
        TINY, "--max_steps", "2", "--warmup_steps", "1", "--save_steps", "2", "--eval_steps", "2", "--eval_iters", "1",
        "--logging_steps", "1", "--report_to", "none"])


def _check(args: list[str], processes: int) -> None:
    assert args and args[0].endswith(".json") and Path(args[0]).is_file(), args
    world = ["--world_size", str(processes)] if processes > 1 else []
    assert cli_main(["check", *args, *world]) == 0, args


def _newest_checkpoint(path: str) -> str:
    """`demo/moe/checkpoint-100` as the 2-step run has it: its newest checkpoint."""
    run = Path(path).parent
    return str(max(run.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1])))


def test_every_guide_command_runs_after_the_quickstart(demo, monkeypatch, capsys):
    monkeypatch.chdir(demo)
    # a user's own tokenizer and token files where the guide's override example names them (my/tokenizer, my/data)
    (demo / "my").mkdir(exist_ok=True)
    for name, target in (("tokenizer", "demo/tokenizer"), ("data", "demo/data")):
        if not (demo / "my" / name).exists():
            (demo / "my" / name).symlink_to(demo / target)
    kinds = []
    for argv in guide_commands():
        capsys.readouterr()
        if argv[:2] == ["pretrain-cli", "train"]:
            _check(argv[2:], 1)
            kinds.append("train")
        elif "scripts/launch.sh" in argv:  # NPROC=2 scripts/launch.sh cfg.json --key value …
            at = argv.index("scripts/launch.sh")
            env = dict(a.split("=", 1) for a in argv[:at])
            assert set(env) <= {"NPROC", "MAX_RESTART"} and os.access(REPO / argv[at], os.X_OK), argv
            _check(argv[at + 1:], int(env.get("NPROC", 1)))
            kinds.append("launch.sh")
        elif argv[:3] == ["python", "-m", "paddle.distributed.launch"]:
            at = argv.index("scripts/run_pretrain.py")
            launcher, args = argv[3:at], argv[at + 1:]
            if "--nproc_per_node" in launcher:
                processes = int(launcher[launcher.index("--nproc_per_node") + 1])
            else:  # --devices 0,…,7: the fitted file, checked as a launch on that many GPUs
                processes = len(launcher[launcher.index("--devices") + 1].split(","))
            assert "--log_dir" in launcher, argv
            _check(args, processes)
            kinds.append("launch")
        elif argv[:2] == ["pretrain-cli", "eval"]:
            assert cli_main([*argv[1:], "--max_batches", "2"]) == 0, argv
            kinds.append("eval")
        elif argv[:2] == ["pretrain-cli", "export"]:
            source = argv[2] if Path(argv[2]).exists() else _newest_checkpoint(argv[2])
            assert Path(source).parent.name == "moe", argv  # the 2-step run's; another run's is only checked
            assert cli_main(["export", source, *argv[3:]]) == 0, argv
            assert (Path(argv[3]) / "model.safetensors").is_file()
            kinds.append("export")
        elif argv[0] == "pretrain-cli":
            assert cli_main(argv[1:]) == 0, argv
            kinds.append(argv[1])
        else:
            raise AssertionError(f"docs/MOE.md command this test does not know how to check: {shlex.join(argv)}")
    for kind in ("check", "plan", "train", "launch.sh", "launch", "eval", "generate", "export"):
        assert kind in kinds, kind
    fitted = (demo / "qwen3-30b-a3b_8xh100.json").read_text()
    assert '"device": "gpu"' in fitted and '"expert_parallel_degree"' in fitted


def test_the_guides_fit_numbers_are_what_plan_prints(monkeypatch, capsys):
    """The prose after the `--fit` command (memory after the fit, as the file stands, tokens/s) is what `plan --fit
    --json` prints for that command now."""
    text = GUIDE.read_text()
    (command,) = [c for c in guide_commands() if "--fit" in c]
    found = re.search(r"([\d.]+) GiB a GPU of the 72 .*?\(([\d,.]+) GiB as the file stands\), ([\d,]+) tokens/s",
                      text, re.S)
    assert found, "docs/MOE.md: the --fit figures' sentence"
    after, before, speed = (float(g.replace(",", "")) for g in found.groups())
    monkeypatch.chdir(REPO)
    argv = [a for a in command[1:] if a not in ("-o", "qwen3-30b-a3b_8xh100.json")]
    capsys.readouterr()
    assert cli_main([*argv, "--json"]) == 0
    fit = json.loads(capsys.readouterr().out)
    assert round(fit["after"]["memory_gib"], 2) == after and round(fit["before"]["memory_gib"], 2) == before
    assert round(fit["after"]["speed"]["tokens_per_sec"]) == speed
    # the evaluation's sentence: the file's eval batch at the pick, the lowered one, eval_iters and the samples kept
    found = re.search(r"An evaluation's (\d+) samples of [\d,]+ tokens a GPU would need ([\d.]+) GiB .*?evaluates "
                      r"(\d+) at a time, `eval_iters` (\d+): an evaluation still reads the file's (\d+) samples, "
                      r"(\d+) on each of the (\d+) data\s+ranks", text, re.S)
    assert found, "docs/MOE.md: the evaluation's sentence"
    was, was_gib, batch, iters, samples, share, ranks = found.groups()
    e = fit["eval"]
    assert (e["was"]["batch"], f"{e['was']['memory_gib']:.2f}", e["batch"]) == (int(was), was_gib, int(batch))
    assert e["change"] == {"per_device_eval_batch_size": int(batch), "eval_iters": int(iters)}
    assert e["was"]["samples"] == int(samples) == int(share) * int(ranks) == int(batch) * int(iters) * int(ranks)
    assert fit["after"]["memory_gib"] <= fit["budget_gib"] >= e["memory_gib"]


def test_the_transformers_snippet_loads_the_run(demo, monkeypatch, capsys):
    monkeypatch.chdir(demo)
    (snippet,) = blocks("python")
    exec(compile(snippet, str(GUIDE), "exec"), {})
    loss = float(capsys.readouterr().out.strip().removeprefix("tensor(").removesuffix(")"))
    assert 0 < loss < 10  # ln 2048 = 7.6 at the start: the 2-step model's weights, loaded as they were trained


@pytest.mark.parametrize("model", ["configs/qwen3-moe-tiny", "configs/deepseek-v3-tiny"])
def test_the_shipped_model_directories_are_transformers_configs(model):
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(str(REPO / model))
    assert cfg.vocab_size == 2048 and cfg.num_experts_per_tok == 4
    assert (cfg.num_experts if cfg.model_type == "qwen3_moe" else cfg.n_routed_experts) == 16
