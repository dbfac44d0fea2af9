"""Check `pretrain-cli plan`'s memory model against real training steps on this CPU.

For each config, the planner predicts the peak of one steady-state training step in its
"cpu" mode (fp32, math attention, no GPU framework constant but the measured allocator
baseline), and a fresh subprocess measures it: build the model with Paddle's own ops
(`pretrain_cli.models.build_model`, `cpu_fused_ops: false`: what the model describes; the fused CPU
kernels need less, so the plan is an upper bound for them), `paddle.optimizer.AdamW`, the loss `model(x, labels=y)`
computes (from the logits, or in the rows with the fused LM head + loss, the default, on Paddle's ops: the GPU path);
one warm-up step creates gradients and AdamW moments, then the peak of Paddle's host allocator
(`paddle.base.core.host_memory_stat_peak_value('Allocated', 0)`) over the second step is
read. A fresh process per config keeps the peaks isolated. RSS is printed for reference only:
it adds the ~300 MB import and allocator caching that the planner does not model.

Parallel layouts (`--layouts`): the same model trained by the product's own build order
(`Trainer` over `training.run.lay_out` + `Trainer.train_step`) under `python -m paddle.distributed.launch`, data
parallel, fleet's ZeRO-1, ZeRO-2/3 and tensor parallelism on 2 processes; the largest rank's
allocator peak over the second step against `plan --device cpu --gpus 2`; the head + loss fused (the CPU default)
and unfused (a GPU's where it holds less), at b 2 x s 256 and at b 1 x s 64, where the LM head's backward peaks.
Pipeline stages (`--stages`): DeepSeek's pipeline x expert parallelism with and without ZeRO-1 on 4 processes (and
with experts 4x as large), each stage's largest peak against its own plan.

    python benchmarks/plan_calibration.py            # table (markdown)
    python benchmarks/plan_calibration.py --layouts  # the parallel layouts
    python benchmarks/plan_calibration.py --stages   # pp2 x ep2 with and without ZeRO-1 (and experts 4x), each stage
    python benchmarks/plan_calibration.py --json     # rows as JSON
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from pretrain_cli.config.presets import PRESET_DIR as PRESETS

# q/k norms, head_dim 64 != 128/4
QWEN3 = {"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], "head_dim": 64}
UNFUSED = {"use_fused_linear_cross_entropy": False}  # the [b, s, V] logits and Paddle's cross-entropy
LLAMA_52M = {"hidden_size": 512, "intermediate_size": 1408, "num_hidden_layers": 6, "num_attention_heads": 8,
             "num_key_value_heads": 4, "vocab_size": 32000}
# name, preset, model overrides, micro-batch, seq, recompute granularity (None = off)[, argument-file overrides]
CONFIGS = [
    ("micro-llama b2 s128", "micro-llama", {}, 2, 128, None, UNFUSED),
    ("tiny-qwen2 b4 s256", "tiny-qwen2", {}, 4, 256, None, UNFUSED),
    ("tiny-llama b4 s512 full", "tiny-llama", {}, 4, 512, "full", UNFUSED),
    ("tiny-llama b8 s128 full_attn", "tiny-llama", {}, 8, 128, "full_attn", UNFUSED),
    ("tiny-llama b8 s128 core_attn", "tiny-llama", {}, 8, 128, "core_attn", UNFUSED),
    ("llama-52m b2 s256", "tiny-llama", LLAMA_52M, 2, 256, None, UNFUSED),
    ("llama-52m b2 s256 core_attn", "tiny-llama", LLAMA_52M, 2, 256, "core_attn", UNFUSED),
    ("qwen3 b4 s256", "tiny-qwen2", QWEN3, 4, 256, None, UNFUSED),
    # document masking on the math path: the [b, 1, s, s] mask, doc_start and position_ids, gathered RoPE rows
    ("qwen3 b4 s256 document", "tiny-qwen2", QWEN3, 4, 256, None, {"attention_mask_type": "document", **UNFUSED}),
    # the fused LM head + loss (the default): no [b, s, V] logits, dh and dW kept from forward to backward
    ("llama-52m b4 s256 fused loss", "tiny-llama", LLAMA_52M, 4, 256, None),
    ("tiny-llama vocab 32,000 b4 s256 fused loss", "tiny-llama", {"vocab_size": 32000}, 4, 256, None),
    ("qwen vocab 151,936 b2 s256 fused loss", "tiny-qwen2", {"vocab_size": 151936}, 2, 256, None),
]

_CHILD = r"""
import json, resource, sys
from pretrain_cli import runtime
paddle = runtime.import_paddle()
from pretrain_cli.ops import kernels
from pretrain_cli.run_config import Recompute
from pretrain_cli.ops.loss import mean_loss
from pretrain_cli.models import ModelConfig, build_model
from pretrain_cli.models.recompute import apply_recompute
core = paddle.base.core
spec = json.loads(sys.argv[1])
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()
rss0 = rss()
base = core.host_memory_stat_current_value("Allocated", 0)
paddle.seed(0)
cfg = ModelConfig.from_file(spec["model_dir"])
# Paddle's own ops: the path the memory model describes (the GPU's non-flash kernels). The fused CPU
# kernels keep less (no [N, V] softmax, one probability tensor per layer): the plan is an upper bound there.
# use_flash_attention false (the plan's "math" path): the scores are materialised, as the model assumes
model = build_model(cfg, kernels.select(kernels.KernelConfig(attention="math", cpu_ops=False, fused_loss=spec["fused"]),
                                        "cpu"))
