"""docs/PLAN.md's worked examples are what the code prints: every `$ pretrain-cli plan ...` in a fenced block is run
(on PaddleNLP's files under their PaddleNLP names, configs/ as in a checkout) and its output compared line for line, exit code included."""
import shlex
import shutil
from pathlib import Path

import pytest

from pretrain_cli.cli import main as cli_main

REPO = Path(__file__).resolve().parents[2]
SEEDS = REPO / "tests" / "e2e" / "paddlenlp_configs"
NAMES = {"pretrain_argument_0p5b.json": "qwen_pretrain_argument_0p5b.json",  # llm/config/qwen/
         "pretrain_argument.json": "llama_pretrain_argument.json",  # llm/config/llama/
         "deepseek_v3_pretrain_argument.json": "deepseek_v3_pretrain_argument.json"}  # llm/config/deepseek-v3/


def examples() -> list[tuple[str, list[str], int]]:
    """(command, expected output lines, expected exit code) for each `$ pretrain-cli plan` in PLAN.md."""
    out, current, inside = [], None, False
    for line in (REPO / "docs" / "PLAN.md").read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            inside, current = not inside, None  # a command's output ends with its block
            continue
        if not inside:
            continue
        if line.startswith("$ pretrain-cli plan"):
            current = [line[2:], [], 0]
            out.append(current)
        elif current is None:
            continue
        elif line == "$ echo $?":
            current[2] = None  # the next line is the code
        elif current[2] is None:
            current[2] = int(line)
        elif line and not line.startswith("$"):
            current[1].append(line)
    return [tuple(x) for x in out]


def test_plan_md_has_its_worked_examples():
    """Every example the doc promises is there to be run: the start-up one (70B), the fused and unfused V100 ones
    (the unfused exits 1), the 8-card one and the 70B file's; each with output to compare."""
    found = examples()
    assert len(found) >= 6 and all(lines for _, lines, _ in found)
    assert any("Llama-3.1-70B" in cmd and "--fit" in cmd for cmd, _, _ in found)
    assert any("--gpus 8" in cmd and "-o fitted.json" in cmd for cmd, _, _ in found)
    assert sorted({code for _, _, code in found}) == [0, 1]  # the exit code is read where the doc shows it
    # Mixture-of-Experts: the active parameters of Qwen3-30B-A3B, and its --fit on two nodes
    assert any("Qwen3-30B-A3B" in cmd and "--expert_parallel_degree" in cmd for cmd, _, _ in found)
    assert any("Qwen3-30B-A3B" in cmd and "--gpus 16 --fit" in cmd for cmd, _, _ in found)
    assert any("Qwen3-235B-A22B" in cmd and "--gpus 64 --fit" in cmd for cmd, _, _ in found)
    # DeepSeek: V2-Lite's --fit on one node of 8 x 80 GB, V3 on 32 nodes with its MTP module's share
    assert any("DeepSeek-V2-Lite" in cmd and "--gpus 8 --fit" in cmd for cmd, _, _ in found)
    assert any("DeepSeek-V3" in cmd and any("multi-token prediction" in line for line in out)
               for cmd, out, _ in found)
    # how many H100s PaddleNLP's DeepSeek-V3 file needs: the fewest whole nodes, from plan and from --fit
    assert any(cmd.startswith("pretrain-cli plan deepseek_v3_pretrain_argument.json") and "--fit" not in cmd
               and any("  1. --gpus 168 with" in line and "(21 nodes of 8)" in line for line in out)
               for cmd, out, _ in found)
    assert any(cmd.startswith("pretrain-cli plan deepseek_v3_pretrain_argument.json") and "--fit" in cmd
               and any("or more devices: --gpus 192 (24 nodes of 8)" in line for line in out) for cmd, out, _ in found)


@pytest.mark.parametrize("command,expected,code", examples(), ids=lambda x: x if isinstance(x, str) else "")
def test_worked_example_output_is_what_plan_prints(command, expected, code, tmp_path, monkeypatch, capsys):
    for doc_name, seed in NAMES.items():
        shutil.copy(SEEDS / seed, tmp_path / doc_name)
    shutil.copytree(REPO / "configs", tmp_path / "configs")  # the repository's own files, as from a checkout
    monkeypatch.chdir(tmp_path)
    assert cli_main(shlex.split(command)[1:]) == code
    assert capsys.readouterr().out.splitlines() == expected
