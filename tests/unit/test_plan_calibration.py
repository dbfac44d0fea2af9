"""The planner's CPU memory model against measured training steps (benchmarks/plan_calibration.py).

One process per config keeps each allocator peak isolated: forked from a process that has already imported
Paddle (tests/forkserver.py), so each costs its two training steps, not an interpreter start-up; the layouts' ranks
are forked the same way (tests/distributed/rank_shim.py).
"""
import dataclasses
import sys
from pathlib import Path

import forkserver
import pytest
from bench_scripts import load

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "distributed"))
from launch_helpers import launch  # noqa: E402


def _bench():
    return load("plan_calibration")


# The table's rows at 52 M parameters but the plain one: ~49 of the table's ~110 s. Their claims are the rows of
# the same recompute granularity and loss at a smaller shape (each at 52 M within 3.3 %: the benchmark prints them).
_AT_52M_ELSEWHERE = ("llama-52m b2 s256 core_attn", "llama-52m b4 s256 fused loss")


@pytest.fixture(scope="module")
def rows():
    """Every config's row but `_AT_52M_ELSEWHERE` (the fused-loss test below reads the measured peak of its config
    from here)."""
    bench = _bench()
    return bench.calibrate([c for c in bench.CONFIGS if c[0] not in _AT_52M_ELSEWHERE], python=forkserver.run)


def test_prediction_within_20_percent_of_measured_peak(rows):
    bench = _bench()
    assert len(rows) >= 4
    assert {r["recompute"] for r in rows} == {"off", "full", "full_attn", "core_attn"}
    assert sum("fused loss" in r["config"] for r in rows) == 2  # an untied (llama) head and a tied one (qwen2)
    assert max(r["params"] for r in rows) > 40e6
    bad = [f"{r['config']}: predicted {r['predicted_mib']:.1f} MiB, measured {r['measured_mib']:.1f} MiB"
           for r in rows if abs(r["error"]) > 0.20]
    assert not bad, "\n" + bench.table(rows)


def _forked_ranks(script, args_path, log_dir, nproc):
    return launch(args_path, log_dir, nproc=nproc, timeout=600, rank_script=script)


def test_parallel_layouts_within_20_percent_of_measured_peak():
    """DP, ZeRO-2, ZeRO-3 and TP on 2 processes (the first rows of benchmarks/plan_calibration.py --layouts): the
    largest rank's allocator peak over a real `train_step` of the product's own build order. The table's llama-52m with 4
    layers and an 8,000-token vocabulary (20 M parameters; errors +2.0, +2.9, +3.1 and −0.7 %, docs/PLAN.md);
    the ranks forked (`launch`), which measure the same peaks to the byte as fresh ones (513.1, 360.5, 333.4 and
    555.4 MiB either way)."""
    bench = _bench()
    model = dict(bench.LLAMA_52M, num_hidden_layers=4, vocab_size=8000)
    rows = bench.calibrate_layouts([x for x in bench.LAYOUTS if x[0] in ("data parallel b2", "ZeRO-2 b2", "ZeRO-3 b2",
                                                                         "TP2 b8")], launch=_forked_ranks, model=model)
    assert len(rows) == 4
    assert min(r["params"] for r in rows) > 19e6
    bad = [f"{r['config']}: predicted {r['predicted_mib']:.1f} MiB, measured {r['measured_mib']:.1f} MiB"
           for r in rows if abs(r["error"]) > 0.20]
    assert not bad, "\n" + bench.table(rows)