model.train()
apply_recompute(model, Recompute(spec["recompute"]) if spec["recompute"] else None)
opt = paddle.optimizer.AdamW(learning_rate=1e-4, parameters=model.parameters(), weight_decay=0.01)
ids = paddle.randint(0, cfg.vocab_size, [spec["b"], spec["s"] + 1], dtype="int64")
x, y = ids[:, :-1], ids[:, 1:]
doc = {}
if spec["document"]:  # documents of 37 tokens, positions restarting at each
    pos = paddle.arange(spec["s"], dtype="int64").reshape([1, -1]).expand([spec["b"], spec["s"]])
    doc = {"doc_start": pos - pos % 37, "position_ids": pos % 37}
def step():
    loss = mean_loss(*model(x, labels=y, **doc))  # the logits and their loss, or the fused head + loss
    loss.backward()
    opt.step()
    opt.clear_grad()
step()
core.host_memory_stat_reset_peak_value("Allocated", 0)
step()
peak = core.host_memory_stat_peak_value("Allocated", 0)
print(json.dumps({"baseline": base, "peak": peak - base,
                  "rss_delta": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - rss0}))
"""


def _write(tmp: Path, name: str, preset: str, over: dict, b: int, s: int, rc, extra: dict) -> tuple[Path, Path]:
    model_dir = tmp / name.replace(" ", "_")
    model_dir.mkdir(parents=True, exist_ok=True)
    cfg = json.loads((PRESETS / preset / "config.json").read_text())
    cfg.update(over)
    (model_dir / "config.json").write_text(json.dumps(cfg))
    args = {"model_name_or_path": str(model_dir), "input_dir": str(tmp / "data"), "output_dir": str(tmp / "out"),
            "do_train": True, "max_steps": 1, "device": "cpu", "per_device_train_batch_size": b,
            "max_seq_length": s, "recompute": rc is not None, "recompute_granularity": rc or "full", **extra}
    path = model_dir / "args.json"
    path.write_text(json.dumps(args))
    return model_dir, path


def _fresh_interpreter(args: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=300)


def measure(model_dir: Path, b: int, s: int, rc, document: bool = False, fused: bool = True,
            python=_fresh_interpreter) -> dict:
    """One config's allocator peak in a process of its own. `python(args)` runs `python ARGS` and returns the
    CompletedProcess (the tests fork it from a process that has already imported Paddle)."""
    spec = json.dumps({"model_dir": str(model_dir), "b": b, "s": s, "recompute": rc, "document": document,
                       "fused": fused})
    out = python(["-c", _CHILD, spec])
    if out.returncode:
        raise RuntimeError(f"measurement failed ({out.returncode}): {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def calibrate(configs=CONFIGS, python=_fresh_interpreter) -> list[dict]:
    from pretrain_cli.orchestration.planned import from_file

    rows = []
    with tempfile.TemporaryDirectory() as d:
        for name, preset, over, b, s, rc, *rest in configs:
            extra = rest[0] if rest else {}
            model_dir, args_path = _write(Path(d), name, preset, over, b, s, rc, extra)
            m = measure(model_dir, b, s, rc, extra.get("attention_mask_type") == "document",
                        extra.get("use_fused_linear_cross_entropy", True), python)
            r = from_file(str(args_path), [], device="cpu", suggest_changes=False,
                          baseline_bytes=m["baseline"]).to_json()
            pred = r["memory_gib"] * 2**30
            rows.append({"config": name, "params": r["params"]["total"], "micro_batch": b, "seq": s,
                         "recompute": rc or "off", "predicted_mib": pred / 2**20,
                         "measured_mib": m["peak"] / 2**20, "error": pred / m["peak"] - 1,
                         "rss_delta_mib": m["rss_delta"] / 2**20,
                         "breakdown_mib": {k: v * 1024 for k, v in r["memory_breakdown_gib"].items()}})
    return rows


# name, processes, argument-file keys: the llama-52m shape above, fp32, Paddle's ops, math attention
LAYOUTS = [
    ("data parallel b2", 2, {}),
    ("ZeRO-1 (fleet) b2", 2, {"sharding": "stage1"}),
    ("ZeRO-2 b2", 2, {"sharding": "stage2"}),
    ("ZeRO-3 b2", 2, {"sharding": "stage3"}),
    ("TP2 b2", 2, {"tensor_parallel_degree": 2}),
    ("TP2 b8", 2, {"tensor_parallel_degree": 2, "per_device_train_batch_size": 8}),
    # a few tokens a micro-batch: the LM head's backward (a new whole dW, the gloo all-reduce's copy) is the step's
    # peak, not the logits (`planning.activations.head_backward_bytes`)
    ("data parallel b1 s64 unfused", 2, {"per_device_train_batch_size": 1, "max_seq_length": 64, **UNFUSED}),
    ("ZeRO-2 b1 s64 unfused", 2, {"sharding": "stage2", "per_device_train_batch_size": 1, "max_seq_length": 64,
                                  **UNFUSED}),
    ("ZeRO-3 b1 s64 unfused", 2, {"sharding": "stage3", "per_device_train_batch_size": 1, "max_seq_length": 64,
                                  **UNFUSED}),
    ("ZeRO-2 b1 s64", 2, {"sharding": "stage2", "per_device_train_batch_size": 1, "max_seq_length": 64}),
    ("ZeRO-3 b1 s64", 2, {"sharding": "stage3", "per_device_train_batch_size": 1, "max_seq_length": 64}),
    ("ZeRO-2 b2 unfused", 2, {"sharding": "stage2", **UNFUSED}),
    ("ZeRO-3 b2 unfused", 2, {"sharding": "stage3", **UNFUSED}),
]

_LAYOUT_CHILD = r"""
import json, sys
import numpy as np
from pretrain_cli import runtime
paddle = runtime.import_paddle()
from pretrain_cli.config.parser import parse_config
from pretrain_cli.orchestration.opened import build_model_config
from pretrain_cli.orchestration.targets import launcher_target
from pretrain_cli.config.resolve import resolve
from pretrain_cli.distributed.comms.comm import build_comm
from pretrain_cli.distributed.setup import init_process_group
from pretrain_cli.distributed.layout.topology import Topology
from pretrain_cli.training.run import build_model, lay_out
from pretrain_cli.training.trainer import Trainer
args = parse_config(sys.argv[1], [])
_, cfg = build_model_config(args)
run = resolve(args, cfg, launcher_target())
core = paddle.base.core
base = core.host_memory_stat_current_value("Allocated", 0)
init_process_group(run.parallel, run.loop.seed, run.loop, run.device)  # (a pipeline reads the loop)
comm = build_comm(run.parallel)
trainer = Trainer(lay_out(run, build_model(run, cfg), comm), None, run, comm)
trainer.model.train()
rng = np.random.default_rng(Topology.of(run.parallel).data_rank)
def batches():
    while True:
        t = rng.integers(0, cfg.vocab_size, (run.loop.micro_batch, run.data.max_seq_length + 1))
        yield {"input_ids": t[:, :-1], "labels": t[:, 1:]}
