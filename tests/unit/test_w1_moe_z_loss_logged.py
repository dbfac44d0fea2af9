"""The router z-loss is logged whenever the router losses are, its weight 0 included: docs/MODELS.md says every log
line gets `z_loss` and to set `router_z_loss_coef` when it grows, but a run at the default weight 0 (every shipped
file) never logged it, so the growth it names could not be watched. Logged unweighted and without gradient at weight
0: the loss optimised, and so the run, stay what they were."""
import numpy as np
import pytest

from pretrain_cli import runtime

paddle = runtime.import_paddle()

from moe_helpers import moe_cfg  # noqa: E402
from pretrain_cli.models import build_model  # noqa: E402
from pretrain_cli.models.moe_loss import load_balancing_loss, log_values, sparse_blocks, z_loss  # noqa: E402
from pretrain_cli.ops import kernels  # noqa: E402
from pretrain_cli.run_config import MoeConfig  # noqa: E402


@pytest.mark.parametrize("preset", ["micro-qwen3-moe", "micro-deepseek-v2"])
def test_z_loss_is_logged_at_weight_0_and_adds_nothing(preset):
    paddle.seed(0)
    # the balance weight as a run resolves it (DeepSeek's: the paper's α); the z weight 0, every file's default
    model = build_model(moe_cfg(preset), kernels.select(None, "cpu"), MoeConfig(aux_loss_coef=0.001))
    ids = paddle.to_tensor(np.random.default_rng(0).integers(0, 512, (2, 12)).astype("int64"))
    model.eval()
    ce_sum, count = model(ids, labels=ids)
    model.train()
    total, _ = model(ids, labels=ids)
    logits = [b.record.routing.logits for b in sparse_blocks(model)]
    values = log_values(model)
    assert values["z_loss"] == pytest.approx(float(z_loss(logits)), rel=1e-5)
    # the loss optimised: the LM loss + 0.001 x the balance loss (transformers', or DeepSeek's sequence-wise one
    # summed over the sparse layers), no z term
    if preset == "micro-qwen3-moe":
        balance = float(load_balancing_loss(logits, 8, 2))
    else:
        balance = sum(float(b.balance_loss()) for b in sparse_blocks(model))
    assert balance > 0
    want = float(ce_sum / count) + 0.001 * balance
    assert float(total / count) == pytest.approx(want, rel=1e-6)
    gate = sparse_blocks(model)[0].gate.weight
    (total / count).backward()
    with_z = gate.grad.numpy().copy()
    model.clear_gradients()
    # the same run with a z weight (the balance weight as above: without it DeepSeek's balance loss is off, and the
    # gradients would differ by that term, not the z-loss's)
    again = build_model(moe_cfg(preset), kernels.select(None, "cpu"), MoeConfig(aux_loss_coef=0.001, z_loss_coef=0.5))
    again.set_state_dict(model.state_dict())
    again.train()
    loss, n = again(ids, labels=ids)
    (loss / n).backward()
    assert not np.allclose(sparse_blocks(again)[0].gate.weight.grad.numpy(), with_z)  # a weight moves the router
    model.clear_gradients()
    same = build_model(moe_cfg(preset), kernels.select(None, "cpu"), MoeConfig(aux_loss_coef=0.001))
    same.set_state_dict(model.state_dict())  # like with like: the z weight 0 again gives the router's gradient above
    same.train()
    loss, n = same(ids, labels=ids)
    (loss / n).backward()
    np.testing.assert_allclose(sparse_blocks(same)[0].gate.weight.grad.numpy(), with_z, rtol=1e-6, atol=1e-9)
