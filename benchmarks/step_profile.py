"""Where our training step's time goes, op by op (Paddle's profiler over `Trainer.train_step`).

Why: the throughput harness says how fast a step is; this says what to work on next. It builds the
step exactly like `train_throughput.py`'s worker (the product's own resolve + assemble), runs warm-up
steps, then profiles a few steps on the CPU and prints the ops sorted by their share of the step.

    python benchmarks/step_profile.py --config bench|small [--steps 3] [--warmup 2] [--top 30] [--set-json '{...}']
"""
from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict

from step_timing import SyntheticDataset, batches
from train_throughput import load_config


def build(cfg: dict, set_json: str | None):
    """(trainer, data iterator, tokens per step) through the product's own build order."""
    from pretrain_cli import runtime

    runtime.setup_env(None)
    runtime.import_paddle()
    from pretrain_cli.config.parser import parse_config
    from pretrain_cli.config.resolve import resolve
    from pretrain_cli.config.run_config import Target
    from pretrain_cli.distributed.comm import build_comm
    from pretrain_cli.models import ModelConfig
    from pretrain_cli.training.run import assemble, build_model

    arguments = dict(cfg["arguments"], do_train=True, device="cpu", output_dir="unused", input_dir="unused")
    arguments.update(json.loads(set_json or "{}"))
    overrides = [tok for k, v in arguments.items() for tok in (f"--{k}", json.dumps(v).strip('"'))]
    mcfg = ModelConfig.from_dict(cfg["model"])
    run = resolve(parse_config(None, overrides), mcfg, Target("cpu", 1, 0))
    seq, bs = run.data.max_seq_length, run.loop.micro_batch
    trainer = assemble(run, build_model(run, mcfg), build_comm(run.parallel))
    trainer.model.train()
    return trainer, batches(SyntheticDataset(mcfg.vocab_size, seq), bs), bs * seq


def op_table(prof, steps: int, step_s: float, top: int) -> str:
    """Every profiler event's own time (its span minus its children's), summed by name over the profiled
    steps. Our C++ ops and the fused head + loss have no event of their own: their time is the own time of
    the layer that calls them ("Forward CausalLM" = the head + loss, "Forward CoreAttention" = attention)."""
    own: dict[tuple, float] = defaultdict(float)
    stack = [node for root in prof.profiler_result.get_data().values() for node in root.children_node
             if node.name.startswith("ProfileStep")]
    profiled = sum(node.end_ns - node.start_ns for node in stack) / 1e9
    while stack:
        node = stack.pop()
        children = sum(c.end_ns - c.start_ns for c in node.children_node)
        own[(str(node.type).rsplit(".", 1)[-1], node.name)] += (node.end_ns - node.start_ns - children) / 1e9
        stack.extend(node.children_node)
    lines = [f"step {step_s * 1e3:.1f} ms unprofiled, {profiled / steps * 1e3:.1f} ms profiled",
             f"{'event':12} {'name':52} {'ms/step':>8} {'share':>6}"]
    for (kind, name), t in sorted(own.items(), key=lambda kv: -kv[1])[:top]:
        lines.append(f"{kind[:12]:12} {name[:52]:52} {t / steps * 1e3:>8.2f} {t / profiled:>6.1%}")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default="bench")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--set-json", default=None, help="argument keys to override, e.g. '{\"cpu_fused_ops\": false}'")
    a = ap.parse_args(argv)
    trainer, data, tokens = build(load_config(a.config), a.set_json)
    for _ in range(a.warmup):
        trainer.train_step(data)
    import paddle.profiler as profiler

    t0 = time.perf_counter()
    plain = [trainer.train_step(data) for _ in range(a.steps)]
    step_s = (time.perf_counter() - t0) / a.steps  # unprofiled: the profiler adds its own overhead
    del plain
    prof = profiler.Profiler(targets=[profiler.ProfilerTarget.CPU], on_trace_ready=lambda _prof: None)
    prof.start()
    for _ in range(a.steps):
        trainer.train_step(data)
        prof.step()
    prof.stop()
    print(f"{a.config}: {tokens} tokens per step, {tokens / step_s:.0f} tok/s unprofiled")
    print(op_table(prof, a.steps, step_s, a.top))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