it = batches()
trainer.train_step(it)
core.host_memory_stat_reset_peak_value("Allocated", 0)
trainer.train_step(it)
print("RESULT " + json.dumps({"baseline": base, "peak": core.host_memory_stat_peak_value("Allocated", 0) - base,
                             "stage": Topology.of(run.parallel).stage}), flush=True)
"""


def _fresh_ranks(script: Path, args_path: Path, log_dir: Path, nproc: int):
    """`python -m paddle.distributed.launch --nproc_per_node NPROC SCRIPT ARGS_PATH` in a held block of ports."""
    import os

    env = dict(os.environ, OMP_NUM_THREADS="1")
    # a held block
    ports = [sys.executable, str(Path(__file__).resolve().parents[1] / "scripts" / "job.py"), "ports", "--"]
    cmd = [*ports, sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node", str(nproc), "--log_dir",
           str(log_dir), str(script), str(args_path)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)


def measure_layout(args_path: Path, nproc: int, log_dir: Path, launch=_fresh_ranks) -> dict:
    """{baseline, peak} of the rank with the largest peak. `launch(script, args_path, log_dir, nproc)` runs the
    launcher and returns what ended it (`returncode`, `stderr`): the tests fork the ranks from processes that have
    imported Paddle (tests/distributed/rank_shim.py). What is measured is the same either way: each rank's own
    allocator's peak over the second step, above what it held before building the run."""
    return max(measure_ranks(args_path, nproc, log_dir, launch), key=lambda r: r["peak"])


