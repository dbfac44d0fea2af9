"""What `paddle.distributed.launch` told this process: world size and ranks, read from its environment.

The one place that reads the launcher's variables (no Paddle import: `train` needs the world size
to resolve the run before Paddle starts).
"""
from __future__ import annotations

import os


def _int(*names: str, default: int) -> int:
    for name in names:
        value = os.environ.get(name)
        if value not in (None, ""):
            return int(value)
    return default


def world_size() -> int:
    return _int("PADDLE_TRAINERS_NUM", "PADDLE_GLOBAL_SIZE", default=1)


def rank() -> int:
    return _int("PADDLE_TRAINER_ID", "PADDLE_GLOBAL_RANK", default=0)


def local_rank() -> int:
    return _int("PADDLE_LOCAL_RANK", "PADDLE_RANK_IN_NODE", default=0)


def local_size() -> int:
    """Processes on this node (they share its cores)."""
    return _int("PADDLE_LOCAL_SIZE", default=1)


def master() -> str:
    return os.environ.get("PADDLE_MASTER", "?")
