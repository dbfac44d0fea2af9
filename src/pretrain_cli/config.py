"""Internal configuration groups derived from the flat user arguments.

The user file is flat (PaddleNLP keys); inside, kernel and parallel choices are regrouped
here so they never leak into the model's architecture config (`models.config.ModelConfig`),
unlike PaddleNLP's `LlmMetaConfig`, which copies 19 such flags onto the model config.
No Paddle import: `check` and `plan` use this module without paying for one.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class KernelConfig:
    """Kernels the user *asked for*; `kernels.select()` decides what actually runs."""

    attention: str = "sdpa"  # "flash" | "sdpa" | "math"
    rms_norm: str = "reference"  # "fused" | "reference"
    rope: str = "reference"  # "fused" | "reference"
    swiglu: str = "reference"  # "fused" | "reference"
    cpu_ops: bool = True  # on CPU: pretrain-cli's own fused kernels (csrc/) when they build


@dataclass(frozen=True)
class ParallelConfig:
    """Degrees and this process's ranks (PaddleNLP arithmetic, REFERENCE §7.3)."""

    world_size: int = 1
    rank: int = 0
    local_rank: int = 0
    data_rank: int = 0  # which slice of each global batch this process reads
    dp_degree: int = 1
    sharding_degree: int = 1
    sharding_stage: int = 0  # 0 = off, 1, 2, 3
    tp_degree: int = 1
    pp_degree: int = 1

    @property
    def data_world_size(self) -> int:
        """Ranks that read different data: dp × sharding (TP/PP ranks share batches)."""
        return self.dp_degree * self.sharding_degree


def derive_kernels(training, device: str = "cpu") -> KernelConfig:
    """Kernel requests from the PaddleNLP `use_*` booleans (never copied onto the model config)."""
    return KernelConfig(
        attention="flash" if training.use_flash_attention else "sdpa",
        rms_norm="fused" if training.use_fused_rms_norm else "reference",
        rope="fused" if training.use_fused_rope else "reference",
        swiglu="fused" if device == "gpu" else "reference",
        cpu_ops=training.cpu_fused_ops,
    )


def derive_parallel(resolved, training, rank: int = 0, local_rank: int = 0, supported_only: bool = True) -> ParallelConfig:
    """Degrees from the resolved world size; ranks default to this process's launcher rank."""
    import os

    rank = int(os.environ.get("PADDLE_TRAINER_ID", rank) or rank)
    local_rank = int(os.environ.get("PADDLE_LOCAL_RANK", os.environ.get("PADDLE_RANK_IN_NODE", local_rank)) or 0)
    return _derive(resolved, training, rank, local_rank, supported_only)


def _derive(resolved, training, rank: int, local_rank: int, supported_only: bool = True) -> ParallelConfig:
    """PaddleNLP degree arithmetic: world = dp × sharding × tp × pp (REFERENCE §7.3)."""
    from pretrain_cli.errors import UserError

    world, tp, pp = resolved.world_size, resolved.tp_degree, resolved.pp_degree
    if world % (tp * pp):
        raise UserError(f"tensor_parallel_degree x pipeline_parallel_degree = {tp * pp} does not divide "
                        f"the world size {world}")
    rest = world // (tp * pp)
    sharding = 1
    if resolved.sharding_stage:
        sharding = rest if training.sharding_parallel_degree in (-1, 0) else training.sharding_parallel_degree
        if sharding < 1 or rest % sharding:
            raise UserError(f"sharding_parallel_degree: {sharding} does not divide the {rest} data-parallel "
                            f"processes (world {world} / tp {tp} / pp {pp}); use a divisor or -1")
    if supported_only and sharding > 1 and resolved.sharding_stage in (2, 3):
        # Paddle's group_sharded_parallel releases non-owned gradients, so the global norm, clipping
        # and a topology-free checkpoint each need a gather that is not written yet.
        raise UserError(f"sharding: stage{resolved.sharding_stage} is not supported yet (clipping and checkpoints "
                        f"need the sharded gradients and optimizer state gathered); use sharding: stage1, which "
                        f"shards the optimizer state and saves topology-free checkpoints")
    if supported_only and sharding > 1 and resolved.amp_dtype == "float16":
        raise UserError("fp16: loss scaling together with sharding is not supported yet; use bf16 (no loss scaler "
                        "needed) or plain data parallel (sharding: '')")
    # TP/PP ranks share data; with tp = pp = 1 every rank is its own data rank (dp-major, sharding-minor).
    data_rank = rank // (tp * pp)
    return ParallelConfig(world_size=world, rank=rank, local_rank=local_rank, data_rank=data_rank,
                          dp_degree=rest // sharding,
                          sharding_degree=sharding, sharding_stage=resolved.sharding_stage, tp_degree=tp,
                          pp_degree=pp)
