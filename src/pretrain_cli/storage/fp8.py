"""FP8 block-quantized weights as DeepSeek publishes them (DeepSeek-V3/R1, Kimi K2): dequantized on read.

A quantized Linear weight `X.weight` is stored as float8 e4m3fn (safetensors dtype `F8_E4M3`) `[out, in]` next to
`X.weight_scale_inv`, fp32 `[ceil(out/b0), ceil(in/b1)]`: one scale per `b0 × b1` block (`weight_block_size` in
config.json's `quantization_config`, 128 × 128 in every published checkpoint), and the real weight is
`fp8 value × scale_inv` of its block (DeepSeek's `weight_dequant`; transformers' `FP8Linear`). Everything else
(norms, embeddings, the router, the head) is stored unquantized.

The e4m3fn bits are decoded with a 256-entry table (1 sign, 4 exponent bits with bias 7, 3 mantissa bits; no
infinities, 0x7F/0xFF are NaN), so no float8-capable numpy, torch or ml_dtypes is needed, and a block read
(`shard_files.File.read` of the raw bytes) dequantizes only its own rows and columns.
"""
from __future__ import annotations

import numpy as np

SCALE_SUFFIX = "_scale_inv"
DEFAULT_BLOCK = (128, 128)
CODE = "F8_E4M3"


def _e4m3fn_table() -> np.ndarray:
    bits = np.arange(256, dtype=np.int64)
    sign = np.where(bits >> 7, -1.0, 1.0)
    exp, man = (bits >> 3) & 0xF, bits & 0x7
    value = np.where(exp == 0, man / 8.0 * 2.0 ** -6, (1.0 + man / 8.0) * 2.0 ** (exp - 7))
    value = np.where((exp == 0xF) & (man == 0x7), np.nan, value)
    return (sign * value).astype(np.float32)


E4M3FN = _e4m3fn_table()


def decode(raw: np.ndarray) -> np.ndarray:
    """float8 e4m3fn bits (uint8, any shape) → float32 values."""
    return E4M3FN[np.asarray(raw, dtype=np.uint8)]


def block_size(quantization_config: dict | None) -> tuple[int, int]:
    """`weight_block_size` of config.json's `quantization_config` (DeepSeek's 128 × 128 when absent)."""
    size = (quantization_config or {}).get("weight_block_size") or DEFAULT_BLOCK
    return int(size[0]), int(size[1])


def dequantize(values: np.ndarray, scale_inv: np.ndarray, block=DEFAULT_BLOCK, offsets=(0, 0)) -> np.ndarray:
    """`values` (float32 `[rows, cols]`, the block of the weight starting at `offsets`, HF `[out, in]` layout) ×
    the scale of the 128 × 128 block each element falls in (`scale_inv`: the weight's whole scale tensor)."""
    rows, cols = values.shape
    r = (np.arange(rows) + offsets[0]) // block[0]  # [rows]: the scale row of each weight row
    c = (np.arange(cols) + offsets[1]) // block[1]  # [cols]
    return (values * scale_inv[np.ix_(r, c)]).astype(np.float32)


def quantize(weight: np.ndarray, block=DEFAULT_BLOCK) -> tuple[np.ndarray, np.ndarray]:
    """(e4m3fn bits uint8 `[out, in]`, scale_inv fp32 `[ceil(out/b0), ceil(in/b1)]`): each block scaled so its
    largest magnitude is 448 (e4m3fn's largest finite value) and rounded to the nearest code, as DeepSeek's
    `weight_quant` does; for tests that make an FP8 checkpoint from a bf16/fp32 one."""
    out_dim, in_dim = weight.shape
    grid = (-(-out_dim // block[0]), -(-in_dim // block[1]))
    scale = np.ones(grid, dtype=np.float32)
    bits = np.zeros(weight.shape, dtype=np.uint8)
    finite = np.arange(256)[~np.isnan(E4M3FN)]
    codes = finite[np.argsort(E4M3FN[finite], kind="stable")]
    table = E4M3FN[codes]  # ascending values of the finite codes
    for i in range(grid[0]):
        for j in range(grid[1]):
            sl = (slice(i * block[0], (i + 1) * block[0]), slice(j * block[1], (j + 1) * block[1]))
            amax = float(np.abs(weight[sl]).max())
            scale[i, j] = amax / 448.0 if amax > 0 else 1.0
            x = weight[sl] / scale[i, j]
            pos = np.clip(np.searchsorted(table, x), 1, len(table) - 1)
            nearer_low = (x - table[pos - 1]) <= (table[pos] - x)
            bits[sl] = codes[np.where(nearer_low, pos - 1, pos)]
    return bits, scale