def test_head_backward_at_few_tokens_is_not_under_the_plan():
    """ZeRO-2 and ZeRO-3 with the loss unfused (a GPU's default where the fused head + loss holds more) at b 1 × s 64:
    the step peaks in the LM head's backward, on a new whole dW and the gloo all-reduce's copy of it, where the logits
    are small (`planning.activations.head_backward_bytes`). The 20 M model of the test above; the plan at or above
    each peak and within 15 % (llama-52m: docs/PLAN.md's layouts table; it was 14.9 % and 8.6 % under there, and
    here 9.7 % and 5.4 %: 245.0 and 225.6 MiB planned, 271.4 and 238.5 measured; now 272.3 and 253.0)."""
    bench = _bench()
    model = dict(bench.LLAMA_52M, num_hidden_layers=4, vocab_size=8000)
    names = ("ZeRO-2 b1 s64 unfused", "ZeRO-3 b1 s64 unfused")
    rows = bench.calibrate_layouts([x for x in bench.LAYOUTS if x[0] in names], launch=_forked_ranks, model=model)
    assert [r["config"] for r in rows] == list(names) and {r["seq"] for r in rows} == {64}
    print(bench.table(rows))
    bad = [f"{r['config']}: predicted {r['predicted_mib']:.1f} MiB, measured {r['measured_mib']:.1f} MiB"
           for r in rows if not 0 <= r["error"] <= 0.15]
    assert not bad, "\n" + bench.table(rows)


def test_pipeline_expert_zero1_stages_and_what_zero1_saves_on_each():
    """DeepSeek's pp x ep x ZeRO-1 at its smallest (benchmarks/plan_calibration.py --stages: pp2 x ep2 on 4 processes,
    with DP and with ZeRO-1 over the 2 data ranks; micro-deepseek-v3 widened, the first layer dense): each stage's
    largest rank peak within 10 % of its own plan (+6.4/+5.0 % DP, +6.9/+5.4 % ZeRO-1: each stage's own layers, dense or
    sparse, a sparse layer's experts' backward (`experts.backward_bytes`), the ungated shared experts and MLA at its
    tensors' own widths; +5.7/+2.4 % and +6.1/+2.5 % with an average
    layer's on each stage, those experts uncounted and MLA at its padded width), and what ZeRO-1 saves on each
    stage (the DP peak less the ZeRO-1 one: half the AdamW state of all but the stage's own experts) within 5 %
    (2.29 and 3.50 MiB, measured and planned alike). Before, each stage counted every stage's experts as its unsharded
    state: ZeRO-1 planned to cost stage 0 1.64 MiB and to save stage 1 1.44 (stage 0 at +14.8 %)."""
    bench = _bench()
    rows = {r["config"]: r for r in bench.calibrate_stages(launch=_forked_ranks)}
    assert len(rows) == 4
    bad = [f"{name}: predicted {r['predicted_mib']:.2f} MiB, measured {r['measured_mib']:.2f} MiB"
           for name, r in rows.items() if abs(r["error"]) > 0.10]
    assert not bad, "\n" + bench.table(list(rows.values()))
    for stage in (0, 1):
        dp, zero1 = rows[f"pp2 x ep2 DP b2 stage {stage}"], rows[f"pp2 x ep2 x ZeRO-1 b2 stage {stage}"]
        measured, planned = (dp[k] - zero1[k] for k in ("measured_mib", "predicted_mib"))
        assert measured > 1.0 and abs(planned / measured - 1) <= 0.05, (stage, measured, planned)


def test_pipeline_expert_stages_with_large_experts():
    """The same pp2 x ep2 DP with experts 4x as large (16 of width 512; `--stages`' last rows): each stage within 10 %
    of its plan (+2.9 % and +4.7 %; -0.9 % and -2.2 % before each stage's own layers were planned). The experts' GEMMs
    kept a copy of their weights for backward (the concatenated
    gate | up per expert, or every expert's weights stacked: 6 MiB a sparse layer and micro-batch in flight here),
    which the plan does not count: stage 0 at -15.8 %, stage 1 at -14.7 % (ops/grouped_gemm_layer.py keeps the
    parameters instead)."""
    bench = _bench()
    rows = bench.calibrate_stages(bench.LARGE_EXPERT_LAYOUTS, launch=_forked_ranks, model=bench.MICRO_V3_LARGE_EXPERTS)
    assert len(rows) == 2 and min(r["params"] for r in rows) > 2e6
    bad = [f"{r['config']}: predicted {r['predicted_mib']:.2f} MiB, measured {r['measured_mib']:.2f} MiB"
           for r in rows if abs(r["error"]) > 0.10]
    assert not bad, "\n" + bench.table(rows)


