"""A parameter's initial values as a pure function of (run seed, HF name, block): what lets every rank create
only the block it holds and still hold exactly its slice of what one process initialises.

The distributions are PaddleNLP's `_init_weights` (the ParamAttrs of `layers.py`, which a model built eagerly
uses): Linear and embedding weights N(0, initializer_range), the residual projections (`o_proj`,
`down_proj`) scaled by 1/sqrt(2·layers), RMSNorm weights 1, biases 0. The draws do not come from Paddle's
global generator in construction order (that would make a rank's values depend on every tensor built before
it): a tensor's rows, in Paddle's layout, are cut into chunks of `CHUNK` elements (at least one row), and
each chunk is drawn from its own Philox stream keyed by (seed, name, chunk index). A block of any shape — a
ZeRO-3 shard, a TP column or row slice, a whole tensor — is assembled from the chunks its rows cross, so
creating it needs at most one chunk (16 MiB, or one row when a row is larger) per drawing thread besides the
block itself.
No ranks, no I/O: the caller (`distributed.layout.materialize`) decides which block a rank creates.
"""
from __future__ import annotations

import hashlib
import math

import numpy as np

from pretrain_cli.models.config import ModelConfig

CHUNK = 1 << 22  # elements drawn per Philox stream (16 MiB of fp32): the transient of creating any block
RESIDUAL = ("o_proj.weight", "down_proj.weight")


def rule(cfg: ModelConfig, name: str) -> tuple[str, float]:
    """("normal", std) or ("constant", value) for the parameter with HF name `name`."""
    if name.endswith("norm.weight"):  # input/post_attention_layernorm, model.norm, Qwen3's q_norm/k_norm
        return "constant", 1.0
    if name.endswith((".bias", ".e_score_correction_bias")):  # the latter: a MoE router's balancing bias
        return "constant", 0.0
    std = cfg.initializer_range
    if name.endswith(RESIDUAL):
        std /= math.sqrt(2 * cfg.num_hidden_layers)
    return "normal", std


def rows_per_chunk(shape) -> int:
    row = int(np.prod(shape[1:], dtype=np.int64)) if len(shape) > 1 else 1
    return max(1, CHUNK // max(row, 1))


def _stream(seed: int, name: str, chunk: int) -> np.random.Generator:
    key = hashlib.blake2b(f"{seed}\0{name}\0{chunk}".encode(), digest_size=16).digest()
    return np.random.Generator(np.random.Philox(key=int.from_bytes(key, "little")))


def block(cfg: ModelConfig, seed: int, name: str, global_shape, offsets=None, shape=None,
          workers: int = 1) -> np.ndarray:
    """fp32 values of the block (`offsets`, `shape`; default: the whole tensor) of parameter `name` of global
    shape `global_shape` (Paddle layout), identical to the same block cut from the whole tensor. `workers` > 1
    draws that many chunks at once (numpy draws without the GIL; each chunk has its own stream, so the values
    are the same), holding one chunk per worker."""
    global_shape = tuple(int(d) for d in global_shape)
    offsets = tuple(offsets) if offsets is not None else (0,) * len(global_shape)
    shape = tuple(shape) if shape is not None else global_shape
    kind, value = rule(cfg, name)
    if kind == "constant" or 0 in shape:
        return np.full(shape, value, dtype=np.float32)
    out = np.empty(shape, dtype=np.float32)
    rows = rows_per_chunk(global_shape)
    start, stop = offsets[0], offsets[0] + shape[0]
    inner = tuple(slice(o, o + s) for o, s in zip(offsets[1:], shape[1:]))

    def draw(c: int) -> None:
        lo, hi = c * rows, min((c + 1) * rows, global_shape[0])
        drawn = _stream(seed, name, c).standard_normal((hi - lo,) + global_shape[1:], dtype=np.float32)
        a, b = max(lo, start), min(hi, stop)
        out[a - start:b - start] = drawn[(slice(a - lo, b - lo),) + inner] * np.float32(value)

    chunks = range(start // rows, (stop - 1) // rows + 1)
    if workers > 1 and len(chunks) > 1:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(min(workers, len(chunks))) as pool:
            list(pool.map(draw, chunks))
    else:
        for c in chunks:
            draw(c)
    return out
