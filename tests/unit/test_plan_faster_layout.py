"""`plan --fit`'s `not chosen:` line: why the answer is not a faster layout (`fit.faster_over_budget`)."""
from pathlib import Path

from plan_helpers import fit
from pretrain_cli.planning.fit import faster_over_budget
from pretrain_cli.planning.fit_report import format_fit

REPO = Path(__file__).resolve().parents[2]
TINY = str(REPO / "configs" / "qwen3-moe-tiny_cpu.json")
DSV3 = ["--model_name_or_path", "deepseek-ai/DeepSeek-V3", "--vocab_size", "129280", "--max_seq_length", "4096",
        "--bf16", "true"]


def test_deepseek_v3_on_224_h100_names_the_expert_parallel_layout_over_the_budget():
    """The chosen tp 4 x ZeRO-3 (O2) is traffic-bound; the fastest layout within the device's 80 GiB, tp 2 x pp 7 x
    EP 16, needs 79.73 GiB of the 72 budget: one line names it, its speed and need, faster than the chosen. Its keys
    start with the ones every layout of its search carries (fp16_opt_level O1 -> O2), as the chosen one's do."""
    f = fit(TINY, DSV3, device="H100", gpus=224)
    assert f["change"]["tensor_parallel_degree"] == 4 and f["change"]["sharding"] == "stage3"
    x = f["faster"]
    assert x["diff"][0] == f["diff"][0] == ("fp16_opt_level", "O1", "O2")
    assert dict((k, v) for k, _, v in x["diff"])["expert_parallel_degree"] == 16 and x["on_device"]
    assert f["budget_gib"] < x["least_gib"] <= f["device"]["memory_gib"] and f"{x['least_gib']:.2f}" == "79.73"
    assert x["speed"]["tokens_per_sec"] > f["after"]["speed"]["tokens_per_sec"]
    (line,) = [x for x in format_fit(f).splitlines() if x.startswith("  not chosen:")]
    assert line.startswith("  not chosen: the fastest layout planned within the device's 80.00 GiB "
                           "(fp16_opt_level \"O2\", tensor_parallel_degree 2, pipeline_parallel_degree 7, "
                           "expert_parallel_degree 16, ")
    assert line.endswith("needs 79.73 GiB of the 72.00 GiB budget per device")


def test_the_file_as_written_is_said_once_and_a_no_change_answer_says_why_not_faster():
    """At a 99 % margin the faster layout is the file as written, which the over-budget line names with its need:
    no 'not chosen:' line, no "faster". Where the file is the answer (no change), the layout faster than it is
    named, in the text as in "faster"."""
    f = fit(TINY, [], device="H100", margin=0.99)
    text = format_fit(f).splitlines()
    assert f["diff"] and f["faster"] is None and not any(x.startswith("  not chosen:") for x in text)
    assert any(x.startswith("  as written the file fits the device but needs 0.97 GiB per device") for x in text)
    chosen = ["--per_device_train_batch_size", "1", "--gradient_accumulation_steps", "8", "--recompute", "true",
              "--recompute_granularity", "full_attn", "--per_device_eval_batch_size", "3", "--eval_iters", "8"]
    f = fit(TINY, chosen, device="H100", margin=0.99)
    assert not f["diff"] and f["faster"]["diff"] == [("recompute", True, False)]
    (line,) = [x for x in format_fit(f).splitlines() if x.startswith("  not chosen:")]
    assert line.startswith("  not chosen: the fastest layout planned within the device's 80.00 GiB (recompute false)")


class _Plan:
    def __init__(self, least: float):
        self.least_gib = least


def _entry(seconds: float | None, least: float, change: dict | None = None) -> dict:
    return {"change": change or {}, "report": _Plan(least),
            "speed": None if seconds is None else {"rank_seconds": seconds}}


def test_the_fastest_within_the_device_else_the_leanest_faster(monkeypatch):
    """Of the layouts over the budget and faster than the chosen: the fastest within the device's memory; where
    every one needs more than the device, the leanest; none where nothing is faster or nothing fits."""
    from pretrain_cli.planning import fit as fit_module

    times = {1000.0: 1.0, 300.0: 3.0, 90.0: 5.0, 85.0: 4.0, 70.0: 20.0}  # least GiB -> step seconds over the budget
    monkeypatch.setattr(fit_module, "speed", lambda r: {"rank_seconds": times[r.least_gib]})
    monkeypatch.setattr(fit_module, "rank", lambda e, by_speed: (e["speed"]["rank_seconds"],))
    best = _entry(10.0, 60.0)
    over = [_entry(None, g) for g in (1000.0, 300.0, 90.0, 85.0, 70.0)]
    assert faster_over_budget([best, *over], best, 95.0)["report"].least_gib == 85.0  # 4 s beats 90 GiB's 5
    lean = faster_over_budget([best, *over], best, 80.0)  # none faster within 80: the leanest faster, 85 (70: slower)
    assert lean["report"].least_gib == 85.0 and not lean["on_device"]
    assert faster_over_budget([best, _entry(None, 70.0)], best, 95.0) is None  # slower than the chosen
    assert faster_over_budget(over, None, 95.0) is None  # nothing fits: no chosen layout to compare
