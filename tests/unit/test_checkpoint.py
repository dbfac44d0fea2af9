"""Optimizer state round trips through optimizer.safetensors, fp32 and O2 (fp32 master weights); the sharded
format's pieces, index, block reads and damage checks (docs/CHECKPOINTS.md)."""
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from safetensors.numpy import save_file

from pretrain_cli import runtime
from pretrain_cli.distributed.strategy import Strategy
from pretrain_cli.errors import UserError
from pretrain_cli.training import checkpoint

ONE = SimpleNamespace(rank=0, world_size=1, is_rank0=True, sharding_degree=1)

PRESET = Path(__file__).resolve().parents[2] / "src/pretrain_cli/config/presets/micro-llama"


def _build(dtype: str):
    paddle = runtime.import_paddle()
    from pretrain_cli.models import build_model
    from pretrain_cli.models.config import ModelConfig

    paddle.seed(0)
    model = build_model(ModelConfig.from_file(str(PRESET)))
    if dtype != "float32":
        model.to(dtype=dtype)
    opt = paddle.optimizer.AdamW(learning_rate=1e-3, parameters=model.parameters(), multi_precision=dtype != "float32")
    opt._create_accumulators(paddle.static.default_main_program().global_block(), list(model.parameters()))
    return model, opt


def _fill(opt, seed: int) -> None:
    rng = np.random.default_rng(seed)
    for table in opt._accumulators.values():
        for t in table.values():
            t.set_value(rng.standard_normal(t.shape).astype(np.float32))
    for t in (getattr(opt, "_master_weights", None) or {}).values():
        t.set_value(rng.standard_normal(t.shape).astype(np.float32))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_optimizer_state_round_trip(tmp_path, dtype):
    model, opt = _build(dtype)
    _fill(opt, 1)
    saved = checkpoint.optimizer_tensors(model, opt)
    n_params = len(list(model.parameters()))
    per_param = 5 if dtype == "bfloat16" else 4  # moments, beta pows (+ the fp32 master copy under O2)
    assert len(saved) == n_params * per_param
    assert saved["model.layers.0.self_attn.q_proj.weight/moment1"].shape == (64, 64)
    assert saved["lm_head.weight/moment2"].shape == (512, 64)  # HF [out, in] layout
    save_file(saved, str(tmp_path / "opt.safetensors"))
    model2, opt2 = _build(dtype)
    _fill(opt2, 2)
    (tmp_path / "opt.safetensors").rename(tmp_path / "optimizer.safetensors")  # a checkpoint from before the index
    checkpoint.load_optimizer(Strategy(ONE), model2, opt2, tmp_path)
    again = checkpoint.optimizer_tensors(model2, opt2)
    assert again.keys() == saved.keys()
    assert all(np.array_equal(again[k], saved[k]) for k in saved)


def test_optimizer_state_mismatch_is_a_user_error(tmp_path):
    model, opt = _build("float32")
    saved = checkpoint.optimizer_tensors(model, opt)
    saved["model.norm.weight/moment1"] = np.zeros(3, np.float32)
    save_file(saved, str(tmp_path / "optimizer.safetensors"))
    with pytest.raises(UserError, match="model.norm.weight/moment1 has shape"):
        checkpoint.load_optimizer(Strategy(ONE), model, opt, tmp_path)
    del saved["model.norm.weight/moment1"]
    save_file(saved, str(tmp_path / "optimizer.safetensors"))
    with pytest.raises(UserError, match="no moment1 for model.norm.weight"):
        checkpoint.load_optimizer(Strategy(ONE), model, opt, tmp_path)
