"""One Mixture-of-Experts training step on CPU: ours against HF transformers + PyTorch, eager and compiled.

The shape is benchmarks/configs/moe.json (a small Qwen3-MoE: 16 experts, top-4, 4 sparse layers, batch 4 x 256
tokens). The timing is `train_throughput.py`'s harness as it is for the dense model: our real step
(`Trainer.train_step`: the grouped expert computation `ops.kernels` chose, AdamW, clipping) and HF's
`Qwen3MoeForCausalLM` step (eager, and under `torch.compile` in its default and max-autotune modes), each
framework in its own subprocess, alternated `--rounds` times in one run, reported as ratios (`ratio_vs_hf`,
`ratio_vs_hf_compile`). Tokens/s count the whole batch; MFU is on the active parameters' FLOPs.

    python benchmarks/moe_step.py [--steps N] [--warmup W] [--rounds R] [--no-compile] [--json] [...]

Any other `train_throughput.py` flag passes through.
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from train_throughput import main  # noqa: E402  (the benchmarks directory is not a package)


def moe_argv(argv: list[str]) -> list[str]:
    """`train_throughput.py`'s arguments for the MoE shape: its config, HF compared (unless given otherwise)."""
    out = ["--config", "moe"] if "--config" not in argv else []
    return out + (["--compare-hf"] if "--compare-hf" not in argv else []) + list(argv)


if __name__ == "__main__":
    sys.exit(main(moe_argv(sys.argv[1:])))
