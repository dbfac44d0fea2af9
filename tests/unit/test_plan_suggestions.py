"""`plan`'s suggestions name only keys that change something, each once, and the first says how many devices when no
setting fits; `plan`'s flags refuse what they would silently ignore or cannot launch; `--device cpu` splits the
machine's memory over the processes of a node."""
import json
from pathlib import Path

import pytest

from pretrain_cli.cli import main as cli_main
from pretrain_cli.planning import hardware
from plan_helpers import fit, plan

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
LLAMA3_8B = str(CONFIGS / "llama-3-8b_pretrain.json")  # tp 2, sharding stage1, bf16 O2
QWEN = str(CONFIGS / "qwen2.5-0.5b_pretrain.json")
# PaddleNLP's llm/config/deepseek-v3/pretrain_argument.json (00b572e), as published
DSV3 = str(CONFIGS.parent / "tests" / "e2e" / "paddlenlp_configs" / "deepseek_v3_pretrain_argument.json")


def _tokens(change: dict) -> list[str]:
    return [t for k, v in change.items() for t in (f"--{k}", json.dumps(v) if isinstance(v, bool) else str(v))]


def _within_fit_budget(r: dict) -> bool:
    """Whether a plan fits `plan --fit`'s budget (10 % of the device kept free), as `Plan.least_gib` counts it: the
    step, start-up and an evaluation of 1; the budget `plan`'s device-count suggestions share with --fit."""
    return max(r["memory_gib"], r["startup_gib"], r["eval_least_gib"] or 0.0) <= r["device"]["memory_gib"] * 0.9


def test_more_devices_names_no_sharding_stage_that_shards_nothing():
    """On 2 devices with tp 2 there is one data rank: a sharding stage re-plans to the same memory, so the fewest-
    devices suggestion names none (the file as written needs 78.4 GiB there, over --fit's 72 GiB budget, which the
    suggestion shares: recompute too), and its reason does not credit sharding with it."""
    r = plan(LLAMA3_8B)
    first = r["suggestions"][0]
    assert first["gpus"] == 2 and first["change"] == {"recompute": True} and "shards" not in first["why"]
    there = plan(LLAMA3_8B, _tokens(first["change"]), gpus=2, suggest_changes=False)
    assert there["memory_gib"] == pytest.approx(first["memory_gib"]) and _within_fit_budget(there)
    for key in first["change"]:  # each key it names is needed there
        rest = {k: v for k, v in first["change"].items() if k != key}
        assert not _within_fit_budget(plan(LLAMA3_8B, _tokens(rest), gpus=2, suggest_changes=False))


def test_no_fitting_setting_on_these_devices_first_suggests_how_many(tmp_path):
    """DeepSeek-V3 with its experts over 8 data ranks fits no setting of 8 x A100-80GB: the first suggestion is a
    device count with the layout keys that fit there (the single keys alone leave ep and tp as they are)."""
    cfg = tmp_path / "dsv3.json"
    cfg.write_text(json.dumps({
        "model_name_or_path": "deepseek-v3", "per_device_train_batch_size": 1, "gradient_accumulation_steps": 32,
        "max_seq_length": 4096, "bf16": True, "fp16_opt_level": "O2", "tensor_parallel_degree": 1,
        "expert_parallel_degree": 8, "max_steps": 1000, "do_train": True, "input_dir": str(tmp_path / "data"),
        "output_dir": str(tmp_path / "out")}))
    over = ["--pipeline_parallel_config", "", "--sharding", ""]
    r = plan(str(cfg), over, device="A100-80GB", gpus=8)
    first = r["suggestions"][0]
    assert not r["fits"] and first["fits"] and first["gpus"] > 8
    assert _within_fit_budget(plan(str(cfg), over + _tokens(first["change"]), device="A100-80GB",
                                   gpus=first["gpus"], suggest_changes=False))
    assert not _within_fit_budget(plan(str(cfg), over + _tokens(first["change"]), device="A100-80GB",
                                       gpus=first["gpus"] - 8, suggest_changes=False))  # a node fewer


