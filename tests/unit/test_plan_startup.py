"""`plan` models start-up (what a rank holds while the run is built), and `--fit` never recommends a layout whose
start-up does not fit: the rule of `planning.memory.startup_parts` checked against hand arithmetic."""
import dataclasses
import json
from pathlib import Path

import pytest
from run_helpers import model_config

from pretrain_cli.orchestration.planned import parse as parsed
from plan_helpers import fit, plan
from pretrain_cli.distributed.layout import topology
from pretrain_cli.orchestration import planned
from pretrain_cli.planning import fit as fit_search
from pretrain_cli.planning import plan as plan_module
from pretrain_cli.planning.report import format_report
from pretrain_cli.planning.memory import FRAGMENTATION, FRAMEWORK_GIB, GIB, Setup, startup_parts

LLAMA = Path(__file__).resolve().parents[1] / "e2e" / "paddlenlp_configs" / "llama_pretrain_argument.json"
TO_70B = ["--model_name_or_path", "meta-llama/Llama-3.1-70B"]
# Llama-3.1-70B by hand: 80 layers of q, o (8192²), k, v (8192 x 1024), gate, up, down (8192 x 28672), two norms
H, I, V, L = 8192, 28672, 128256, 80
LAYER = 2 * H * H + 2 * H * 1024 + 3 * H * I + 2 * H


def _framework(parts_bytes: float) -> float:
    return FRAMEWORK_GIB * GIB + FRAGMENTATION * parts_bytes


def test_llama_70b_on_64_h100_fit_recommends_a_layout_whose_start_up_fits():
    """The issue's case: PaddleNLP's Llama-3-8B file as Llama-3.1-70B on 64 x H100. The file as written (tp 2,
    ZeRO-2) builds 1/2 of the model in fp32 on every rank: start-up does not fit. The fitted layout's start-up is
    within the budget, and `plan` of the fitted file reports the same figure and `fits`."""
    written = plan(str(LLAMA), TO_70B, device="H100", gpus=64, suggest_changes=False)
    params = written["params"]["total"]
    assert params == V * H * 2 + L * LAYER + H
    # tp 2 (vocabulary split too), ZeRO-2 keeps whole weights: half the model in fp32 but the RMSNorms (whole on each
    # tp rank, `models.tp_plan`) + the whole embedding in fp32
    norms = (2 * L + 1) * H
    start = ((params - norms) / 2 * 4 + norms * 4 + V * H * 4)
    assert written["startup_gib"] * GIB == pytest.approx(start + _framework(start))
    assert written["startup_gib"] > 80 and not written["fits"]
    topology._all_groups.cache_clear()
    f = fit(str(LLAMA), TO_70B, device="H100", gpus=64)
    assert f["after"] is not None and f["after"]["startup_gib"] <= f["budget_gib"] == pytest.approx(72.0)
    # over a thousand candidates (tp within a node: 1, 2, 4, 8), a few dozen layouts of degrees: the rank groups are
    # laid out once per layout
    assert f["tried"] > 1000 and topology._all_groups.cache_info().misses <= 64
    assert f["after"]["memory_gib"] <= f["budget_gib"]
    tokens = [t for k, v in f["change"].items() for t in (f"--{k}", json.dumps(v) if isinstance(v, bool) else str(v))]
    again = plan(str(LLAMA), TO_70B + tokens, device="H100", gpus=64, suggest_changes=False)
    assert again["startup_gib"] == pytest.approx(f["after"]["startup_gib"]) and again["fits"]
    assert f["before"]["startup_gib"] == pytest.approx(written["startup_gib"])


