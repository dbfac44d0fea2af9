"""`plan --fit`'s precision lever: a file that trains in bf16 (or fp16) at `fp16_opt_level` O1 is fitted at O1 and at
O2 (`orchestration.planned.fit` runs both searches), and the better one is the answer, O2 named among the changes.

O1 (autocast) keeps fp32 weights and fp32 gradients, and each matmul's half cast of its weight until the backward
(`memory._half_copies`); O2 keeps half weights and half gradients beside fp32 master weights and AdamW moments
(docs/TRAINING.md, Precision; `paddle.amp.decorate(level="O2", master_weight=True)`; the routers stay fp32), the
precision PaddleNLP's own Llama and DeepSeek-V3 pretraining files set. What O2 changes in the numerics: the
gradients of a step are accumulated over its micro-batches in the half dtype (`amp_master_grad: true` keeps them
fp32, 2 bytes a parameter more); the update is fp32. DeepSeek-V3 at 4,096 tokens on H100: O1 fits from 224 devices,
O2 from 192; Qwen3-30B-A3B on 8: O2 fits without a pipeline (71,925 tokens/s predicted, O1's best 66,788).

A file that names its level (the key in the file or on the command line) keeps it, and O2 is not searched (a
second search, for a figure the file declined).
"""
from __future__ import annotations

import math


def _rank(f: dict) -> tuple:
    """A fit's order: one that fits before one that does not, the faster first; where nothing fits, the one that
    fits on fewer devices (none found: last)."""
    if f["after"] is not None:
        return 0, -f["after"]["speed"]["tokens_per_sec"]
    more = f.get("more_devices")
    return 1, more["gpus"] if more else math.inf


def _what(f: dict) -> str:
    if f["after"] is not None:
        return f"runs at {f['after']['speed']['tokens_per_sec']:,.0f} tokens/s"
    more = f.get("more_devices")
    return f"needs --gpus {more['gpus']}" if more else "fits no device count searched"


def pick_precision(o1: dict, o2: dict, dtype: str, master_grad: bool) -> dict:
    """The fit to answer with of the file's O1 search `o1` and the O2 one `o2` (its change and diff carry
    fp16_opt_level O2), with a note saying what O2 is and gave; `master_grad`: the file's resolved
    amp_master_grad, which O2's figure ran with (fp32 gradients) or without (half ones). O1 where O2 is no better
    (fewer changes). The note is short: docs/PLAN.md's --fit section says the rest."""
    if _rank(o2) >= _rank(o1):
        return o1
    half = {"bfloat16": "bf16", "float16": "fp16"}.get(dtype, dtype)
    grads = "fp32 gradients (amp_master_grad)" if master_grad else f"{half} gradients"
    also = "" if master_grad else ", `amp_master_grad: true` fp32 gradients"
    note = (f"precision: fp16_opt_level O2 ({half} weights, {grads}, fp32 master weights and AdamW state) "
            f"{_what(o2)}, O1 (the file's, by default) {_what(o1)}; `--fp16_opt_level O1` keeps O1{also}")
    return {**o2, "notes": [*o2["notes"], note]}