def measure_ranks(args_path: Path, nproc: int, log_dir: Path, launch=_fresh_ranks) -> list[dict]:
    """Every rank's {baseline, peak, stage} (its pipeline stage: 0 without one), as `measure_layout` measures them."""
    child = log_dir.parent / "layout_child.py"
    child.write_text(_LAYOUT_CHILD)
    out = launch(child, args_path, log_dir, nproc)
    results = [json.loads(line.split("RESULT ", 1)[1]) for f in sorted(log_dir.glob("workerlog.*"))
               for line in f.read_text(errors="replace").splitlines() if line.startswith("RESULT ")]
    if out.returncode or len(results) != nproc:
        logs = "".join(f.read_text(errors="replace")[-1500:] for f in log_dir.glob("workerlog.*"))
        raise RuntimeError(f"layout measurement failed ({out.returncode}): {out.stderr[-1500:]}{logs}")
    return results


def calibrate_layouts(layouts=LAYOUTS, launch=_fresh_ranks, model=LLAMA_52M) -> list[dict]:
    """A row per layout of `model` (overrides of tiny-llama's config: the table's llama-52m, a smaller shape in
    the tests), measured by `measure_layout` over `launch`."""
    from pretrain_cli.orchestration.planned import from_file

    rows = []
    with tempfile.TemporaryDirectory() as d:
        for i, (name, nproc, keys) in enumerate(layouts):
            model_dir, args_path = _write(Path(d), f"layout{i}", "tiny-llama", model, 2, 256, None, {})
            args = json.loads(args_path.read_text())
            args.update(keys, cpu_fused_ops=False, use_flash_attention=False, report_to=["none"])
            args_path.write_text(json.dumps(args))
            m = measure_layout(args_path, nproc, Path(d) / f"log{i}", launch)
            r = from_file(str(args_path), [], device="cpu", gpus=nproc, suggest_changes=False,
                          baseline_bytes=m["baseline"]).to_json()
            pred = r["memory_gib"] * 2**30
            rows.append({"config": name, "params": r["params"]["total"],
                         "micro_batch": args["per_device_train_batch_size"], "seq": args["max_seq_length"],
                         "recompute": "off", "predicted_mib": pred / 2**20, "measured_mib": m["peak"] / 2**20,
                         "error": pred / m["peak"] - 1, "rss_delta_mib": float("nan"),
                         "breakdown_mib": {k: v * 1024 for k, v in r["memory_breakdown_gib"].items()}})
    return rows


# DeepSeek's pipeline x expert parallelism, with and without ZeRO-1 (PaddleNLP's V3 file at its smallest): a widened
# micro-deepseek-v3 of 4 layers, the first dense, 8 routed experts (÷ ep 2 on a rank) and an MTP module whose layer is
# sparse, so stage 0 holds one sparse layer and stage 1 two and the MTP module's
MICRO_V3 = {"hidden_size": 128, "intermediate_size": 512, "moe_intermediate_size": 256, "num_hidden_layers": 4,
            "first_k_dense_replace": 1, "vocab_size": 2048}