def test_pp8_stage1_start_up_by_hand():
    """What the fit recommended before start-up was modelled (pp 8, ZeRO-1, recompute: 62.86 GiB steady with the
    fused head + loss, its two head-sized dW buffers (ops.linear_loss), 59.37 with the logits, the GPU default at
    4,096 tokens under hidden 8,192): its first stage builds 10 layers and the embedding in fp32 plus the embedding
    once more as the transient."""
    keys = TO_70B + ["--tensor_parallel_degree", "1", "--pipeline_parallel_degree", "8", "--sharding", "stage1",
                     "--gradient_accumulation_steps", "64", "--recompute", "true"]
    r = plan(str(LLAMA), keys, device="H100", gpus=64, suggest_changes=False)
    assert r["memory_gib"] == pytest.approx(59.37, abs=0.05)
    fused = plan(str(LLAMA), keys + ["--use_fused_linear_cross_entropy", "true"], device="H100", gpus=64,
                 suggest_changes=False)
    assert fused["memory_gib"] == pytest.approx(62.86, abs=0.05) and fused["startup_gib"] == r["startup_gib"]
    weights, transient = (10 * LAYER + V * H) * 4, V * H * 4
    assert r["startup_breakdown_gib"]["weights"] * GIB == pytest.approx(weights)
    assert r["startup_breakdown_gib"]["transient"] * GIB == pytest.approx(transient)
    assert r["startup_gib"] * GIB == pytest.approx(weights + transient + _framework(weights + transient))
    assert r["startup_gib"] == pytest.approx(42.44, abs=0.01) and r["fits"]


def test_start_up_divides_by_what_each_rank_holds():
    """ZeRO-3 divides the built weights by the sharding degree, ZeRO-1/2 do not (whole weights at start-up); TP
    divides them; a middle pipeline stage's transient is a layer's largest matrix, not the embedding."""
    cfg = model_config("llama-3.1-70b")
    base = Setup(model=cfg, micro_batch=1, seq_len=4096, compute_bytes=2, amp_level="O2")
    whole = startup_parts(base)["weights"]
    assert whole == pytest.approx((V * H * 2 + L * LAYER + H) * 4)
    for stage, expect in ((1, whole), (2, whole), (3, whole / 2 / 16)):  # ZeRO-3's shards: created in bf16 (O2)
        got = startup_parts(Setup(**{**base.__dict__, "sharding_stage": stage, "sharding_degree": 16}))
        assert got["weights"] == pytest.approx(expect)
    tp8 = startup_parts(Setup(**{**base.__dict__, "tp": 8, "vocab_parallel": True}))
    norms = (2 * L + 1) * H * 4  # the RMSNorms, whole on each tp rank
    assert tp8["weights"] == pytest.approx((whole - norms) / 8 + norms) and tp8["transient"] == 2 * 4 * V * H / 8  # a placed block, twice
    # TP inside stages: each layer's tp weight created as its slice (twice the largest), the LM head whole (once)
    tp_pp = startup_parts(Setup(**{**base.__dict__, "tp": 8, "pp": 4}))
    assert tp_pp["transient"] == pytest.approx(max(4 * V * H, 2 * 4 * H * I / 8))
    assert tp_pp["transient"] < 4 * 20 * LAYER / 4  # far below a stage's whole weights
    from pretrain_cli.planning.memory import largest_tensor
    assert largest_tensor(Setup(**{**base.__dict__, "pp": 4}), 1) == H * I  # no embedding on a middle stage
    cpu = startup_parts(Setup(**{**base.__dict__, "device": "cpu", "baseline_bytes": 123.0}))
    assert cpu["framework"] == 123.0


def test_a_layout_whose_start_up_does_not_fit_is_reported_and_never_recommended(monkeypatch, capsys):
    """Made so by inflating the start-up of every pipeline or TP layout: `plan` says it does not fit (steady state would),
    and `--fit` picks something else; the text report prints the start-up line with its verdict."""
    real = plan_module.startup_parts

    def inflated(s):
        parts = real(s)
        return {**parts, "weights": parts["weights"] + (1000 * GIB if s.pp > 1 or s.tp > 1 else 0)}

    honest = fit(str(LLAMA), TO_70B, device="H100", gpus=64)
    assert honest["change"].get("tensor_parallel_degree", 1) > 1  # the honest fit uses tensor parallelism
    monkeypatch.setattr(plan_module, "startup_parts", inflated)
    pp8 = TO_70B + ["--pipeline_parallel_degree", "8", "--tensor_parallel_degree", "1", "--sharding", "stage1",
                    "--recompute", "true", "--gradient_accumulation_steps", "64"]
    r = planned.plan(*parsed(str(LLAMA), pp8), "H100", 64, suggest_changes=False)
    assert r.memory_gib < 80 < r.startup_gib and not r.fits
    assert format_report(r).count("DOES NOT FIT") == 1
    assert "start-up per device: " in format_report(r)
    f = fit(str(LLAMA), TO_70B, device="H100", gpus=64)
    assert f["after"] is None or (f["change"].get("pipeline_parallel_degree", 1) == 1
                                  and f["change"].get("tensor_parallel_degree", 2) == 1)