def test_fused_loss_saves_the_logits_memory_the_plan_says(rows):
    """At Qwen's vocabulary (151,936) one step's allocator peak with the fused LM head + loss is lower than with
    the logits by roughly the logits' size, and by what the memory model predicts (±20 %)."""
    import tempfile

    from pretrain_cli.models.config import ModelConfig
    from pretrain_cli.planning.activations import logits_live_bytes
    from pretrain_cli.planning.memory import Setup

    bench = _bench()
    name, preset, over, b, s, rc = next(c for c in bench.CONFIGS if "151,936" in c[0])[:6]
    # the fused loss is the default: calibrate() measured exactly this (same spec, a fresh process)
    fused = next(r for r in rows if r["config"] == name)["measured_mib"] * 2**20
    with tempfile.TemporaryDirectory() as d:
        model_dir, _ = bench._write(Path(d), "qwen_vocab", preset, over, b, s, rc, {})
        unfused = bench.measure(model_dir, b, s, rc, fused=False, python=forkserver.run)["peak"]
        cfg = ModelConfig.from_file(str(model_dir))
    setup = Setup(model=cfg, micro_batch=b, seq_len=s, device="cpu", attention="math")
    predicted = logits_live_bytes(setup) - logits_live_bytes(dataclasses.replace(setup, fused_loss=True))
    logits = b * s * cfg.vocab_size * 4  # one fp32 [b, s, V] tensor
    saved = unfused - fused
    print(f"saved {saved / 2**20:.0f} MiB, predicted {predicted / 2**20:.0f} MiB, fp32 logits {logits / 2**20:.0f} MiB")
    assert saved > logits
    assert abs(saved / predicted - 1) <= 0.20


@pytest.mark.parametrize("fused", [False, True])
def test_the_mtp_modules_share_is_what_a_step_adds(fused, tmp_path):
    """DeepSeek-V3's multi-token prediction module (micro-deepseek-v3 widened to hidden 128 and vocabulary 4,096;
    b 2 × s 256, fp32, Paddle's ops, math attention): a step's allocator peak with the module less the same step's
    without it against the plan's MTP share (±10 %). Unfused, each depth's head keeps one fp32 [b·s, V] softmax past
    the main head's peak (20.3 MiB predicted, 19.3 measured), not a whole set of logits buffers (28.3 predicted
    before: +47 %)."""
    from pretrain_cli.orchestration.planned import from_file

    bench = _bench()
    b, s = 2, 256
    shares = []
    for depth in (1, 0):
        over = {"hidden_size": 128, "vocab_size": 4096, "num_nextn_predict_layers": depth}
        extra = {"use_fused_linear_cross_entropy": fused, "use_flash_attention": False, "cpu_fused_ops": False}
        model_dir, args_path = bench._write(tmp_path, f"mtp{depth}", "micro-deepseek-v3", over, b, s, None, extra)
        m = bench.measure(model_dir, b, s, None, fused=fused, python=forkserver.run)
        plan = from_file(str(args_path), [], device="cpu", suggest_changes=False, baseline_bytes=m["baseline"])
        shares.append((m["peak"], plan.memory_gib * 2**30))
    (measured, predicted), (measured_bare, predicted_bare) = shares
    measured, predicted = measured - measured_bare, predicted - predicted_bare
    print(f"MTP share: measured {measured / 2**20:.1f} MiB, predicted {predicted / 2**20:.1f} MiB")
    assert abs(predicted / measured - 1) <= 0.10