STAGE_LAYOUTS = [
    ("pp2 x ep2 DP b2", 4, {"pipeline_parallel_degree": 2, "expert_parallel_degree": 2,
                            "gradient_accumulation_steps": 2}),
    ("pp2 x ep2 x ZeRO-1 b2", 4, {"pipeline_parallel_degree": 2, "expert_parallel_degree": 2, "sharding": "stage1",
                                  "gradient_accumulation_steps": 2}),
]
# the experts 4x as large (16 of width 512: 6 MiB a sparse layer on a rank): what a copy of their weights kept for
# backward would add shows (it did: the plan 15 % under each stage's peak, ops/grouped_gemm_layer.py)
MICRO_V3_LARGE_EXPERTS = {**MICRO_V3, "moe_intermediate_size": 512, "n_routed_experts": 16}
LARGE_EXPERT_LAYOUTS = [("pp2 x ep2 DP b2, experts 4x", *STAGE_LAYOUTS[0][1:])]


def calibrate_stages(layouts=STAGE_LAYOUTS, launch=_fresh_ranks, model=MICRO_V3, preset="micro-deepseek-v3",
                     b: int = 2, s: int = 128) -> list[dict]:
    """A row per pipeline stage of each layout: the stage's largest rank peak (`measure_ranks`) against the plan of
    that stage (`memory.pipeline_stages`, with that rank's baseline), not only the fullest stage's as `plan` prints."""
    from pretrain_cli.config.resolve import resolve
    from pretrain_cli.orchestration.planned import parse
    from pretrain_cli.planning.memory import pipeline_stages, stage_params
    from pretrain_cli.planning.plan import setup_for, target_device
    from pretrain_cli.run_config import Target

    rows = []
    with tempfile.TemporaryDirectory() as d:
        for i, (name, nproc, keys) in enumerate(layouts):
            model_dir, args_path = _write(Path(d), f"stages{i}", preset, model, b, s, None, {})
            args = json.loads(args_path.read_text())
            args.update(keys, cpu_fused_ops=False, use_flash_attention=False, report_to=["none"])
            args_path.write_text(json.dumps(args))
            ranks = measure_ranks(args_path, nproc, Path(d) / f"log{i}", launch)
            parsed, cfg = parse(str(args_path), [])
            run = resolve(parsed, cfg, Target(device="cpu", world_size=nproc, planned=True))
            for stage in sorted({r["stage"] for r in ranks}):
                worst = max((r for r in ranks if r["stage"] == stage), key=lambda r: r["peak"])
                setup = setup_for(run, cfg, target_device("cpu", gpus=nproc), worst["baseline"])
                parts, pred = pipeline_stages(setup)[stage], sum(pipeline_stages(setup)[stage].values())
                rows.append({"config": f"{name} stage {stage}", "params": stage_params(setup, stage), "micro_batch": b,
                             "seq": s,
                             "recompute": "off", "predicted_mib": pred / 2**20, "measured_mib": worst["peak"] / 2**20,
                             "error": pred / worst["peak"] - 1, "rss_delta_mib": float("nan"),
                             "breakdown_mib": {k: v / 2**20 for k, v in parts.items()}})
    return rows


def table(rows: list[dict]) -> str:
    out = ["| config | params | recompute | predicted MiB | measured MiB | error | max-RSS delta MiB |",
           "|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['config']} | {r['params'] / 1e6:.2f}M | {r['recompute']} | {r['predicted_mib']:.1f} | "
                   f"{r['measured_mib']:.1f} | {r['error'] * 100:+.1f}% | {r['rss_delta_mib']:.0f} |")
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--layouts", action="store_true", help="the parallel layouts (2 processes each)")
    ap.add_argument("--stages", action="store_true",
                    help="pipeline x expert parallelism, each stage (4 processes each)")
    ns = ap.parse_args()
    if ns.stages:
        rows = calibrate_stages() + calibrate_stages(LARGE_EXPERT_LAYOUTS, model=MICRO_V3_LARGE_EXPERTS)
    else:
        rows = calibrate_layouts() if ns.layouts else calibrate()
    print(json.dumps(rows, indent=2) if ns.json else table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