def test_how_many_gpus_deepseek_v3_needs_whole_nodes_and_a_layout():
    """PaddleNLP's DeepSeek-V3 file (pp 2 x ep 4; its sharding off, as the refusal of EP with a pipeline and sharding
    says) on one node of 8 H100: no layout fits, and the first suggestion is the fewest whole nodes on which one does
    within `plan --fit`'s 10 % margin, 24 (tp 8 x ZeRO-3 over 24 data ranks, recompute: 70.58 GiB; its ZeRO-3 keeps
    one sparse layer's experts gathered at a time, `experts.gathered_layer`, and each dense MLP's gathered gate|up
    concatenation, `memory.zero3_keeps_packed`), with no layout of the search (each at its least memory) within it
    on 23: `--fit`'s answer, from the same search (`plan` offered 21 nodes at 78.62 of 80 GiB, which --fit refused
    for its margin). Before, the fewest-devices search tried the file's own degrees, the sharding stages and the
    single savings on 16, 32, ... devices, all refused or too large (ZeRO-3 needs pp 1 and ep 1, and the file's
    sharding_parallel_degree 4 does not divide other worlds' data ranks), so `plan` suggested only max_seq_length
    256 and recompute."""
    over = ["--sharding", ""]
    r = plan(DSV3, over, device="H100", gpus=8)
    first = r["suggestions"][0]
    assert not r["fits"] and first["fits"] and first["gpus"] == 192 and "(24 nodes of 8)" in first["why"]
    assert first["change"]["sharding"] == "stage3" and first["change"]["tensor_parallel_degree"] == 8
    assert "fewest devices that fit (24 nodes of 8) with `plan --fit`'s 10% margin" in first["why"]
    assert _within_fit_budget(plan(DSV3, over + _tokens(first["change"]), device="H100", gpus=192,
                                   suggest_changes=False))
    from pretrain_cli.orchestration import planned
    from pretrain_cli.planning.fit_candidates import lean_layouts
    from pretrain_cli.planning.suggestions import within_budget

    args, cfg = planned.parse(DSV3, over)
    base = planned.plan(args, cfg, "H100", 8, suggest_changes=False)
    replan = within_budget(base, planned._replanner(args, cfg, "H100", 8, None, 0.0, None), 72.0)
    layouts = lean_layouts(planned._current(args), 184, 4096, 256, 8)
    assert len(layouts) > 100 and not any((x := replan(c, 184)) is not None and x.fits for c in layouts)
    f = fit(DSV3, over, device="H100", gpus=8)
    assert f["after"] is None and (f["more_devices"]["gpus"], f["more_devices"]["change"]) == (192, first["change"])
    assert f["more_devices"]["memory_gib"] == pytest.approx(first["memory_gib"]) and first["memory_gib"] <= 72.0


def test_each_suggestion_is_listed_once(capsys):
    """When only the micro-batch saves besides the sequence, the 'all of the above' union is that same change."""
    over = ["--per_device_train_batch_size", "2", "--max_seq_length", "131072", "--recompute", "true"]
    changes = [json.dumps(s["change"], sort_keys=True) for s in plan(QWEN, over, device="T4")["suggestions"]]
    assert len(changes) >= 2 and len(changes) == len(set(changes))


def test_device_counts_are_powers_of_two_in_a_node_then_whole_nodes():
    from pretrain_cli.planning.suggestions import device_counts

    assert device_counts(1, 8)[:5] == [2, 4, 8, 16, 32]
    assert device_counts(2, 3)[:4] == [3, 6, 12, 24]
    assert all(w % 6 == 0 for w in device_counts(6, 6))


def test_cpu_processes_share_the_machines_memory(capsys):
    ram = hardware.cpu_memory_gib()
    cfg = str(CONFIGS / "llama-171m_pretrain.json")
    assert plan(cfg, device="cpu")["device"]["memory_gib"] == pytest.approx(ram)
    assert plan(cfg, device="cpu", gpus=8)["device"]["memory_gib"] == pytest.approx(ram / 8)
    four = plan(cfg, device="cpu", gpus=8, node=hardware.Node(4), suggest_changes=False)
    assert four["device"]["memory_gib"] == pytest.approx(ram / 4)  # two nodes of 4 processes
    assert any("shared by the 4 processes" in n and "framework is 0" in n for n in four["notes"])
    assert cli_main(["plan", cfg, "--device", "cpu", "--gpus", "8"]) == 0
    assert f"on 8 x cpu ({ram / 8:.1f} GiB each)" in capsys.readouterr().out


