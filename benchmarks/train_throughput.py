"""Training throughput of OUR real step (`Trainer.train_step`) vs HF transformers + PyTorch.

Why a harness: per-op microbenchmarks do not tell whether the product's training step is fast;
this times exactly what `pretrain-cli train` runs (model, AdamW, clipping, loss, the one host
sync) on fixed shapes, next to the same step in PyTorch, in the same run on the same machine.
Each framework runs in its own subprocess, one after the other, so thread pools and MKL/oneDNN
settings never interfere. MFU is against a 2048³ fp32 matmul measured in the worker process.

    python benchmarks/train_throughput.py --config bench|small|all [--compare-hf [--no-compile]]
        [--through-cli [--cli-steps N]] [--json] [--steps N] [--warmup W] [--rounds R] [--to-static]
        [--threads T] [--procs P] [--mkl-cpu-type auto|unset|5|7] [--cpu-ops on|off] [--hf-malloc default|keep]
        [--hf-compile-mode both|max-autotune|default] [--floor] [--profile [--top K]]

Configs live in benchmarks/configs/<name>.json: an HF `config.json` under "model" and flat
argument-file keys under "arguments" (batch, sequence, optimizer, `to_static`). `--compare-hf` times
HF eager and HF under `torch.compile` in its default and its `max-autotune` mode (hf_step.py; HFc and
`ratio_vs_hf_compile` are the faster of the two, each mode is reported too); `--through-cli` runs
`pretrain-cli train` on a token file of the same shape (cli_throughput.py); `--floor` measures the step's lower bound
on this machine (step_floor.py) in the same rounds, and with `--compare-hf` prints `ceiling_vs_hf_compile`, the
furthest ahead of the compiled HF step any step using MKL's GEMMs could be; `--profile` adds where our step's time
goes, op by op (Paddle's profiler, after the timed steps; the first round's). The frameworks alternate `--rounds`
times; tokens_per_s is the median of the per-round median steps, `*_best` the fastest step (the VM is shared and noisy:
compare within one run). `--procs 2` runs 2 data-parallel processes via `paddle.distributed.launch`.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from step_timing import SyntheticDataset, batches, load_config, matmul_peak_gflops, merge, op_profile, summary, timed

CONFIGS = ("bench", "small")


# ------------------------------------------------------------------------------------ workers
def build_our_step(cfg: dict, a):
    """(trainer, batches, model config, run configuration, world): what train.run() builds, fed synthetic batches.
    `a` carries --threads, --mkl-cpu-type, --set, --to-static and --cpu-ops (kernel_ab.py builds its step here too)."""
    from pretrain_cli import runtime

    runtime.setup_env(a.threads)  # "auto": exactly the product's environment (runtime.mkl_cpu_type)
    if a.mkl_cpu_type == "unset":
        os.environ.pop("MKL_DEBUG_CPU_TYPE", None)
    elif a.mkl_cpu_type != "auto":
        os.environ["MKL_DEBUG_CPU_TYPE"] = a.mkl_cpu_type
    runtime.import_paddle()
    from pretrain_cli.config.parser import parse_config
    from pretrain_cli.config.resolve import resolve
    from pretrain_cli.run_config import Target
    from pretrain_cli.distributed.comms.comm import build_comm
    from pretrain_cli.distributed.setup import init_process_group
    from pretrain_cli.models import ModelConfig
    from pretrain_cli.training.run import build_model, lay_out
    from pretrain_cli.training.trainer import Trainer

    world = int(os.environ.get("PADDLE_TRAINERS_NUM", "1"))
    rank = int(os.environ.get("PADDLE_TRAINER_ID", "0"))
    arguments = dict(cfg["arguments"], do_train=True, device="cpu", output_dir="unused", input_dir="unused")
    arguments.update(json.loads(a.set_json or "{}"))  # --set key=value: the layout under test (sharding, tp, ...)
    if a.to_static:
        arguments["to_static"] = True
    if a.cpu_ops == "off":
        arguments["cpu_fused_ops"] = False
    if world > 1:  # same global batch as one process: compare layouts, not batch sizes
        data_ranks = world // max(1, int(arguments.get("tensor_parallel_degree", 1)))
        arguments["per_device_train_batch_size"] = max(1, arguments["per_device_train_batch_size"] // data_ranks)
    overrides = [tok for k, v in arguments.items() for tok in (f"--{k}", json.dumps(v).strip('"'))]
    mcfg = ModelConfig.from_dict(cfg["model"])
    run = resolve(parse_config(None, overrides), mcfg, Target("cpu", world, rank))
    init_process_group(run.parallel, run.loop.seed, run.loop, run.device)  # (a pipeline reads the loop)
    comm = build_comm(run.parallel)
    trainer = Trainer(lay_out(run, build_model(run, mcfg), comm), None, run, comm)
    trainer.model.train()
    data = batches(SyntheticDataset(mcfg.vocab_size, run.data.max_seq_length), run.loop.micro_batch, rank, world)
    return trainer, data, mcfg, run, world


def worker_paddle(cfg: dict, a) -> dict:
    """Build model/optimizer/schedule exactly as train.run() does and time `Trainer.train_step`."""
    from pretrain_cli.models.flops import flops_per_token

    trainer, data, mcfg, run, world = build_our_step(cfg, a)
    import paddle

    peak = matmul_peak_gflops("paddle")
    seq, bs = run.data.max_seq_length, run.loop.micro_batch
    losses, times = timed(lambda: trainer.train_step(data)[0], a.warmup, a.steps)
    out = summary(times, bs * seq * world)
    fpt = flops_per_token(mcfg, seq)
    achieved = out["tokens_per_s"] * fpt / 1e9
    out.update({"framework": "paddle", "paddle": paddle.__version__, "processes": world,
                "threads": int(os.environ["OMP_NUM_THREADS"]),
                "mkl_debug_cpu_type": os.environ.get("MKL_DEBUG_CPU_TYPE", "unset"), "to_static": run.kernels.to_static,
                "kernels": trainer.raw_model.kernels.describe(),
                "flops_per_token": fpt, "achieved_gflops": round(achieved, 1), "matmul_peak_gflops": round(peak, 1),
                "mfu": round(achieved / (peak * world), 4), "losses": [round(x, 6) for x in losses]})
    if a.profile:
        out["profile"] = op_profile(lambda: trainer.train_step(data), a.steps, out["step_s_median"], a.top)
    return out


# ------------------------------------------------------------------------------------ driver
def compile_modes(choice: str) -> tuple[str, ...]:
    """The torch.compile modes a run times: `both` (the default) runs inductor's default mode and `max-autotune`,
    because neither is the stronger everywhere (on the Zen 4 VM, in one run: equal on bench, default mode 4 %
    faster on small; docs/PERFORMANCE.md §1), and the ratio is taken against the faster."""
    return ("default", "max-autotune") if choice == "both" else (choice,)


def _mode_key(mode: str) -> str:
    """`max-autotune` -> `hf_compile_max_autotune`: the prefix of one compile mode's keys in a result row."""
    return f"hf_compile_{mode.replace('-', '_')}"


