"""docs/PLAN.md's worked examples are what the code prints: every `$ pretrain-cli plan ...` in a fenced block is run
(on PaddleNLP's files under their PaddleNLP names, configs/ as in a checkout) and its output compared line for line, exit code included.
Figures its prose quotes beside a command are checked too (`PROSE`: the command's `--json` field; the memory
model's own terms where the report prints no such field), so a change to the planner cannot leave them stale."""
import dataclasses
import json
import re
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
    # how many H100s PaddleNLP's DeepSeek-V3 file needs: the fewest whole nodes, the same from plan and from --fit
    assert any(cmd.startswith("pretrain-cli plan deepseek_v3_pretrain_argument.json") and "--fit" not in cmd
               and any("  1. --gpus 192 with" in line and "(24 nodes of 8)" in line for line in out)
               for cmd, out, _ in found)
    assert any(cmd.startswith("pretrain-cli plan deepseek_v3_pretrain_argument.json") and "--fit" in cmd
               and any("or more devices: --gpus 192 (24 nodes of 8)" in line for line in out) for cmd, out, _ in found)


def _checkout(tmp_path, monkeypatch) -> None:
    for doc_name, seed in NAMES.items():
        shutil.copy(SEEDS / seed, tmp_path / doc_name)
    shutil.copytree(REPO / "configs", tmp_path / "configs")  # the repository's own files, as from a checkout
    monkeypatch.chdir(tmp_path)


@pytest.mark.parametrize("command,expected,code", examples(), ids=lambda x: x if isinstance(x, str) else "")
def test_worked_example_output_is_what_plan_prints(command, expected, code, tmp_path, monkeypatch, capsys):
    _checkout(tmp_path, monkeypatch)
    assert cli_main(shlex.split(command)[1:]) == code
    assert capsys.readouterr().out.splitlines() == expected


L70 = "pretrain-cli plan configs/llama-3.1-70b_pretrain.json --max_seq_length 32768 --device H100 --gpus 32 --fit"
L8 = ("pretrain-cli plan configs/llama-3-8b_pretrain.json --model_name_or_path meta-llama/Llama-3.1-8B "
      "--max_seq_length 131072 --tensor_parallel_degree 1 --sharding \"\" --gradient_accumulation_steps 8 "
      "--use_fused_rms_norm false --use_fused_rope false --device H100 --gpus 8 --fit")
Q30 = ("pretrain-cli plan pretrain_argument.json --model_name_or_path Qwen/Qwen3-30B-A3B --tensor_parallel_degree 1 "
       "--sharding stage1 --max_seq_length 65536 --device H100 --gpus 16 --fit")
SPEED, Q32 = "speed.tokens_per_sec", "--max_seq_length 32768 --gpus 8"
P2E8 = "--pipeline_parallel_degree 2 --expert_parallel_degree 8 --gradient_accumulation_steps 32 --recompute true"
Q30_FIT = ("pretrain-cli plan pretrain_argument.json --model_name_or_path Qwen/Qwen3-30B-A3B "
           "--tensor_parallel_degree 1 --sharding stage1 --device H100 --gpus 16 --fit")
Q235_FIT = Q30_FIT.replace("Qwen3-30B-A3B", "Qwen3-235B-A22B").replace("--gpus 16", "--gpus 64")
V3 = ("pretrain-cli plan pretrain_argument.json --model_name_or_path deepseek-ai/DeepSeek-V3 "
      "--tensor_parallel_degree 1 --sharding \"\" --pipeline_parallel_degree 16")
V3_EP8, V3_PP16 = V3 + " --expert_parallel_degree 8 --device H100 --gpus 256", V3 + " --device H100 --gpus 16"
PROSE = [  # (the pieces of a command PLAN.md's prose gives, in order, the --json field it quotes, the figure)
    ((L70,), "after." + SPEED, "12,069"), ((L8,), "after." + SPEED, "9,379"),
    ((L70, "--tensor_parallel_degree 8 --pipeline_parallel_degree 2 --sequence_parallel true "
      "--gradient_accumulation_steps 16"), "before." + SPEED, "11,886"),
    ((L8, "--context_parallel_degree 8 --sharding stage1 --gradient_accumulation_steps 64 --recompute true"),
     "before." + SPEED, "9,359"),
    ((L8.replace(" --tensor_parallel_degree 1 --sharding \"\" --gradient_accumulation_steps 8 --use_fused_rms_norm "
                 "false --use_fused_rope false", ""),), "after." + SPEED, "9,423"),
    ((Q30,), "after.memory_gib", "64.42"), ((Q30,), "after." + SPEED, "26,383"),
    ((Q30, P2E8), "before.memory_gib", "62.23"), ((Q30, P2E8), "before." + SPEED, "25,679"),
    ((Q30, Q32), "smallest.memory_gib", "74.22"),  # a field of no --fit part ("memory_gib"): run without --fit
    ((Q30, Q32, "--pipeline_parallel_degree 4 --context_parallel_degree 2 --gradient_accumulation_steps 128 "
      "--recompute true"), "memory_gib", "87.27"),
    # the pipeline's last stage setting the step (MoE worked examples), and the DeepSeek-V3 figures beside commands
    ((Q30_FIT, "--pipeline_parallel_degree 16 --gradient_accumulation_steps 256"), "before." + SPEED, "108,117"),
    ((Q235_FIT, "--pipeline_parallel_degree 32 --expert_parallel_degree 2 --gradient_accumulation_steps 512 "
      "--recompute true"), "before." + SPEED, "85,036"),
    ((V3_EP8,), "traffic_gb_per_step.dp", "16.55"),
    ((V3_PP16,), "mtp.memory_gib", "201.36"), ((V3_PP16,), "memory_gib", "892.59")]


