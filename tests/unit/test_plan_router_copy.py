"""A MoE router's fp32 copy of its input in half precision (`planning.experts.mlp_per_token`): the routers of
`models.moe` (Qwen2/3-MoE) and `models.deepseek_moe` (DeepSeek-V2/V3) route in fp32 (`x.astype("float32")` into
the gate's matmul, autocast off), and the matmul keeps that copy for the gate weight's gradient: 4 bytes a hidden
element a token, whole under tp, in every sparse layer. In fp32 the cast is the input itself. Not counted before.
Measured as the calibration measures (Paddle's host allocator on CPU, a process forked per measurement)."""
import dataclasses
import json

import forkserver
import pytest

from pretrain_cli.config.presets import PRESET_DIR
from pretrain_cli.models.config import ModelConfig
from pretrain_cli.models.flops import experts
from pretrain_cli.planning.experts import ROUTING_BYTES, mlp_per_token
from pretrain_cli.planning.memory import Setup

_CHILD = r"""
import json
from pretrain_cli import runtime
paddle = runtime.import_paddle()
from pretrain_cli.config.presets import PRESET_DIR
from pretrain_cli.models.config import ModelConfig
from pretrain_cli.models.deepseek_moe import GroupLimitedRouter
from pretrain_cli.models.moe import SoftmaxTopKRouter
from pretrain_cli.run_config import MoeConfig
cur = lambda: paddle.base.core.host_memory_stat_current_value("Allocated", 0)
out = {}
for preset, cls in (("micro-qwen3-moe", SoftmaxTopKRouter), ("micro-deepseek-v3", GroupLimitedRouter)):
    cfg = ModelConfig.from_file(str(PRESET_DIR / preset))
    router = cls(cfg, MoeConfig())
    for dtype in ("float32", "bfloat16"):
        x = paddle.randn([2048, cfg.hidden_size]).astype(dtype)
        x.stop_gradient = False
        router(x)  # (anything built once)
        before = cur()
        routing = router(x)
        outputs = sum(t.numel().item() * t.element_size() for t in routing)
        out[f"{preset} {dtype}"] = (cur() - before - outputs) / 2048 / cfg.hidden_size  # bytes a token and element
        del routing
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def kept() -> dict:
    r = forkserver.run(["-c", _CHILD], timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("preset", ["micro-qwen3-moe", "micro-deepseek-v3"])
def test_the_routers_fp32_copy_of_a_half_input_is_kept_and_planned(kept, preset):
    """With a bf16 input each router keeps 4.0 bytes a token and hidden element more than with an fp32 one (its fp32
    copy; beyond it both keep the same few fp32 `[tokens, experts]` tensors); the plan's sparse layer in half precision
    counts 4·h more than its other terms, under tp too (the router is whole on every tp rank), and nothing in fp32."""
    extra = kept[f"{preset} bfloat16"] - kept[f"{preset} float32"]
    assert extra == pytest.approx(4.0, abs=0.05), kept
    cfg = ModelConfig.from_file(str(PRESET_DIR / preset))
    e, h = experts(cfg), cfg.hidden_size
    for tp in (1, 2):
        for c in (2, 4):
            s = Setup(model=cfg, micro_batch=1, seq_len=128, compute_bytes=c, tp=tp)
            others = (8 * e.routed + e.top_k * (c * (2 * h + 3 * e.width / tp) + ROUTING_BYTES)  # (a GPU: unpadded)
                      + (3 * c * e.shared_width / tp + c * h + 4 if e.shared_width else 0)
                      + 3 * c * e.ungated_width / tp)
            assert mlp_per_token(s, True) - others == pytest.approx(4 * h if c == 2 else 0)
    dense = dataclasses.replace(Setup(model=cfg, micro_batch=1, seq_len=128, compute_bytes=2), tp=1)
    assert mlp_per_token(dense, False) == 3 * 2 * cfg.intermediate_size  # a dense layer has no router