@pytest.mark.parametrize("argv,message", [
    (["--margin", "5"], "--margin: only used with --fit; add --fit"),
    (["--margin", "0.2"], "--margin: only used with --fit; add --fit"),
    (["--fit", "-o", ""], "-o: empty path"),
])
def test_fit_flags_without_effect_are_refused_in_one_line(argv, message, capsys):
    assert cli_main(["plan", QWEN, *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert cli_main(["plan", QWEN, "--fit", "--margin", "0.2", "--json"]) == 0  # where they belong, they are taken


def test_a_world_of_part_nodes_is_refused_part_of_one_node_is_not(capsys):
    """The launcher starts the same devices on every node: 8 ranks on nodes of 3 is no layout `train` launches;
    2 of one node's 3, or 2 whole nodes, are."""
    assert cli_main(["plan", QWEN, "--gpus", "8", "--gpus_per_node", "3"]) == 2
    err = capsys.readouterr().err
    assert "--gpus_per_node: --gpus 8 is not a whole number of nodes of 3" in err and "--gpus 6 or 9" in err
    assert len(err.strip().splitlines()) == 1
    assert cli_main(["plan", QWEN, "--gpus", "2", "--gpus_per_node", "3"]) == 0
    assert cli_main(["plan", QWEN, "--gpus", "6", "--gpus_per_node", "3"]) == 0


def test_a_device_count_that_needs_no_key_says_so(capsys):
    """The file as written fits on more devices: the suggestion names the count and that no key changes (it
    printed `--gpus 32 with   -> ...`). Llama-3-8B under ZeRO-3 with recompute: its state alone is 119.7 GiB, on
    two devices 60 GiB each: 78.00 GiB with the rest, within an H20's 86.4 GiB budget (not an A100's 72)."""
    from pretrain_cli.cli import main as cli_main

    assert cli_main(["plan", LLAMA3_8B, "--device", "H20", "--gpus", "1", "--tensor_parallel_degree", "1",
                     "--sharding", "stage3", "--recompute", "true"]) == 0
    first = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("  1. "))
    assert first.startswith("  1. --gpus 2, no key changed  -> "), first
    assert "; the file as written fits there" in first, first


def test_the_lowest_sharding_stage_that_fits_is_kept():
    """`minimal` keeps a suggestion's sharding at the lowest stage that still fits (a fake plan where stage2 and up
    fit, recompute is needed and the micro-batch alone moves nothing): stage3 becomes stage2, not stage1, and the
    keys the fit needs stay."""
    from types import SimpleNamespace

    from pretrain_cli.planning.suggestions import minimal

    def replan(change, world):
        stage = int(str(change.get("sharding", "stage0"))[-1])
        return SimpleNamespace(fits=stage >= 2 and bool(change.get("recompute")), global_batch=16)

    kept, _ = minimal({"sharding": "stage3", "recompute": True, "per_device_train_batch_size": 1}, 8, replan)
    assert kept["sharding"] == "stage2" and kept["recompute"] is True, kept


def test_when_only_keys_together_fit_they_are_the_first_suggestion():
    """Qwen3-30B-A3B at 8K on 8 H100 with the Llama file's tp 2 + ZeRO-1: no one key fits, and recompute with
    ZeRO-3 does not either as followed (its first evaluation, at the file's eval batch of 2, needs 73.38 GiB of the
    72 budget); the search's recompute with ep 4 does (68.01 GiB at that eval batch). The report's heading says
    that answer comes first, where it had been listed last, after a 512-token sequence."""
    over = ["--model_name_or_path", "Qwen/Qwen3-30B-A3B", "--max_seq_length", "8192"]
    sugg = plan(LLAMA3_8B, over, device="H100", gpus=8)["suggestions"]
    assert [s["fits"] for s in sugg] == [True] + [False] * (len(sugg) - 1)
    assert sugg[0]["change"] == {"recompute": True, "expert_parallel_degree": 4} and len(sugg) >= 3
    assert {"recompute": True, "sharding": "stage3"} in [s["change"] for s in sugg[1:]]
