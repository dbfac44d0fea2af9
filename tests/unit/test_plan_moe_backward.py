"""What a sparse layer's experts hold in their backward beyond what the layer keeps (`planning.experts.backward_bytes`):
the down projection's dh beside its stacked weights or its dW, then SwiGLU's d(gate|up) beside dh, and under the
semi-auto engine (`distributed.steps.moe_layouts.LocalDispatch`) the down projection's whole dW too. Measured: the
ZeRO-2 test of tests/unit/test_plan_zero3_experts.py."""
import dataclasses

import pytest

from pretrain_cli.config.presets import PRESET_DIR
from pretrain_cli.models.config import ModelConfig
from pretrain_cli.planning.activations import activation_parts
from pretrain_cli.planning.experts import backward_bytes, padded_rows
from pretrain_cli.planning.memory import Setup, estimate

WIDE = {"hidden_size": 128, "intermediate_size": 512, "moe_intermediate_size": 1024, "num_hidden_layers": 4,
        "vocab_size": 2048, "head_dim": 32}
CFG = dataclasses.replace(ModelConfig.from_file(str(PRESET_DIR / "micro-qwen3-moe")), **WIDE)
PIECE = 8 * 1024 * 128 * 4  # one projection of the 8 experts, fp32: 4 MiB


def _setup(**kw):
    return Setup(model=CFG, micro_batch=2, seq_len=128, device="cpu", attention="math", **kw)


def test_zero2_on_the_semi_auto_engine_holds_d_gate_up_and_the_down_dw():
    """By hand at the calibration's shape (2 x 128 tokens, top 2 of 8 experts, width 1,024): 2·dh + the down dW,
    ~9.0 MiB, the largest working set (no recompute: nothing else), in the ZeRO-2 plan's activations."""
    s = _setup(distributed_tensors=True, sharding_stage=2, sharding_degree=2)
    rows = 256 * 2 * padded_rows(s)
    assert padded_rows(s) == pytest.approx(1.255, abs=1e-3)
    dh = rows * 4 * 1024
    assert backward_bytes(s) == pytest.approx(2 * dh + PIECE)
    assert backward_bytes(s) / 2**20 == pytest.approx(9.02, abs=0.01)
    kept, working = activation_parts(s)
    assert working == backward_bytes(s)
    assert estimate(s)["activations"] == pytest.approx(kept + working)


def test_leaf_parameters_hold_the_stack_or_d_gate_up_not_the_down_dw():
    """One process or fleet's layouts: the parameters' gradients are accumulated before SwiGLU's backward, so the
    larger of dh + the stacked down weights and 2·dh; a GPU's grouped GEMM runs no padding."""
    s = _setup()
    dh = 256 * 2 * padded_rows(s) * 4 * 1024
    assert backward_bytes(s) == pytest.approx(max(dh + PIECE, 2 * dh))
    gpu = dataclasses.replace(s, device="gpu", compute_bytes=2, amp_level="O2")
    assert backward_bytes(gpu) == pytest.approx(256 * 2 * 2 * 1024 + PIECE / 2)  # dh (bf16, p 1) + the bf16 stack


def test_zero3_takes_its_gathered_experts_off():
    """Under ZeRO-3 the GEMM hands its gradients' shards back at once and the gathered experts (one layer's whole,
    in `gathered_weights`) are a transient of the same backward: nothing more at this shape, the plan unchanged."""
    s = _setup(distributed_tensors=True, sharding_stage=3, sharding_degree=2)
    assert backward_bytes(s) == 0.0
    assert estimate(s)["gathered_weights"] == 3 * PIECE


def test_a_dense_model_holds_nothing_more():
    dense = ModelConfig.from_file(str(PRESET_DIR / "micro-llama"))
    s = Setup(model=dense, micro_batch=2, seq_len=128, device="cpu", attention="math")
    assert backward_bytes(s) == 0.0 and activation_parts(s)[1] == 0.0
