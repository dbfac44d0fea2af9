"""A MoE router under GPU mixed precision, through the emulation of tests/gpu_emulation.py: AMP's O2 cast
(`paddle.amp.decorate(level="O2")` runs `amp_initialize`, which on CPU it returns before) and autocast's white list
(a matmul's inputs cast to half at O1 and O2). Each test failed before the routers kept fp32 (`models.moe.fp32_router`):
O2 cast the gate weight and the balancing bias to bf16 (a bias step of 1e-3 vanished at |bias| >= 0.5), and the
router's explicit fp32 casts did not stop autocast from computing its logits in bf16, where close experts tie."""
import json

import numpy as np
import pytest

import gpu_emulation as emu
from gpu_emulation import paddle

from paddle.amp.auto_cast import amp_initialize  # noqa: E402

from pretrain_cli.config.presets import PRESET_DIR  # noqa: E402
from pretrain_cli.models import build_model  # noqa: E402
from pretrain_cli.models.config import ModelConfig  # noqa: E402
from pretrain_cli.models.moe_loss import sparse_blocks, update_expert_bias  # noqa: E402
from pretrain_cli.ops import kernels  # noqa: E402
from pretrain_cli.run_config import MoeConfig  # noqa: E402

PRESETS = ["micro-qwen3-moe", "micro-deepseek-v3"]


def _model(preset, **kw):
    d = json.loads((PRESET_DIR / preset / "config.json").read_text())
    paddle.seed(0)
    return build_model(ModelConfig.from_dict({**d, **kw}), kernels.select(None, "cpu"), MoeConfig(bias_update_rate=1e-3))


@pytest.mark.parametrize("preset", PRESETS)
def test_o2_casts_the_model_to_bf16_but_the_routers_stay_fp32_and_their_bias_moves_by_its_rate(preset):
    model = _model(preset)
    amp_initialize(models=[model], dtype="bfloat16", excluded_layers=None)  # what decorate(level="O2") runs on a GPU
    block = sparse_blocks(model)[0]
    assert block.experts[0].gate_proj.weight.dtype == paddle.bfloat16  # the rest is cast
    assert block.gate.weight.dtype == paddle.float32
    bias = block.gate.e_score_correction_bias
    assert bias.dtype == paddle.float32
    bias.set_value(paddle.full(bias.shape, 0.75))
    block.step_load = paddle.to_tensor(np.arange(bias.shape[0], dtype="float32"))  # the first experts below the mean
    update_expert_bias(model, 1e-3)
    assert float(bias[0]) == pytest.approx(0.751, abs=1e-6)  # in bf16, 0.75 + 0.001 rounds back to 0.75


@pytest.mark.parametrize("level", ["O1", "O2"])
@pytest.mark.parametrize("preset", PRESETS)
def test_the_router_routes_in_fp32_under_autocast(monkeypatch, preset, level):
    """Two experts whose logits differ by less than bf16 resolves (8 bits): fp32 routing picks the larger."""
    model = _model(preset, num_experts_per_tok=1)
    gate = sparse_blocks(model)[0].gate
    hidden, experts = gate.weight.shape
    w = np.zeros((hidden, experts), np.float32)
    w[0, 0], w[0, 1] = 1.0, 1.001  # bf16 rounds both logits to 1.0: a tie that top-k gives to expert 0
    gate.weight.set_value(paddle.to_tensor(w))
    x = paddle.to_tensor(np.eye(1, hidden, dtype=np.float32))  # [1, hidden]: one token, its logits are w's row 0
    want = gate(x)
    assert int(want.indices[0, 0]) == 1
    monkeypatch.setattr(paddle.amp, "auto_cast", emu.fake_auto_cast)
    monkeypatch.setattr(paddle, "matmul", emu.ref_matmul)
    emu.MATMULS.clear()
    with emu.fake_auto_cast(True, level=level, dtype="bfloat16"):  # the step's autocast (training.precision.Amp)
        got = gate(x.astype("bfloat16"))  # the activations arrive half
    assert emu.MATMULS == [paddle.float32], emu.MATMULS
    assert int(got.indices[0, 0]) == 1
    for name in ("logits", "scores", "weights"):
        assert getattr(got, name).dtype == paddle.float32
        np.testing.assert_array_equal(getattr(got, name).numpy(), getattr(want, name).numpy())


def test_zero3_creates_the_routers_fp32_after_the_o2_cast():
    """ZeRO-3 creates each parameter's shard after AMP's cast (`training.run.lay_out` hands the source O2's dtype):
    the routers' blocks stay fp32, as `decorate` leaves them, the rest is created bf16."""
    from pretrain_cli.distributed.layout.materialize import InitSource, after_o2, read_block, whole_box

    d = json.loads((PRESET_DIR / "micro-qwen3-moe" / "config.json").read_text())
    cfg = ModelConfig.from_dict(d)
    with paddle.LazyGuard():
        model = build_model(cfg, kernels.select(None, "cpu"), MoeConfig(bias_update_rate=1e-3))
    source = InitSource(cfg, seed=0)
    after_o2(source, model, "bfloat16")
    params = dict(model.named_parameters())
    router = "model.layers.0.mlp.gate.weight"
    expert = "model.layers.0.mlp.experts.0.gate_proj.weight"
    assert read_block(router, params[router], source, whole_box(params[router])).dtype == paddle.float32
    assert read_block(expert, params[expert], source, whole_box(params[expert])).dtype == paddle.bfloat16