def _run_worker(kind: str, name: str, a) -> dict:
    """One framework, one config, in a fresh process; returns its JSON result. `kind` is `paddle`, `torch` or
    `torch_compile/<mode>`."""
    kind, _, mode = kind.partition("/")
    warmup = max(a.warmup, 3) if kind == "torch_compile" else a.warmup  # compile: first fwd+bwd, untimed
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", kind, "--config", name,
           "--steps", str(a.steps), "--warmup", str(warmup)]
    cmd += ["--to-static"] if a.to_static else []
    cmd += ["--mkl-cpu-type", a.mkl_cpu_type, "--cpu-ops", a.cpu_ops, "--hf-malloc", a.hf_malloc,
            "--hf-compile-mode", mode or "default"]
    cmd += ["--set-json", a.set_json] if a.set_json else []
    cmd += ["--profile", "--top", str(a.top)] if a.profile and kind == "paddle" else []
    env = dict(os.environ)
    env.pop("OMP_NUM_THREADS", None)
    env.pop("MKL_NUM_THREADS", None)
    with tempfile.TemporaryDirectory() as tmp:
        out_file = Path(tmp) / "result.json"
        cmd += ["--out", str(out_file)]
        if kind == "paddle" and a.procs > 1:
            cores = len(os.sched_getaffinity(0))
            cmd += ["--threads", str(max(1, cores // a.procs))]
            ports = [sys.executable, str(Path(__file__).resolve().parents[1] / "scripts" / "job.py"), "ports", "--"]
            cmd = [*ports, sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node", str(a.procs),
                   "--log_dir", str(Path(tmp) / "log"), "--log_overwrite", "True", *cmd[1:]]
        elif a.threads:
            cmd += ["--threads", str(a.threads)]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=3600)
        if proc.returncode != 0 or not out_file.is_file():
            logs = "".join(p.read_text() for p in (Path(tmp) / "log").glob("workerlog.*")) if a.procs > 1 else ""
            raise SystemExit(f"{kind} worker for {name} failed (rc {proc.returncode}):\n{proc.stderr[-3000:]}"
                             f"{logs[-3000:]}")
        return json.loads(out_file.read_text())


def _row(name: str, cfg: dict, runs: dict) -> dict:
    """One config's line: ours, and where measured HF eager, HF compiled and the `train` run."""
    ar, ours = cfg["arguments"], runs["paddle"]
    row = {"config": name, "batch": ar["per_device_train_batch_size"], "seq_len": ar["max_seq_length"],
           "tokens_per_s": ours["tokens_per_s"], "tokens_per_s_best": ours["tokens_per_s_best"],
           "round_tokens_per_s": ours["round_tokens_per_s"],
           "achieved_gflops": ours["achieved_gflops"], "mfu": ours["mfu"],
           "matmul_peak_gflops": ours["matmul_peak_gflops"], "processes": ours["processes"],
           "threads": ours["threads"], "to_static": ours["to_static"], "step_s_median": ours["step_s_median"],
           "paddle": ours["paddle"], "kernels": ours["kernels"], "mkl_debug_cpu_type": ours["mkl_debug_cpu_type"],
           "losses": ours["losses"], **({"profile": ours["profile"]} if ours.get("profile") else {}),
           "loadavg_1m": round(os.getloadavg()[0], 2)}
    compiled = {kind.partition("/")[2]: r for kind, r in runs.items() if kind.startswith("torch_compile")}
    for mode, hf in compiled.items():
        key = _mode_key(mode)
        row.update({f"{key}_tokens_per_s": hf["tokens_per_s"], f"{key}_round_tokens_per_s": hf["round_tokens_per_s"],
                    f"ratio_vs_{key}": round(ours["tokens_per_s"] / hf["tokens_per_s"], 3)})
    strongest = max(compiled.values(), key=lambda r: r["tokens_per_s"]) if compiled else None
    for key, hf in (("hf", runs.get("torch")), ("hf_compile", strongest)):
        if hf is None:
            continue
        row.update({f"{key}_tokens_per_s": hf["tokens_per_s"], f"{key}_tokens_per_s_best": hf["tokens_per_s_best"],
                    f"{key}_round_tokens_per_s": hf["round_tokens_per_s"], f"{key}_mfu": hf["mfu"],
                    f"{key}_malloc": hf["hf_malloc"], f"{key}_losses": hf["losses"],
                    f"{key}_mode": hf.get("compile_mode"),
                    f"ratio_vs_{key}_best": round(ours["tokens_per_s_best"] / hf["tokens_per_s_best"], 3),
                    f"ratio_vs_{key}": round(ours["tokens_per_s"] / hf["tokens_per_s"], 3),
                    f"round_ratio_vs_{key}": [round(o / h, 3) for o, h in zip(
                        ours["round_tokens_per_s"], hf["round_tokens_per_s"], strict=True)],
                    "hf_matmul_peak_gflops": hf["matmul_peak_gflops"], "hf_attn": hf["attn_implementation"],
                    "torch": hf["torch"], "transformers": hf["transformers"]})
        if "tokens_per_cpu_s" in ours and "tokens_per_cpu_s" in hf:
            row.update({"tokens_per_cpu_s": ours["tokens_per_cpu_s"], f"{key}_tokens_per_cpu_s": hf["tokens_per_cpu_s"],
                        f"ratio_vs_{key}_cpu": round(ours["tokens_per_cpu_s"] / hf["tokens_per_cpu_s"], 3)})
    if "floor" in runs:
        fl = runs["floor"]
        row.update({k: fl[k] for k in ("floor_ms", "gemm_ms", "attention_ms", "adamw_ms", "floor_tokens_per_s",
                                       "round_floor_ms")})
        row["ratio_vs_floor"] = round(ours["tokens_per_s"] / fl["floor_tokens_per_s"], 3)
        # each round's step against the floor measured in the same round, minutes apart: the VM's drift cancels
        # (the merged ratio sets the median step against each term's fastest round, so drift lowers it)
        tokens = fl["floor_tokens_per_s"] * fl["floor_ms"] / 1e3
        row["round_ratio_vs_floor"] = [round(o / (tokens / f * 1e3), 3) for o, f in zip(
            ours["round_tokens_per_s"], fl["round_floor_ms"], strict=True)]
        if "hf_compile_tokens_per_s" in row:
            row["ceiling_vs_hf_compile"] = round(fl["floor_tokens_per_s"] / row["hf_compile_tokens_per_s"], 3)
    if "cli" in runs:
        cli = runs["cli"]
        row.update({"cli_tokens_per_s": cli["tokens_per_s"], "cli_round_tokens_per_s": cli["round_tokens_per_s"],
                    "cli_steps_measured": cli["steps_measured"],
                    "ratio_cli_vs_harness": round(cli["tokens_per_s"] / ours["tokens_per_s"], 3)})
        if "tokens_per_cpu_s" in cli and "tokens_per_cpu_s" in ours:  # the load-robust ratio with --threads 1
            row.update({"cli_tokens_per_cpu_s": cli["tokens_per_cpu_s"],
                        "harness_tokens_per_cpu_s": ours["tokens_per_cpu_s"],
                        "ratio_cli_vs_harness_cpu": round(cli["tokens_per_cpu_s"] / ours["tokens_per_cpu_s"], 3)})
    return row


def _merge_kind(kind: str, results: list[dict]) -> dict:
    """A kind's rounds → one result: the floor takes each term's fastest round (step_floor.merge), the steps their
    median (step_timing.merge)."""
    if kind == "floor":
        import step_floor

        return step_floor.merge(results)
    return merge(results)


def _modes_line(row: dict) -> str:
    """`bench default 3300 tok/s, max-autotune 3261 tok/s`: each compile mode timed, the one used marked."""
    timed = [(m, row[f"{_mode_key(m)}_tokens_per_s"]) for m in compile_modes("both")
             if f"{_mode_key(m)}_tokens_per_s" in row]
    used = row["hf_compile_mode"] if len(timed) > 1 else None
    return f"{row['config']} " + ", ".join(f"{m} {t:.0f} tok/s" + (" (used)" if m == used else "") for m, t in timed)


def _table(rows: list[dict]) -> str:
    head = (f"{'config':7} {'ours tok/s':>10} {'GFLOP/s':>8} {'peak':>6} {'MFU':>6} {'HF tok/s':>9} {'ratio':>6} "
            f"{'HFc tok/s':>9} {'ratio':>6} {'train tok/s':>11} {'train/ours':>10}")
    lines = [head, "-" * len(head)]
    for r in rows:
        cols = []
        for key in ("hf", "hf_compile"):
            cols.append(f"{r[f'{key}_tokens_per_s']:>9.0f} {r[f'ratio_vs_{key}']:>5.2f}x" if f"ratio_vs_{key}" in r
                        else f"{'-':>9} {'-':>6}")
        cols.append(f"{r['cli_tokens_per_s']:>11.0f} {r['ratio_cli_vs_harness']:>9.3f}x" if "cli_tokens_per_s" in r
                    else f"{'-':>11} {'-':>10}")
        lines.append(f"{r['config']:7} {r['tokens_per_s']:>10.0f} {r['achieved_gflops']:>8.1f} "
                     f"{r['matmul_peak_gflops']:>6.0f} {r['mfu']:>6.1%} {' '.join(cols)}")
    r0 = rows[0]
    lines.append(f"ours: {r0['processes']} proc x {r0['threads']} threads, to_static={r0['to_static']}, "
                 f"paddle {r0['paddle']}, {r0['kernels']}")
    if "torch" in r0:
        modes = "; ".join(_modes_line(r) for r in rows if r.get("hf_compile_mode"))
        lines.append(f"HF: transformers {r0['transformers']}, torch {r0['torch']}, attn {r0['hf_attn']}"
                     + (f"; HFc = torch.compile(inductor, fullgraph) + fused AdamW + glibc keep, the faster mode of: "
                        f"{modes}" if modes else " (eager only: --no-compile)"))
    if any("ratio_vs_hf_compile_cpu" in r or "ratio_vs_hf_cpu" in r for r in rows):
        lines.append("per CPU-second (load-robust with --threads 1): " + "; ".join(
            f"{r['config']} vs HF {r.get('ratio_vs_hf_cpu', '-')}x, vs HF compiled "
            f"{r.get('ratio_vs_hf_compile_cpu', '-')}x" for r in rows))
    if any("ratio_cli_vs_harness_cpu" in r for r in rows):
        lines.append("train vs harness per CPU-second (load-robust with --threads 1): " + "; ".join(
            f"{r['config']} {r['cli_tokens_per_cpu_s']:.0f} / {r['harness_tokens_per_cpu_s']:.0f} tok/CPU-s = "
            f"{r['ratio_cli_vs_harness_cpu']:.3f}x" for r in rows if "ratio_cli_vs_harness_cpu" in r))
    if any(len(r.get("round_ratio_vs_hf_compile", [])) > 1 for r in rows):  # how far a run's rounds agree
        lines.append("per round vs HF compiled (frameworks alternated): " + "; ".join(
            f"{r['config']} " + ", ".join(f"{x:.2f}x" for x in r["round_ratio_vs_hf_compile"])
            for r in rows if "round_ratio_vs_hf_compile" in r))
    if any("floor_ms" in r for r in rows):
        lines.append("floor (step_floor.py: MKL's GEMMs + attention's triangle at the peak + AdamW's bytes, the rest "
                     "free): " + "; ".join(
                         f"{r['config']} {r['floor_ms']:.1f} ms = {r['floor_tokens_per_s']:.0f} tok/s "
                         f"(GEMMs {r['gemm_ms']:.1f}, attention {r['attention_ms']:.1f}, AdamW {r['adamw_ms']:.1f}), "
                         f"ours at {r['ratio_vs_floor']:.2f} of it (per round, against the same round's floor: "
                         + ", ".join(f"{x:.2f}" for x in r["round_ratio_vs_floor"]) + ")"
                         + (f", ceiling vs HF compiled {r['ceiling_vs_hf_compile']:.2f}x"
                            if "ceiling_vs_hf_compile" in r else "") for r in rows if "floor_ms" in r))
    lines.append("median of per-round median steps; load avg (1m) at the end: "
                 + ", ".join(str(r["loadavg_1m"]) for r in rows))
    lines.append("targets: ratio >= 1.25x vs HF compiled on both configs; train within 5% of the harness step")
    lines += [f"\nwhere our {r['config']} step goes (own time per event, first round):\n{r['profile']}"
              for r in rows if r.get("profile")]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default="all", help="bench | small | all | path/to/config.json")
    ap.add_argument("--compare-hf", action="store_true", help="also time HF transformers + PyTorch, eager and compiled")
    ap.add_argument("--no-compile", action="store_true", help="with --compare-hf: skip the torch.compile worker")
    ap.add_argument("--through-cli", action="store_true",
                    help="also run the real `pretrain-cli train` on a token file and read tokens/s from metrics.jsonl")
    ap.add_argument("--floor", action="store_true",
                    help="also measure the step's lower bound on this machine (step_floor.py, at the product's MKL "
                         "path whatever --mkl-cpu-type says) in every round")
    ap.add_argument("--profile", action="store_true",
                    help="also profile our step op by op (Paddle's profiler, --steps more steps after the timed ones)")
    ap.add_argument("--top", type=int, default=30, help="--profile: events listed")
    ap.add_argument("--cli-steps", type=int, default=30, help="--through-cli: max_steps of the train run")
    ap.add_argument("--json", action="store_true", help="one JSON object per config")
    ap.add_argument("--steps", type=int, default=8, help="timed steps (after warm-up)")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps (the compiled HF worker: at least 3)")
    ap.add_argument("--rounds", type=int, default=1, help="alternate the frameworks this many times")
    ap.add_argument("--to-static", action="store_true",
                    help="compile the forward with compiled_forward.compile_forward (SOT) even if the config says no")
    ap.add_argument("--threads", type=int, default=None,
                    help="threads per process (default cores/procs); with --through-cli the `train` run's too")
    ap.add_argument("--procs", type=int, default=1, help="data-parallel processes for OUR step")
    ap.add_argument("--mkl-cpu-type", default="auto",
                    help="MKL_DEBUG_CPU_TYPE for our worker: auto (runtime.mkl_cpu_type: AMD 7 with AVX-512, else 5; "
                         "Intel unset), unset, or a value")
    ap.add_argument("--cpu-ops", choices=("on", "off"), default="on",
                    help="our fused CPU kernels (src/pretrain_cli/ops/csrc); off = Paddle's ops only "
                         "(cpu_fused_ops: false)")
    ap.add_argument("--hf-compile-mode", choices=("both", "max-autotune", "default"), default="both",
                    help="torch.compile mode of the compiled HF worker: both (each round times inductor's default mode "
                         "and max-autotune, where inductor also tries its own C++ GEMM templates; the ratio is "
                         "against the faster), or one of them")
    ap.add_argument("--hf-malloc", choices=("default", "keep"), default="default",
                    help="keep: give the eager HF worker the same glibc no-mmap/no-trim setting as ours "
                         "(the compiled worker always has it)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="argument-file key for OUR run, e.g. --set sharding=stage2 --set tensor_parallel_degree=2")
    ap.add_argument("--set-json", help=argparse.SUPPRESS)
    ap.add_argument("--worker", choices=("paddle", "torch", "torch_compile"), help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.set and not a.set_json:
        a.set_json = json.dumps({k: json.loads(v) if v[:1] in "-0123456789tfn[{\"" else v
                                 for k, v in (item.split("=", 1) for item in a.set)})
    if a.worker:
        cfg = load_config(a.config)
        if a.worker == "paddle":
            result = worker_paddle(cfg, a)
        else:
            from hf_step import worker_torch

            result = worker_torch(cfg, a, compiled=a.worker == "torch_compile")
        if int(os.environ.get("PADDLE_TRAINER_ID", "0")) == 0 and a.out:
            Path(a.out).write_text(json.dumps(result))
        return 0
    compiled = [] if a.no_compile else [f"torch_compile/{m}" for m in compile_modes(a.hf_compile_mode)]
    kinds = ["paddle"] + (["torch"] + compiled if a.compare_hf else [])
    kinds += ["cli"] if a.through_cli else []
    kinds += ["floor"] if a.floor else []
    rows = []
    for name in (CONFIGS if a.config == "all" else (a.config,)):
        results: dict[str, list] = {k: [] for k in kinds}
        for _ in range(a.rounds):  # alternate frameworks so all see the same background load
            for kind in kinds:
                if kind == "cli":
                    from cli_throughput import run_train

                    results[kind].append(run_train(load_config(name), a))
                elif kind == "floor":
                    import step_floor

                    results[kind].append(step_floor.run_worker(name, a.threads))
                else:
                    results[kind].append(_run_worker(kind, name, a))
        row = _row(name, load_config(name), {k: _merge_kind(k, v) for k, v in results.items()})
        rows.append(row)
        if a.json:
            print(json.dumps(row), flush=True)
    if not a.json:
        print(_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
