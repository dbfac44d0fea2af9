"""`plan`'s suggestions and `plan --fit` give one answer: the same budget (the device less --fit's 10 % margin), the
same search (plan's first suggestion is its fastest layout of the fewest keys), the global batch kept, and on cpu
more machines searched where the model's state exceeds the ones planned. Each test failed on the code before."""
import json
from pathlib import Path

import pytest

from pretrain_cli.planning import hardware
from pretrain_cli.planning.hardware import Node
from plan_helpers import fit, plan

REPO = Path(__file__).resolve().parents[2]
LLAMA3_8B = str(REPO / "configs" / "llama-3-8b_pretrain.json")
# PaddleNLP's llm/config/llama/pretrain_argument.json (PLAN.md's `pretrain_argument.json`): global batch 4,096
PADDLENLP_LLAMA = str(REPO / "tests" / "e2e" / "paddlenlp_configs" / "llama_pretrain_argument.json")
V3_EP64 = ["--model_name_or_path", "deepseek-ai/DeepSeek-V3", "--tensor_parallel_degree", "1", "--sharding", "",
           "--expert_parallel_degree", "64", "--recompute", "true"]
LAYOUT = {"tensor_parallel_degree", "sequence_parallel", "pipeline_parallel_degree", "context_parallel_degree",
          "expert_parallel_degree", "sharding", "sharding_parallel_degree", "per_device_train_batch_size",
          "gradient_accumulation_steps", "recompute", "recompute_granularity", "use_flash_attention",
          "per_device_eval_batch_size", "eval_iters"}  # (--fit's eval change is part of the answer)


def _tokens(change: dict) -> list[str]:
    return [t for k, v in change.items() for t in (f"--{k}", json.dumps(v) if isinstance(v, bool) else str(v))]


def _least(r: dict) -> float:
    """What a plan re-planned as given needs: step, start-up and the evaluation at its own eval batch."""
    return max(r["memory_gib"], r["startup_gib"], r["eval_memory_gib"] or 0.0)


def test_deepseek_v3_on_256_h100_plan_suggests_fits_layout():
    """No one key fits; plan's search took tp 8 + ZeRO-3 (12,347 tokens/s by --fit's model: of the layouts with
    as few keys, the larger micro-batch, then the least memory), --fit pp 32 x ep 8 x ZeRO-1 (129,995). Ranked by
    keys, then speed, both name pp 32 x ep 8 x ZeRO-1, and it keeps the file's 4,096 samples a step, and the
    evaluation's 5,120 (eval_iters 10 -> 320 over 8 data ranks, as --fit sets it; plan left it out: 160)."""
    first = plan(PADDLENLP_LLAMA, V3_EP64, device="H100", gpus=256)["suggestions"][0]
    f = fit(PADDLENLP_LLAMA, V3_EP64, device="H100", gpus=256)
    assert first["fits"] and "gpus" not in first
    assert first["change"] == {k: new for k, _, new in f["diff"] if k in LAYOUT}
    assert first["change"]["pipeline_parallel_degree"] == 32 and first["change"]["sharding"] == "stage1"
    assert first["change"]["eval_iters"] == 320
    there = plan(PADDLENLP_LLAMA, V3_EP64 + _tokens(first["change"]), device="H100", gpus=256, suggest_changes=False)
    assert there["tokens_per_step"] == 4096 * 4096 and _least(there) <= 72.0


def test_minimal_drops_no_batch_key_that_moves_the_global_batch():
    """tp 8 + ZeRO-3 with the accumulation that keeps 4,096 samples over 32 data ranks (128): without the
    accumulation key it still fits, at 16 x 32 = 512 samples a step, which `minimal` took silently."""
    from pretrain_cli.orchestration import planned
    from pretrain_cli.planning.suggestions import minimal, within_budget

    args, cfg = planned.parse(PADDLENLP_LLAMA, V3_EP64)
    base = planned.plan(args, cfg, "H100", 256, suggest_changes=False)
    replan = within_budget(base, planned._replanner(args, cfg, "H100", 256, None, 0.0, None), 72.0)
    change = {"tensor_parallel_degree": 8, "sharding": "stage3", "expert_parallel_degree": 1,
              "gradient_accumulation_steps": 128}
    assert replan(change).fits and replan({k: v for k, v in change.items() if k != "gradient_accumulation_steps"},
                                          256).fits  # (the drop the old `minimal` made)
    kept, r = minimal(change, 256, replan)
    assert kept["gradient_accumulation_steps"] == 128 and r.global_batch == 4096 and r.fits