def test_search_filters_on_the_larger_of_steady_state_and_start_up():
    """`planning.fit.search` with planned reports made up: the faster layout's start-up exceeds the budget."""
    real = planned.plan(*parsed(str(LLAMA), []), "H100", 1, suggest_changes=False)

    def report(memory, startup, micro):
        return dataclasses.replace(real, memory_gib=memory, startup_gib=startup, micro_batch=micro,
                                   tokens_per_step=real.max_seq_length * micro, eval_least_gib=None)  # (no eval)

    base = report(50.0, 90.0, 2)
    cur = {"per_device_train_batch_size": 2, "gradient_accumulation_steps": 1, "recompute": False,
           "recompute_granularity": "full", "use_flash_attention": True, "sharding": "", "tensor_parallel_degree": 1,
           "pipeline_parallel_degree": 1}
    found = fit_search.search(cur, base, lambda change: report(60.0, 10.0, change.get(
        "per_device_train_batch_size", 2)), budget_gib=72.0)
    assert found["best"]["report"].startup_gib == 10.0  # the base (steady 50) is not chosen: start-up 90
    assert found["smallest"]["report"].startup_gib == 10.0


def test_out_of_memory_hint_covers_start_up(monkeypatch):
    """`train`'s out-of-memory hint re-fits under the failed layout's peak, start-up included."""
    from pretrain_cli.orchestration.out_of_memory_hint import out_of_memory_fit

    args, cfg = parsed(str(LLAMA), TO_70B)
    predicted, f = out_of_memory_fit(args, cfg, "H100", 64)
    r = plan(str(LLAMA), TO_70B, device="H100", gpus=64, suggest_changes=False)
    assert predicted == pytest.approx(max(r["memory_gib"], r["startup_gib"]))
    assert f["after"] is not None and max(f["after"]["memory_gib"], f["after"]["startup_gib"]) <= 72.0


def test_zero2_keeps_whole_weights_so_start_up_decides():
    """Qwen2.5-32B under ZeRO-2 on 64 x H20 (96 GiB): the steady state fits (bf16 weights, sharded states), but
    every rank builds the whole model in fp32 first. `plan` says it cannot start, and `--fit` moves off a layout
    whose steady state alone is within the budget."""
    over = ["--model_name_or_path", "Qwen/Qwen2.5-32B", "--tensor_parallel_degree", "1", "--recompute", "true"]
    r = planned.plan(*parsed(str(LLAMA), over), "H20", 64, suggest_changes=True)
    n = r.params["total"]
    assert r.memory_gib <= 96 < r.startup_gib and not r.fits
    assert r.startup_breakdown_gib["weights"] * GIB == pytest.approx(4 * n)  # ZeRO-2 does not shard weights
    text = format_report(r)
    assert "-> fits\n" in text and "-> DOES NOT FIT: train cannot start" in text
    assert r.suggestions and r.suggestions[0]["fits"] and r.suggestions[0]["memory_gib"] < 96
    f = fit(str(LLAMA), over, device="H20", gpus=64)
    assert f["before"]["memory_gib"] <= f["budget_gib"] < f["before"]["startup_gib"]
    assert f["diff"] and f["after"]["startup_gib"] <= f["budget_gib"] and f["after"]["memory_gib"] <= f["budget_gib"]
