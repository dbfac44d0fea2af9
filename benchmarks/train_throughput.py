"""Training throughput of OUR real step (`Trainer.train_step`) vs HF transformers + PyTorch.

Why a harness: per-op microbenchmarks do not tell whether the product's training step is fast;
this times exactly what `pretrain-cli train` runs (model, AdamW, clipping, loss, the one host
sync) on fixed shapes, next to the same step in PyTorch, in the same run on the same machine.
Each framework runs in its own subprocess, one after the other, so thread pools and MKL/oneDNN
settings never interfere. MFU is against a 2048³ fp32 matmul measured in the worker process.

    python benchmarks/train_throughput.py --config bench|small|all [--compare-hf] [--json] [--steps N]
        [--warmup W] [--rounds R] [--to-static] [--threads T] [--procs P] [--mkl-cpu-type auto|unset|5]
        [--cpu-ops on|off] [--hf-malloc default|keep]

Configs live in benchmarks/configs/<name>.json: an HF `config.json` under "model" and flat
argument-file keys under "arguments" (batch, sequence, optimizer, `to_static`). tokens_per_s is the
median step; `*_best` the fastest step (the VM is shared and noisy: compare within one run).
`--procs 2` runs 2 data-parallel processes × (cores/2) threads via `paddle.distributed.launch`.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
CONFIGS = ("bench", "small")


def load_config(name: str) -> dict:
    path = Path(name) if name.endswith(".json") else HERE / "configs" / f"{name}.json"
    return json.loads(path.read_text(encoding="utf-8"))


def matmul_peak_gflops(backend: str, n: int = 2048, reps: int = 5) -> float:
    """Best-of-`reps` n³ fp32 matmul in this process (same threads/MKL settings as training)."""
    if backend == "paddle":
        import paddle

        a, b = paddle.randn([n, n]), paddle.randn([n, n])
        mm, sync = paddle.matmul, (lambda t: t.numpy())
    else:
        import torch

        a, b = torch.randn(n, n), torch.randn(n, n)
        mm, sync = torch.matmul, (lambda t: t.sum().item())
    sync(mm(a, b))  # warm-up: MKL reads its environment at the first call
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        sync(mm(a, b))
        best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best / 1e9


class SyntheticDataset:
    """Sample i is a pure function of (seed, i): random tokens, labels = next token (pre-shifted)."""

    def __init__(self, vocab: int, seq_len: int, seed: int = 0):
        self.vocab, self.seq_len, self.seed = vocab, seq_len, seed

    def __len__(self) -> int:
        return 1 << 30

    def __getitem__(self, i: int) -> dict:
        import numpy as np

        toks = np.random.default_rng((self.seed, i)).integers(0, self.vocab, self.seq_len + 1, dtype=np.int64)
        return {"input_ids": toks[:-1], "labels": toks[1:]}


def _batches(ds, bs: int, rank: int = 0, world: int = 1):
    """Global micro-batch k holds samples [k·bs·world, …); this rank takes its contiguous slice."""
    import numpy as np

    k = 0
    while True:
        start = (k * world + rank) * bs
        items = [ds[start + j] for j in range(bs)]
        yield {key: np.stack([it[key] for it in items]) for key in ("input_ids", "labels")}  # [bs, seq_len]
        k += 1


def _timed(step, warmup: int, steps: int) -> tuple[list[float], list[float]]:
    losses, times = [], []
    for i in range(warmup + steps):
        t0 = time.perf_counter()
        losses.append(step())
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    return losses, times


def _summary(times: list[float], tokens_per_step: int) -> dict:
    """Median step → tokens_per_s; the fastest step too (least disturbed by other load on the VM)."""
    s = sorted(times)
    med = s[len(s) // 2]
    return {"step_s_median": round(med, 4), "tokens_per_s": round(tokens_per_step / med, 1),
            "tokens_per_s_best": round(tokens_per_step / s[0], 1), "step_times": [round(x, 4) for x in times],
            "tokens_per_step": tokens_per_step}


def _merge(results: list[dict]) -> dict:
    """Several rounds of one framework → one result over all their timed steps (peak: the best)."""
    out = dict(results[0])
    times = [t for r in results for t in r["step_times"]]
    out.update(_summary(times, out["tokens_per_step"]))
    out["matmul_peak_gflops"] = max(r["matmul_peak_gflops"] for r in results)
    out["achieved_gflops"] = round(out["tokens_per_s"] * out["flops_per_token"] / 1e9, 1)
    out["mfu"] = round(out["achieved_gflops"] / (out["matmul_peak_gflops"] * out.get("processes", 1)), 4)
    return out


# ------------------------------------------------------------------------------------ workers
def worker_paddle(cfg: dict, a) -> dict:
    """Build model/optimizer/schedule exactly as train.run() does and time `Trainer.train_step`."""
    from pretrain_cli import runtime

    runtime.setup_env(a.threads)  # "auto": exactly the product's environment (type 5 on AMD only)
    if a.mkl_cpu_type == "unset":
        os.environ.pop("MKL_DEBUG_CPU_TYPE", None)
    elif a.mkl_cpu_type != "auto":
        os.environ["MKL_DEBUG_CPU_TYPE"] = a.mkl_cpu_type
    paddle = runtime.import_paddle()
    from pretrain_cli.config.parser import parse_config
    from pretrain_cli.config.resolve import resolve
    from pretrain_cli.config.run_config import Target
    from pretrain_cli.distributed.comm import build_comm
    from pretrain_cli.distributed.setup import init_process_group
    from pretrain_cli.models import ModelConfig
    from pretrain_cli.models.flops import flops_per_token
    from pretrain_cli.training.run import assemble, build_model

    world = int(os.environ.get("PADDLE_TRAINERS_NUM", "1"))
    rank = int(os.environ.get("PADDLE_TRAINER_ID", "0"))
    peak = matmul_peak_gflops("paddle")
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
    seq, bs = run.data.max_seq_length, run.loop.micro_batch
    init_process_group(run.parallel)
    trainer = assemble(run, build_model(run, mcfg), build_comm(run.parallel))
    model = trainer.model
    model.train()
    batches = _batches(SyntheticDataset(mcfg.vocab_size, seq), bs, rank, world)
    losses, times = _timed(lambda: trainer.train_step(batches)[0], a.warmup, a.steps)
    out = _summary(times, bs * seq * world)
    fpt = flops_per_token(mcfg, seq)
    achieved = out["tokens_per_s"] * fpt / 1e9
    out.update({"framework": "paddle", "paddle": paddle.__version__, "processes": world,
                "threads": int(os.environ["OMP_NUM_THREADS"]),
                "mkl_debug_cpu_type": os.environ.get("MKL_DEBUG_CPU_TYPE", "unset"), "to_static": run.kernels.to_static,
                "kernels": trainer.raw_model.kernels.describe(),
                "flops_per_token": fpt, "achieved_gflops": round(achieved, 1), "matmul_peak_gflops": round(peak, 1),
                "mfu": round(achieved / (peak * world), 4), "losses": [round(x, 6) for x in losses]})
    return out


def worker_torch(cfg: dict, a) -> dict:
    """The same step in HF transformers + PyTorch: LlamaForCausalLM, AdamW, clip 1.0, fp32."""
    import torch
    import torch.nn.functional as F
    import transformers

    threads = a.threads or (len(os.sched_getaffinity(0)))
    torch.set_num_threads(threads)
    if a.hf_malloc == "keep":  # the same glibc setting our runtime applies, to show what it is worth to torch
        from pretrain_cli import runtime

        runtime.keep_freed_memory()
    peak = matmul_peak_gflops("torch")
    from pretrain_cli.models import ModelConfig
    from pretrain_cli.models.flops import flops_per_token

    ar, mcfg = cfg["arguments"], ModelConfig.from_dict(cfg["model"])
    seq, bs = ar["max_seq_length"], ar["per_device_train_batch_size"]
    torch.manual_seed(ar.get("seed", 0))
    hf_cfg = transformers.LlamaConfig(**{k: v for k, v in cfg["model"].items() if k != "architectures"})
    model = transformers.LlamaForCausalLM(hf_cfg).train()
    opt = torch.optim.AdamW(model.parameters(), lr=ar["learning_rate"], betas=(ar["adam_beta1"], ar["adam_beta2"]),
                            eps=ar["adam_epsilon"], weight_decay=ar["weight_decay"])
    batches = _batches(SyntheticDataset(mcfg.vocab_size, seq), bs)

    def step() -> float:
        b = next(batches)
        ids, labels = torch.from_numpy(b["input_ids"]), torch.from_numpy(b["labels"])
        logits = model(input_ids=ids).logits  # [bs, seq_len, vocab]
        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), labels.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), ar["max_grad_norm"])
        opt.step()
        opt.zero_grad(set_to_none=True)
        return float(loss)

    losses, times = _timed(step, a.warmup, a.steps)
    out = _summary(times, bs * seq)
    fpt = flops_per_token(mcfg, seq)
    achieved = out["tokens_per_s"] * fpt / 1e9
    out.update({"framework": "torch", "torch": torch.__version__, "transformers": transformers.__version__,
                "threads": threads, "attn_implementation": model.config._attn_implementation, "hf_malloc": a.hf_malloc,
                "flops_per_token": fpt,
                "achieved_gflops": round(achieved, 1), "matmul_peak_gflops": round(peak, 1),
                "mfu": round(achieved / peak, 4), "losses": [round(x, 6) for x in losses]})
    return out


# ------------------------------------------------------------------------------------ driver
def _run_worker(kind: str, name: str, a) -> dict:
    """One framework, one config, in a fresh process; returns its JSON result."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", kind, "--config", name,
           "--steps", str(a.steps), "--warmup", str(a.warmup)]
    cmd += ["--to-static"] if a.to_static else []
    cmd += ["--mkl-cpu-type", a.mkl_cpu_type, "--cpu-ops", a.cpu_ops, "--hf-malloc", a.hf_malloc]
    cmd += ["--set-json", a.set_json] if a.set_json else []
    env = dict(os.environ)
    env.pop("OMP_NUM_THREADS", None)
    env.pop("MKL_NUM_THREADS", None)
    with tempfile.TemporaryDirectory() as tmp:
        out_file = Path(tmp) / "result.json"
        cmd += ["--out", str(out_file)]
        if kind == "paddle" and a.procs > 1:
            cores = len(os.sched_getaffinity(0))
            cmd += ["--threads", str(max(1, cores // a.procs))]
            cmd = [sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node", str(a.procs),
                   "--log_dir", str(Path(tmp) / "log"), "--log_overwrite", "True", *cmd[1:]]
        elif a.threads:
            cmd += ["--threads", str(a.threads)]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=3600)
        if proc.returncode != 0 or not out_file.is_file():
            logs = "".join(p.read_text() for p in (Path(tmp) / "log").glob("workerlog.*")) if a.procs > 1 else ""
            raise SystemExit(f"{kind} worker for {name} failed (rc {proc.returncode}):\n{proc.stderr[-3000:]}{logs[-3000:]}")
        return json.loads(out_file.read_text())


def _row(name: str, cfg: dict, ours: dict, hf: dict | None) -> dict:
    ar = cfg["arguments"]
    row = {"config": name, "batch": ar["per_device_train_batch_size"], "seq_len": ar["max_seq_length"],
           "tokens_per_s": ours["tokens_per_s"], "tokens_per_s_best": ours["tokens_per_s_best"],
           "achieved_gflops": ours["achieved_gflops"], "mfu": ours["mfu"],
           "matmul_peak_gflops": ours["matmul_peak_gflops"], "processes": ours["processes"],
           "threads": ours["threads"], "to_static": ours["to_static"], "step_s_median": ours["step_s_median"],
           "paddle": ours["paddle"], "kernels": ours["kernels"], "losses": ours["losses"],
           "loadavg_1m": round(os.getloadavg()[0], 2)}
    if hf is not None:
        row.update({"hf_tokens_per_s": hf["tokens_per_s"], "hf_tokens_per_s_best": hf["tokens_per_s_best"],
                    "hf_mfu": hf["mfu"], "ratio_vs_hf_best": round(ours["tokens_per_s_best"] / hf["tokens_per_s_best"], 3),
                    "hf_matmul_peak_gflops": hf["matmul_peak_gflops"], "hf_attn": hf["attn_implementation"],
                    "torch": hf["torch"], "transformers": hf["transformers"],
                    "ratio_vs_hf": round(ours["tokens_per_s"] / hf["tokens_per_s"], 3)})
    return row


def _table(rows: list[dict]) -> str:
    head = f"{'config':7} {'ours tok/s':>10} {'GFLOP/s':>8} {'peak':>6} {'MFU':>6} {'HF tok/s':>9} {'HF MFU':>7} {'ratio':>6}"
    lines = [head, "-" * len(head)]
    for r in rows:
        hf = (f"{r['hf_tokens_per_s']:>9.0f} {r['hf_mfu']:>7.1%} {r['ratio_vs_hf']:>5.2f}x"
              if "hf_tokens_per_s" in r else f"{'-':>9} {'-':>7} {'-':>6}")
        lines.append(f"{r['config']:7} {r['tokens_per_s']:>10.0f} {r['achieved_gflops']:>8.1f} "
                     f"{r['matmul_peak_gflops']:>6.0f} {r['mfu']:>6.1%} {hf}")
    r0 = rows[0]
    lines.append(f"ours: {r0['processes']} proc x {r0['threads']} threads, to_static={r0['to_static']}, "
                 f"paddle {r0['paddle']}, {r0['kernels']}")
    if "torch" in r0:
        lines.append(f"HF: transformers {r0['transformers']}, torch {r0['torch']}, attn {r0['hf_attn']}")
    lines.append(f"median step; best-step ratio: {', '.join(str(r.get('ratio_vs_hf_best', '-')) for r in rows)}")
    lines.append("targets: ratio >= 1.25x on both configs; MFU >= 55% on small")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default="all", help="bench | small | all | path/to/config.json")
    ap.add_argument("--compare-hf", action="store_true", help="also time HF transformers + PyTorch")
    ap.add_argument("--json", action="store_true", help="one JSON object per config")
    ap.add_argument("--steps", type=int, default=8, help="timed steps (after warm-up)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=1, help="alternate ours/HF this many times; steps pooled")
    ap.add_argument("--to-static", action="store_true",
                    help="compile the forward with kernels.compile_forward (SOT) even if the config says no")
    ap.add_argument("--threads", type=int, default=None, help="threads per process (default cores/procs)")
    ap.add_argument("--procs", type=int, default=1, help="data-parallel processes for OUR step")
    ap.add_argument("--mkl-cpu-type", default="auto",
                    help="MKL_DEBUG_CPU_TYPE for our worker: auto (5 on AMD only), unset, or a value")
    ap.add_argument("--cpu-ops", choices=("on", "off"), default="on",
                    help="our fused CPU kernels (src/pretrain_cli/csrc); off = Paddle's ops only (cpu_fused_ops: false)")
    ap.add_argument("--hf-malloc", choices=("default", "keep"), default="default",
                    help="keep: give the HF/torch worker the same glibc no-mmap/no-trim setting as ours")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="argument-file key for OUR run, e.g. --set sharding=stage2 --set tensor_parallel_degree=2")
    ap.add_argument("--set-json", help=argparse.SUPPRESS)
    ap.add_argument("--worker", choices=("paddle", "torch"), help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.set and not a.set_json:
        a.set_json = json.dumps({k: json.loads(v) if v[:1] in "-0123456789tfn[{\"" else v
                                 for k, v in (item.split("=", 1) for item in a.set)})
    if a.worker:
        result = (worker_paddle if a.worker == "paddle" else worker_torch)(load_config(a.config), a)
        if int(os.environ.get("PADDLE_TRAINER_ID", "0")) == 0 and a.out:
            Path(a.out).write_text(json.dumps(result))
        return 0
    names = CONFIGS if a.config == "all" else (a.config,)
    rows = []
    for name in names:
        ours_runs, hf_runs = [], []
        for _ in range(a.rounds):  # alternate frameworks so both see the same background load
            ours_runs.append(_run_worker("paddle", name, a))
            if a.compare_hf:
                hf_runs.append(_run_worker("torch", name, a))
        ours, hf = _merge(ours_runs), (_merge(hf_runs) if hf_runs else None)
        row = _row(name, load_config(name), ours, hf)
        rows.append(row)
        if a.json:
            print(json.dumps(row), flush=True)
    if not a.json:
        print(_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