def test_every_suggestion_said_to_fit_is_within_fits_budget():
    """Llama-3-8B at tp 1 + ZeRO-1 without recompute on 2 A100-80GB: plan said `recompute + stage2 -> 75.06 GiB
    fits` (of the device's 80; over --fit's 72 budget) where --fit answers tp 2 at 70.99. Both judge the budget."""
    over = ["--tensor_parallel_degree", "1", "--sharding", "stage1", "--recompute", "false",
            "--per_device_train_batch_size", "1", "--max_seq_length", "2048"]
    sugg = plan(LLAMA3_8B, over, device="A100-80GB", gpus=2)["suggestions"]
    assert sugg[0]["fits"] and sugg[0]["change"]["tensor_parallel_degree"] == 2
    for s in sugg:  # each re-planned as given: "fits" is within the budget, and only then
        r = plan(LLAMA3_8B, over + _tokens(s["change"]), device="A100-80GB", gpus=2, suggest_changes=False)
        assert s["fits"] == (_least(r) <= 72.0), s
    f = fit(LLAMA3_8B, over, device="A100-80GB", gpus=2)
    assert sugg[0]["change"] == {k: new for k, _, new in f["diff"] if k in LAYOUT}
    assert f["after"]["memory_gib"] == pytest.approx(sugg[0]["memory_gib"])


def test_cpu_machines_too_small_for_the_state_still_get_a_count_of_machines(monkeypatch):
    """Llama-3-8B's weights, gradients and AdamW state (119.66 GiB) exceed 4 machines of 20 GiB: plan said only
    'a smaller model or a GPU', and --fit offered no count, yet on 32 such machines (one process each) pp 32 with
    recompute fits. The line names how many machines' memory the state needs, and the count comes first."""
    monkeypatch.setattr(hardware, "cpu_memory_gib", lambda: 20.0)
    monkeypatch.setattr(hardware, "host_available_gib", lambda: 20.0)
    over, node = ["--tensor_parallel_degree", "1", "--sharding", ""], Node(gpus=1)
    first, line = plan(LLAMA3_8B, over, device="cpu", gpus=4, node=node)["suggestions"]
    assert line["machine"] and "the 4 machines planned have 80.0 GiB" in line["why"]
    assert "the state alone needs 6 machines of this one's memory" in line["why"]
    assert first["fits"] and first["gpus"] == 32 and first["change"]["pipeline_parallel_degree"] == 32
    r = plan(LLAMA3_8B, over + _tokens(first["change"]), device="cpu", gpus=32, node=node, suggest_changes=False)
    assert r["device"]["memory_gib"] == 20.0 and _least(r) <= 18.0
    f = fit(LLAMA3_8B, over, device="cpu", gpus=4, node=node)
    assert f["after"] is None and f["machine"] == line["why"]
    assert (f["more_devices"]["gpus"], f["more_devices"]["change"]) == (32, first["change"])


def test_nothing_within_the_budget_says_the_file_fits_the_device(capsys):
    """Llama-3-8B at 256 tokens on one H200: 128.82 GiB as written fits its 141 GiB, not --fit's 126.90 GiB
    budget, and no layout does: 'nothing fits' with a speed before, and now the line saying why."""
    from pretrain_cli.cli import main as cli_main

    assert cli_main(["plan", LLAMA3_8B, "--device", "H200", "--tensor_parallel_degree", "1", "--sharding", "",
                     "--per_device_train_batch_size", "1", "--max_seq_length", "256", "--fit"]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].startswith("  nothing fits: the current layout needs 128.82 GiB")
    assert lines[2] == ("  as written the file fits the device but needs 128.82 GiB per device (step, start-up or an "
                        "evaluation of 1), over the 126.90 GiB budget: it may run as written with less than the 10% "
                        "margin free (--margin)")


def test_fit_o_of_a_runs_args_json_reads_and_writes_its_user_arguments(write_args, tmp_path, capsys):
    """A run's args.json keeps the user's keys under `user_arguments`, which `plan` plans: `-o` wrote the fitted
    keys beside the record (whose `user_arguments` a reader still takes) and listed a command line's `--max_steps`
    as changed from the key's default, not from the file's 123."""
    from pretrain_cli.cli import main as cli_main

    user = json.loads(open(write_args(max_steps=123)).read())
    record = tmp_path / "args.json"
    record.write_text(json.dumps({"version": 1, "arguments": user, "user_arguments": user, "run": {}, "notes": []}))
    out = str(tmp_path / "fitted.json")
    assert cli_main(["plan", str(record), "--device", "A100-40GB", "--max_steps", "456", "--fit", "-o", out]) == 0
    assert "    max_steps: 123 -> 456 (command line)" in capsys.readouterr().out.splitlines()
    written = json.loads(open(out).read())
    assert not {"version", "arguments", "user_arguments", "run"} & set(written) and written["max_steps"] == 456
    assert written["model_name_or_path"] == user["model_name_or_path"]


