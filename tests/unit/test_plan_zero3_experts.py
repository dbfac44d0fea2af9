"""A Mixture-of-Experts model under the semi-auto engine's ZeRO-3 (`distributed.steps.moe_layouts.LocalDispatch`):
each sparse layer's routed experts are gathered inside the grouped GEMM, which keeps their shards until its
backward and gathers them again there (`ops.grouped_gemm_layer.StackedGemm`), and their gradients come back as
shards (`planning.memory._parts`, `_cpu_zero3_sharded_grads`). Measured on 2 gloo ranks forked as
tests/unit/test_plan_calibration.py's layouts are."""
import dataclasses
import json
import sys
from pathlib import Path

from bench_scripts import load

from pretrain_cli.config.presets import PRESET_DIR
from pretrain_cli.models.config import ModelConfig
from pretrain_cli.orchestration.planned import from_file
from pretrain_cli.planning.memory import Setup, estimate, stage_experts

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "distributed"))
from launch_helpers import launch  # noqa: E402

# micro-qwen3-moe widened so its experts (48 MiB on a rank, whole) outweigh the rest
WIDE = {"hidden_size": 128, "intermediate_size": 512, "moe_intermediate_size": 1024, "num_hidden_layers": 4,
        "vocab_size": 2048, "head_dim": 32}


def test_zero3_gathers_one_layers_experts_at_a_time_and_shards_their_gradients():
    """Per rank at S 2: one sparse layer's experts whole in `gathered_weights` (the grouped GEMM gathers them where it
    reads them and keeps the shards until backward; the largest weight gathered here), with or without `full`
    recompute, and their gradients ÷ S."""
    cfg = dataclasses.replace(ModelConfig.from_file(str(PRESET_DIR / "micro-qwen3-moe")), **WIDE)
    kw = dict(model=cfg, micro_batch=2, seq_len=128, device="cpu", attention="math", distributed_tensors=True,
              sharding_degree=2)
    z3, z2 = estimate(Setup(sharding_stage=3, **kw)), estimate(Setup(sharding_stage=2, **kw))
    experts = stage_experts(Setup(**kw))
    assert experts == 4 * 8 * 3 * 128 * 1024
    assert z3["gathered_weights"] == 4 * experts / 4  # one of the 4 sparse layers (> the embedding, 128 x 2048)
    assert z2["gradients"] - z3["gradients"] >= 4 * experts / 2
    full = estimate(Setup(sharding_stage=3, recompute="full", **kw))
    assert full["gathered_weights"] == 4 * experts / 4


def _forked_ranks(script, args_path, log_dir, nproc):
    return launch(args_path, log_dir, nproc=nproc, timeout=600, rank_script=script)


def _planned_and_measured(tmp_path, sharding: str) -> tuple[float, float]:
    """(planned, measured) bytes: the largest rank's allocator peak over the second step and its plan."""
    bench = load("plan_calibration")
    _, args_path = bench._write(tmp_path, "moe", "micro-qwen3-moe", WIDE, 2, 128, None, {})
    args = json.loads(args_path.read_text())
    args.update(sharding=sharding, cpu_fused_ops=False, use_flash_attention=False, report_to=["none"])
    args_path.write_text(json.dumps(args))
    m = bench.measure_layout(args_path, 2, tmp_path / "log", _forked_ranks)
    r = from_file(str(args_path), [], device="cpu", gpus=2, suggest_changes=False, baseline_bytes=m["baseline"])
    return r.to_json()["memory_gib"] * 2**30, m["peak"]


def test_a_moe_models_zero3_peak_is_planned(tmp_path):
    """The largest rank's allocator peak over the second step, 157.5 MiB measured: planned 158.7 (+0.8 %). When the
    grouped GEMM kept every layer's gathered experts until backward, 203.6 measured and 197.7 planned."""
    planned, peak = _planned_and_measured(tmp_path, "stage3")
    assert abs(planned / peak - 1) <= 0.05, (planned / 2**20, peak / 2**20)


def test_a_moe_models_zero2_peak_is_planned(tmp_path):
    """ZeRO-2 on the same model peaks in the last sparse layer's SwiGLU backward, on d(gate|up) beside the down
    projection's whole dW (`experts.backward_bytes`): 208.2 MiB measured, planned 205.1 (−1.5 %; the rest is the
    routing: the padded path ran 1.64 and 1.92 rows a routed row on the two ranks, 1.25 planned for balanced
    routing). Uncounted before: 196.1 planned (−5.8 %)."""
    planned, peak = _planned_and_measured(tmp_path, "stage2")
    assert -0.03 <= planned / peak - 1 <= 0.05, (planned / 2**20, peak / 2**20)