KEPT = ("pretrain-cli plan configs/llama-3-8b_pretrain.json --model_name_or_path meta-llama/Llama-2-7b-hf "
        "--device A100-80GB --gpus 8 --fit")


def test_the_quoted_kept_layout_line_is_what_fit_prints(tmp_path, monkeypatch, capsys):
    """PLAN.md quotes the line `--fit` prints where it keeps the file's layout (`fit_report.format_fit`'s `no change:`
    line, up to `kept`) beside the command that prints it: the quote is that line word for word, so neither can say
    another reason than the other (the line's reason changed and PLAN.md's paragraph kept the old one)."""
    text = " ".join((REPO / "docs" / "PLAN.md").read_text(encoding="utf-8").split())
    quotes = re.findall(r"`(no change: the file's layout is within [^`]*: kept)`", text)
    assert f"`{KEPT}`" in text and len(quotes) == 1, quotes
    _checkout(tmp_path, monkeypatch)
    assert cli_main(shlex.split(KEPT)[1:]) == 0
    line = next(n.strip() for n in capsys.readouterr().out.splitlines() if n.strip().startswith("no change: "))
    assert line[:line.index(": kept") + len(": kept")] == quotes[0]


@pytest.mark.parametrize("pieces,field,figure", PROSE, ids=[f"{x[1]}={x[2]}" for x in PROSE])
def test_prose_figure_is_what_its_command_prints(pieces, field, figure, tmp_path, monkeypatch, capsys):
    """The figures in PLAN.md's prose beside a command (the context-parallel layouts) are what it prints today."""
    text = " ".join((REPO / "docs" / "PLAN.md").read_text(encoding="utf-8").replace("`", " ").split())
    assert all(piece in text for piece in pieces) and figure in text, (pieces, figure)
    argv = shlex.split(" ".join(pieces))[1:]
    _checkout(tmp_path, monkeypatch)
    assert cli_main([a for a in argv if a != "--fit" or "." in field] + ["--json"]) in (0, 1)  # 1: nothing fits
    value = json.loads(capsys.readouterr().out)
    for key in field.split("."):
        value = value[key]
    assert (f"{round(value):,}" if field.endswith(SPEED) else f"{value:.2f}") == figure


def test_memory_model_figures_the_report_does_not_print(tmp_path, monkeypatch):
    """DeepSeek-V3's MTP share part by part (the 256-H100 block's plan less it without the module, `plan.mtp_share`)
    and its first two stages' activations at pp 16: PLAN.md's prose quotes them beside the plan they come from."""
    from pretrain_cli.orchestration.planned import from_file
    from pretrain_cli.planning import activations, memory, plan as planning

    seen, share = [], planning.mtp_share
    monkeypatch.setattr(planning, "mtp_share", lambda setup, *a: seen.append(setup) or share(setup, *a))
    _checkout(tmp_path, monkeypatch)
    v3 = ["--model_name_or_path", "deepseek-ai/DeepSeek-V3", "--tensor_parallel_degree", "1", "--sharding", ""]
    for more, gpus in ((["--expert_parallel_degree", "64", "--recompute", "true"], 256),
                       (["--pipeline_parallel_degree", "16"], 16)):
        from_file("pretrain_argument.json", v3 + more, "H100", gpus, suggest_changes=False)
    (ep64, pp16), g = seen, memory.GIB
    bare = dataclasses.replace(ep64, model=dataclasses.replace(ep64.model, num_nextn_predict_layers=0))
    d = {k: (v - memory.estimate(bare).get(k, 0.0)) / g for k, v in memory.estimate(ep64).items()}
    own, experts = memory.mtp_params(ep64)
    gib = [sum(d[k] for k in ("weights", "gradients", "optimizer_state", "master_weights", "gradient_buffers")),
           d["activations"], d["logits_loss"], d["framework"],
           activations.mtp_head_bytes(dataclasses.replace(ep64, fused_loss=True)) / g,
           *(stage["activations"] / g for stage in memory.pipeline_stages(pp16)[:2])]
    figures = [f"{x:.2f}" for x in [*gib, (own + experts) / 1e9, own / 1e9, experts * 64 / 1e9]]
    assert figures == ["8.25", "3.86", "1.97", "0.70", "3.51", "77.37", "163.49", "0.51", "0.34", "11.27"]
    text = " ".join((REPO / "docs" / "PLAN.md").read_text(encoding="utf-8").split())
    assert all(f in text for f in figures)


def test_the_v3_files_first_stage_the_report_does_not_print(tmp_path, monkeypatch):
    """PaddleNLP's DeepSeek-V3 file at pp 2 on 8 H100: the report prints its fullest stage, the last; PLAN.md's prose
    quotes the first stage's total and activations too (`memory.pipeline_stages`), which it does not print."""
    from pretrain_cli.orchestration.planned import from_file
    from pretrain_cli.planning import memory, plan as planning

    seen, share = [], planning.mtp_share
    monkeypatch.setattr(planning, "mtp_share", lambda setup, *a: seen.append(setup) or share(setup, *a))
    _checkout(tmp_path, monkeypatch)
    from_file("deepseek_v3_pretrain_argument.json", [], "H100", 8, suggest_changes=False)
    first, last = memory.pipeline_stages(seen[0])
    g = memory.GIB
    figures = [f"{sum(first.values()) / g:,.2f}", f"{first['activations'] / g:.2f}", f"{sum(last.values()) / g:,.2f}"]
    assert figures == ["1,572.43", "260.85", "1,582.48"]
    text = " ".join((REPO / "docs" / "PLAN.md").read_text(encoding="utf-8").split())
    assert all(f in text for f in figures)