def test_plans_first_suggestion_carries_fits_eval_change():
    """Llama-3-8B at tp 1 + ZeRO-1 with per_device_eval_batch_size 16 on 2 A100-80GB: plan said 'tp 2 +
    gradient_accumulation_steps 32 fits', yet so followed its first evaluation needs 84.65 GiB; --fit lowers the
    eval batch to 5 with eval_iters 10 -> 64 (320 samples an evaluation kept). Each suggestion said to fit fits as
    given, the evaluation at its own batch too."""
    over = ["--tensor_parallel_degree", "1", "--sharding", "stage1", "--recompute", "false",
            "--per_device_train_batch_size", "1", "--max_seq_length", "2048", "--per_device_eval_batch_size", "16"]
    sugg = plan(LLAMA3_8B, over, device="A100-80GB", gpus=2)["suggestions"]
    f = fit(LLAMA3_8B, over, device="A100-80GB", gpus=2)
    assert sugg[0]["change"] == {k: new for k, _, new in f["diff"] if k in LAYOUT}
    assert (sugg[0]["change"]["per_device_eval_batch_size"], sugg[0]["change"]["eval_iters"]) == (5, 64)
    for s in sugg:
        r = plan(LLAMA3_8B, over + _tokens(s["change"]), device="A100-80GB", gpus=2, suggest_changes=False)
        assert s["fits"] == (_least(r) <= 72.0), s
    layout_only = {k: v for k, v in sugg[0]["change"].items() if k not in ("per_device_eval_batch_size", "eval_iters")}
    r = plan(LLAMA3_8B, over + _tokens(layout_only), device="A100-80GB", gpus=2, suggest_changes=False)
    assert r["eval_memory_gib"] > 80.0  # (what the suggestion without the eval keys ran into)


def test_more_devices_suggestion_says_the_global_batch_it_grows_to():
    """The Llama-3-70B on 2 A100-80GB: plan suggests --gpus 24 with tp 8, where 1 data rank becomes 3 and the
    global batch 16 samples 48; the line says so, as the re-planned file shows."""
    args = ["--model_name_or_path", "meta-llama/Meta-Llama-3-70B"]
    first = plan(LLAMA3_8B, args, device="A100-80GB", gpus=2)["suggestions"][0]
    assert first["gpus"] == 24 and first["fits"]
    assert "; global batch 16 -> 48 samples (3 data ranks)" in first["why"]
    r = plan(LLAMA3_8B, args + _tokens(first["change"]), device="A100-80GB", gpus=24, suggest_changes=False)
    assert r["tokens_per_step"] == 48 * 4096


def test_cpu_machines_no_count_fits_offers_no_more_machines(monkeypatch):
    """Llama-3-70B on cpu machines of 64 GiB (8 processes each): no count up to 4,096 fits, yet the machine line
    said 'plan more machines'. It says no count fits and what the leanest layout on 4,096 still needs a process
    (the CPU's gathered logits, its largest part) over its budget, and the fewest machines of fewer processes that
    fit (32 of 1); --fit's line is the same."""
    monkeypatch.setattr(hardware, "cpu_memory_gib", lambda: 64.0)
    monkeypatch.setattr(hardware, "host_available_gib", lambda: 64.0)
    args = ["--model_name_or_path", "meta-llama/Meta-Llama-3-70B"]
    (line,) = plan(LLAMA3_8B, args, device="cpu")["suggestions"]
    assert line["machine"] and "plan more machines" not in line["why"]
    assert ("no number of processes up to 4096 fits on machines of this one's memory either at 8 processes a machine "
            "(on 4096 the leanest layout still needs 18.56 GiB a process, logits_loss 7.98 of it, over its 7.20 GiB "
            "budget); with fewer processes a machine some do: --gpus_per_node 1 --gpus 32 (32 machines of 1 "
            "process;") in line["why"]
    f = fit(LLAMA3_8B, args, device="cpu")
    assert f["more_devices"] is None and f["machine"] == line["why"]
