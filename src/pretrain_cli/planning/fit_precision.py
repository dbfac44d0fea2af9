"""`plan --fit`'s precision lever: a file that trains in bf16 (or fp16) at `fp16_opt_level` O1 is fitted at O1 and at
O2 (`orchestration.planned.fit` runs both searches), and the better one is the answer, O2 named among the changes.

O1 (autocast) keeps fp32 weights and fp32 gradients, and each matmul's half cast of its weight until the backward
(`memory._half_copies`); O2 keeps half weights and half gradients beside fp32 master weights and AdamW moments
(docs/TRAINING.md, Precision; `paddle.amp.decorate(level="O2", master_weight=True)`; the routers stay fp32), the
precision PaddleNLP's own Llama and DeepSeek-V3 pretraining files set. What O2 changes in the numerics: the
gradients of a step are accumulated over its micro-batches in the half dtype (`amp_master_grad: true` keeps them
fp32, 2 bytes a parameter more); the update is fp32. DeepSeek-V3 at 4,096 tokens on H100: O1 fits from 208 devices,
O2 from 192; Qwen3-30B-A3B on 8: O2 fits without a pipeline (71,925 tokens/s predicted, O1's best 66,788).

A file that names its level (the key in the file or on the command line) keeps it: the O2 result is one note.
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


def pick_precision(o1: dict, o2: dict, dtype: str, kept: bool) -> dict:
    """The fit to answer with of the file's O1 search `o1` and the O2 one `o2` (its change and diff carry
    fp16_opt_level O2), with a note saying what O2 is and gave; `kept`: the file names its level, so `o1` with the
    note. O1 where O2 is no better (fewer changes)."""
    if _rank(o2) >= _rank(o1):
        return o1
    half = {"bfloat16": "bf16", "float16": "fp16"}.get(dtype, dtype)
    what = (f"fp16_opt_level O2 ({half} weights and gradients, the gradients accumulated over a step's micro-batches "
            f"in {half}; fp32 master weights and AdamW state, the update fp32, the routers fp32: docs/TRAINING.md)")
    if kept:
        note = (f"precision: {what} {_what(o2)}, where the file's O1 {_what(o1)}; the file sets fp16_opt_level, so "
                f"the search keeps it")
        return {**o1, "notes": [*o1["notes"], note]}
    note = (f"precision: {what} {_what(o2)}, where O1 (the file's, by default) {_what(o1)}: O1 holds fp32 weights "
            f"and gradients and the half cast autocast keeps of each weight a matmul reads; `--fp16_opt_level O1` "
            f"keeps O1, `amp_master_grad: true` fp32 gradients at O2 (2 bytes a parameter more)")
    return {**o2, "notes": [*o2["notes"], note]}
