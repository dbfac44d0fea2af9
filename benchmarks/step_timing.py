"""What every training-step benchmark worker shares: the configs, synthetic data, the timing loop and its summary.

Kept apart from `train_throughput.py` so the PyTorch workers (`hf_step.py`) and the `train` run
(`cli_throughput.py`) time, feed and summarise their steps exactly the same way.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

CONFIG_DIR = Path(__file__).resolve().parent / "configs"


def load_config(name: str) -> dict:
    """A benchmark config by name (`benchmarks/configs/<name>.json`) or by path (`*.json`)."""
    path = Path(name) if name.endswith(".json") else CONFIG_DIR / f"{name}.json"
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


def batches(ds, bs: int, rank: int = 0, world: int = 1):
    """Global micro-batch k holds samples [k·bs·world, …); this rank takes its contiguous slice."""
    import numpy as np

    k = 0
    while True:
        start = (k * world + rank) * bs
        items = [ds[start + j] for j in range(bs)]
        yield {key: np.stack([it[key] for it in items]) for key in ("input_ids", "labels")}  # [bs, seq_len]
        k += 1


CPU_TIMES: list[float] = []  # process CPU seconds of each timed step of the last `timed` call


def timed(step, warmup: int, steps: int) -> tuple[list[float], list[float]]:
    """Run `warmup + steps` steps; only the last `steps` are timed (compilation happens in warm-up).

    Also records each timed step's process CPU time (`CPU_TIMES`): with one thread per worker it is the
    work done whatever else runs on the machine, where wall time is not (see `summary`)."""
    losses, times = [], []
    CPU_TIMES.clear()
    for i in range(warmup + steps):
        t0, c0 = time.perf_counter(), time.process_time()
        losses.append(step())
        if i >= warmup:
            times.append(time.perf_counter() - t0)
            CPU_TIMES.append(time.process_time() - c0)
    return losses, times


def median(xs: list[float]) -> float:
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def summary(times: list[float], tokens_per_step: int) -> dict:
    """Median step → tokens_per_s; the fastest step too (least disturbed by other load on the VM)."""
    med = median(times)
    out = {"step_s_median": round(med, 4), "tokens_per_s": round(tokens_per_step / med, 1),
           "tokens_per_s_best": round(tokens_per_step / min(times), 1), "step_times": [round(x, 4) for x in times],
           "tokens_per_step": tokens_per_step}
    if len(CPU_TIMES) == len(times):  # tokens per CPU-second: the load-robust figure with --threads 1
        out["cpu_s_median"] = round(median(CPU_TIMES), 4)
        out["tokens_per_cpu_s"] = round(tokens_per_step / out["cpu_s_median"], 1)
    return out


def merge(results: list[dict]) -> dict:
    """Several alternated rounds of one framework → the median of the per-round median steps (so one
    disturbed round cannot move the result), the best step over all rounds, the best matmul peak."""
    out = dict(results[0])
    med = median([r["step_s_median"] for r in results])
    tps = out["tokens_per_step"]
    out.update({"step_s_median": round(med, 4), "tokens_per_s": round(tps / med, 1),
                "tokens_per_s_best": round(tps / min(t for r in results for t in r["step_times"]), 1),
                "round_tokens_per_s": [r["tokens_per_s"] for r in results],
                **({"tokens_per_cpu_s": round(tps / median([r["cpu_s_median"] for r in results]), 1)}
                   if all("cpu_s_median" in r for r in results) else {}),
                "step_times": [t for r in results for t in r["step_times"]]})
    out["matmul_peak_gflops"] = max(r["matmul_peak_gflops"] for r in results)
    if out["matmul_peak_gflops"]:  # the `train` run reports its own MFU in metrics.jsonl, not here
        out["achieved_gflops"] = round(out["tokens_per_s"] * out["flops_per_token"] / 1e9, 1)
        out["mfu"] = round(out["achieved_gflops"] / (out["matmul_peak_gflops"] * out.get("processes", 1)), 4)
    return out


def own_times(step, steps: int) -> tuple[dict, float]:
    """`steps` more steps under Paddle's profiler → ({(event type, name): own seconds per step}, profiled seconds
    per step). An event's own time is its span minus its children's. Our C++ ops and the fused head + loss have no
    event of their own: their time is the own time of the layer that calls them ("Forward CausalLM" = the head +
    loss, "Forward CoreAttention" = attention); `step_regions.py` groups these events by region."""
    from collections import defaultdict

    import paddle.profiler as profiler

    prof = profiler.Profiler(targets=[profiler.ProfilerTarget.CPU], on_trace_ready=lambda _prof: None)
    prof.start()
    for _ in range(steps):
        step()
        prof.step()
    prof.stop()
    own: dict[tuple, float] = defaultdict(float)
    stack = [node for root in prof.profiler_result.get_data().values() for node in root.children_node
             if node.name.startswith("ProfileStep")]
    profiled = sum(node.end_ns - node.start_ns for node in stack) / 1e9
    while stack:
        node = stack.pop()
        children = sum(c.end_ns - c.start_ns for c in node.children_node)
        own[(str(node.type).rsplit(".", 1)[-1], node.name)] += (node.end_ns - node.start_ns - children) / 1e9
        stack.extend(node.children_node)
    return {key: t / steps for key, t in own.items()}, profiled / steps


def op_profile(step, steps: int, step_s: float, top: int) -> str:
    """The `top` events of `own_times` as a table; `step_s` is the unprofiled step (the profiler adds its own
    overhead)."""
    own, profiled = own_times(step, steps)
    lines = [f"step {step_s * 1e3:.1f} ms unprofiled, {profiled * 1e3:.1f} ms profiled",
             f"{'event':12} {'name':52} {'ms/step':>8} {'share':>6}"]
    for (kind, name), t in sorted(own.items(), key=lambda kv: -kv[1])[:top]:
        lines.append(f"{kind[:12]:12} {name[:52]:52} {t * 1e3:>8.2f} {t / profiled:>6.1%}")
    return "\n".join(lines)
